"""Rejection sampling is lossless end to end: the joint distribution of the first three generated tokens.

A tiny target with an 8-token vocabulary and a prompt fixed, the exact distribution of the first three tokens
is enumerable: ``P(x1, x2, x3) = p(x1) p(x2 | x1) p(x3 | x1, x2)``, each factor read off the target model
(8^3 = 512 cells). Method ``rejection`` with ``max_new_tokens=3`` drafts two tokens in its first round and
verifies them together with the bonus, and a round with a one-token draft follows a rejection at the first
position, so every drafter's ``q`` at two positions, the per-position uniform draws, the corrections and the
bonus all shape what comes out. Each test draws N generations through the engine's own drafter, rule and
decode loop and compares their counts with ``N * P`` by Pearson's chi-square (cells expected fewer than 5
times pooled into one): lossless sampling passes when the p-value is above ``ALPHA``.

``ALPHA = 1e-4``: the seeds are fixed, so each test is deterministic; a correct implementation would fail it
with probability 1e-4 over the choice of seed. The negative controls inject the two faults a one-token check
cannot see, one uniform draw shared by the positions of a draft and a draft ``q`` that is not the distribution
its tokens were drawn from, and require p-values below ``POWER_P = 1e-8``: the same sample size detects them
with a wide margin.

Speed: a draw is a few small forwards. The models are deterministic, so each ``CachedLM``'s logits are memoised
by the sequence asked for (the first request of each sequence runs the real cached forward, rollbacks
included); the drafters, rules, generator and decode loop run unchanged for every draw. torch runs on one
thread here: the tensors are tiny and on a shared 2-core machine more threads only contend.
"""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy

from loosespec import DecodeConfig
from loosespec.decode.engine import Engine
from loosespec.decode.loop import decode
from loosespec.decode.stats import Stats
from loosespec.drafters.base import Draft, Drafter
from loosespec.models import LoadedModel, ModelSource
from loosespec.verify import SamplingParams, logits_to_probs

TARGET_CHARS = "abcdef"  # target vocabulary: <s> </s> a..f (8 tokens)
DRAFT_CHARS = "fhgdce"  # another vocabulary (order and letters): shares c d e f with the target
PROMPT = "cdecd"  # the n-gram lookup finds "cd" and proposes "e c"
N = 8000  # generations per test
ALPHA = 1e-4
POWER_P = 1e-8
NEW = 3  # tokens whose joint distribution is compared


def tiny_tokenizer(chars: str):
    """Byte-level BPE without merges over ``chars`` (every character a token), <s> and </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def tiny_model(vocab: int, seed: int, scale: float):
    """A random Llama; ``scale`` on the output layer sets how peaked its next-token distributions are."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def loaded(model, tok, name):
    return LoadedModel(ModelSource(name, "local", name, "local"), model, tok)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def target():
    return tiny_model(len(TARGET_CHARS) + 2, seed=0, scale=12.0)


@pytest.fixture(scope="module")
def same_vocab(target):
    """Target and a draft of the same tokenizer (a noisy copy)."""
    tok = tiny_tokenizer(TARGET_CHARS)
    return Engine(loaded(target, tok, "target"), loaded(perturbed_copy(target, 0.3, seed=1), tok, "draft"))


@pytest.fixture(scope="module")
def cross_vocab(target):
    """The same target and a draft of another vocabulary: token-level intersection (TLI) drafting."""
    return Engine(
        loaded(target, tiny_tokenizer(TARGET_CHARS), "target"),
        loaded(tiny_model(len(DRAFT_CHARS) + 2, seed=2, scale=12.0), tiny_tokenizer(DRAFT_CHARS), "draft"),
    )


def prompt_ids(engine) -> torch.Tensor:
    return torch.tensor(engine.tokenizer(PROMPT).input_ids)


def exact_joint(engine, sampling: SamplingParams) -> torch.Tensor:
    """[V, V, V] P(x1, x2, x3 | prompt) under ``sampling``, from one uncached forward over every (x1, x2)."""
    model, ids = engine.target.model, prompt_ids(engine)
    v = int(model.config.vocab_size)
    x1, x2 = torch.meshgrid(torch.arange(v), torch.arange(v), indexing="ij")
    batch = torch.cat([ids.expand(v * v, -1), x1.reshape(-1, 1), x2.reshape(-1, 1)], dim=1)  # [V^2, P + 2]
    with torch.no_grad():
        logits = model(batch).logits[:, -3:].float()  # rows predict x1, x2, x3
    p = logits_to_probs(logits.reshape(-1, v), sampling).reshape(v, v, 3, v)
    return p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]


def memoise(lm, monkeypatch):
    memo: dict = {}
    real = lm.logits

    def logits(seq, rows):
        key = (tuple(seq.tolist()), rows)
        if key not in memo:
            memo[key] = real(seq, rows)
        return memo[key]

    monkeypatch.setattr(lm, "logits", logits)


def sample_joint(engine, cfg: DecodeConfig, monkeypatch, wrap_drafter=None) -> torch.Tensor:
    """[V^3] counts of the first NEW tokens over N generations (the engine's drafter, rule and loop)."""
    drafter, rule, _ = engine.build(cfg)
    assert type(drafter).__name__ == ("IntersectionDrafter" if engine.bridge is not None else DRAFTERS[cfg.drafter])
    if wrap_drafter is not None:
        drafter = wrap_drafter(drafter)
    for lm in (engine.target_lm, engine.draft_lm):
        memoise(lm, monkeypatch)
    engine.target_lm.reset()
    engine.draft_lm.reset()
    ids, v = prompt_ids(engine), int(engine.target.model.config.vocab_size)
    counts = torch.zeros(v**NEW)
    stats = Stats()
    for _ in range(N):
        out = [
            t
            for chunk in decode(engine.target_lm, drafter, rule, ids, NEW, cfg.num_draft_tokens, (), stats)
            for t in chunk
        ]
        assert len(out) == NEW
        counts[(out[0] * v + out[1]) * v + out[2]] += 1
    # drafts of two tokens, and a one-token draft after a first-position rejection, both accepted and rejected
    assert stats.drafted_at[1] > 0 and 0 < stats.accepted_tokens < stats.drafted_tokens, stats.to_dict()
    return counts


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's chi-square p-value of ``counts`` against ``probs`` (cells expected < 5 times pooled), and the
    total variation distance between the empirical and the exact distribution."""
    probs = probs.reshape(-1).double()
    counts = counts.reshape(-1).double()
    n = counts.sum()
    expected = n * probs
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.double), stat / 2))
    tv = float(0.5 * (counts / n - probs).abs().sum())
    return p, tv


DRAFTERS = {"ngram": "NgramDrafter", "model": "ModelDrafter", "mla": "MlaDrafter"}


def config(drafter: str, temperature: float = 1.0, **kw) -> DecodeConfig:
    # K tokens every round (no cost-aware length: its forward-cost measurement is beside the point here)
    return DecodeConfig.create(
        "rejection",
        drafter,
        has_draft_model=True,
        temperature=temperature,
        max_new_tokens=NEW,
        adaptive_draft_length=False,
        seed=kw.pop("seed", 0),
        **kw,
    )


CASES = {  # name: (engine fixture, drafter, sampling knobs)
    "ngram": ("same_vocab", "ngram", {}),
    "model": ("same_vocab", "model", {}),
    "mla": ("same_vocab", "mla", {}),
    "model-T0.7-top-k-6": ("same_vocab", "model", {"temperature": 0.7, "top_k": 6}),
    "tli-model": ("cross_vocab", "model", {}),
    "tli-mla": ("cross_vocab", "mla", {}),
}


SLOW_CASES = {"tli-mla", "model-T0.7-top-k-6"}  # make test-full; make test keeps one case per drafter and TLI
SLOW_CONTROLS = {"shared-uniform-tli-model", "perturbed-q-mla", "perturbed-q-tli-model"}  # one control per fault


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in CASES])
def test_first_tokens_are_distributed_as_plain_sampling(case, request, monkeypatch):
    fixture, drafter, knobs = CASES[case]
    engine = request.getfixturevalue(fixture)
    cfg = config(drafter, **knobs)
    counts = sample_joint(engine, cfg, monkeypatch)
    p, tv = chi_square_p(counts, exact_joint(engine, SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)))
    assert p > ALPHA, f"{case}: chi-square p = {p:.3g}, total variation {tv:.4f}"
    if fixture == "cross_vocab":
        assert engine.bridge is not None


# --- negative controls: the test detects the faults a first-token, one-position check cannot ----------------------


def shared_uniform(monkeypatch):
    """Fault: one uniform draw for every position of a draft (each position must have its own)."""
    import loosespec.verify.rejection as rejection

    real = rejection.native_accept

    def native_accept(draft_tokens, draft_probs, target_probs, generator, uniform=None):
        u = torch.rand(1, generator=generator, device=target_probs.device).expand(draft_tokens.shape[0])
        return real(draft_tokens, draft_probs, target_probs, generator, uniform=u)

    monkeypatch.setattr(rejection, "native_accept", native_accept)


class PerturbedQ(Drafter):
    """Fault: the drafter reports ``q^0.7`` (renormalised) as the distribution its tokens were drawn from (as if
    it reported q at another temperature than it sampled at)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        d = self.inner.propose(seq, k)
        assert d.probs is not None  # a drafter that samples reports its q
        q = d.probs**0.7
        return Draft(d.tokens, q / q.sum(-1, keepdim=True), d.draft_units)


CONTROLS = {  # name: (fault, case)
    "shared-uniform-model": ("shared-uniform", "model"),
    "shared-uniform-tli-model": ("shared-uniform", "tli-model"),
    "perturbed-q-model": ("perturbed-q", "model"),
    "perturbed-q-mla": ("perturbed-q", "mla"),
    "perturbed-q-tli-model": ("perturbed-q", "tli-model"),
}


@pytest.mark.parametrize(
    "control", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CONTROLS else c for c in CONTROLS]
)
def test_the_distribution_test_detects_a_fault(control, request, monkeypatch):
    fault, case = CONTROLS[control]
    fixture, drafter, knobs = CASES[case]
    engine = request.getfixturevalue(fixture)
    cfg = config(drafter, **knobs)
    wrap = None
    if fault == "shared-uniform":
        shared_uniform(monkeypatch)
    else:
        wrap = PerturbedQ
    counts = sample_joint(engine, cfg, monkeypatch, wrap_drafter=wrap)
    p, tv = chi_square_p(counts, exact_joint(engine, SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)))
    assert p < POWER_P, f"{control}: the fault went unnoticed: chi-square p = {p:.3g}, total variation {tv:.4f}"
