"""SpecGuard: the scores on hand-built tensors, step splitting, candidate sampling, and the step loop."""

import json

import pytest
import torch

from loosespec import DecodeConfig
from loosespec.decode.steps import CandidateFirst, StepChooser, draft_candidate, draft_candidates
from loosespec.drafters.base import Drafter
from loosespec.errors import LoosespecError
from loosespec.verify.grounding import (
    accept_step,
    attention_rollout,
    both_agree,
    grounding_from_step_rows,
    grounding_score,
    medoid,
    step_confidence,
    step_length,
    step_score,
)

# one layer, two heads; head mean = [[1, 0, 0], [0.995, 0.005, 0], [0.3, 0.3, 0.4]]
HEADS = torch.tensor(
    [[[1.0, 0.0, 0.0], [0.99, 0.01, 0.0], [0.6, 0.0, 0.4]], [[1.0, 0.0, 0.0], [1.00, 0.00, 0.0], [0.0, 0.6, 0.4]]]
)


def test_rollout_one_layer_sparsifies_adds_identity_and_normalises():
    r = attention_rollout(HEADS.unsqueeze(0))
    # row 1: 0.005 < 0.01 is zeroed, + identity -> (0.995, 1, 0) / 1.995
    # row 2: nothing below 0.01, + identity -> (0.3, 0.3, 1.4) / 2
    expected = torch.tensor([[1.0, 0.0, 0.0], [0.995 / 1.995, 1 / 1.995, 0.0], [0.15, 0.15, 0.7]])
    assert torch.allclose(r, expected, atol=1e-6)
    assert torch.allclose(r.sum(-1), torch.ones(3))


def test_rollout_multiplies_layers_first_to_last():
    second = torch.tensor([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])  # + I, norm -> row 1 (.25, .75, 0)
    r = attention_rollout(torch.stack([HEADS, second.expand(2, 3, 3)]))
    a1_row0, a1_row1 = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.995 / 1.995, 1 / 1.995, 0.0])
    assert torch.allclose(r[1], 0.25 * a1_row0 + 0.75 * a1_row1, atol=1e-6)  # (0.6240625, 0.3759375, 0)
    assert torch.allclose(r[2], torch.tensor([0.15, 0.15, 0.7]), atol=1e-6)  # second layer's row 2 is the identity


def test_grounding_is_the_minimum_context_mass_over_step_tokens():
    r = attention_rollout(HEADS.unsqueeze(0))
    # step = positions 1, 2; mass on position 0: 0.4987 and 0.15 -> min 0.15
    assert grounding_score(r, 1) == pytest.approx(0.15)
    assert grounding_score(r, 2) == pytest.approx(0.3)  # step = position 2; context = 0, 1


def _random_causal(layers, heads, n, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, heads, n, n, generator=g) * 3
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


@pytest.mark.parametrize("start", [1, 5, 11])
def test_grounding_from_step_rows_equals_full_rollout(start):
    attn = _random_causal(3, 4, 12, seed=start)  # [3, 4, 12, 12]
    full = grounding_score(attention_rollout(attn), start)
    rows = [layer[:, start:, :] for layer in attn]  # what a cached forward over the step returns
    assert grounding_from_step_rows(rows, start) == pytest.approx(full, abs=1e-6)


def test_medoid_picks_the_most_consistent_candidate():
    e = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.8, 0.3]])
    # mean cosine to the others: 0.643, 0.691, 0.154, 0.752 -> the last one, close to all three
    assert medoid(e) == 3
    assert medoid(e[[2, 0, 1]]) == 2  # (0, 1), (1, 0), (0.9, 0.1): 0.055, 0.497, 0.552
    assert medoid(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])) == 0  # ties -> the first (greedy)
    assert medoid(torch.tensor([[0.0, 1.0]])) == 0
    assert medoid(torch.tensor([[0.0, 1.0], [1.0, 0.0]])) == 0


def test_scores_and_acceptance_on_synthetic_values():
    c = step_confidence(torch.tensor([-0.1, -0.5, -0.2]))
    assert c == pytest.approx(0.60653, abs=1e-5)
    # the seed's variant: exp of the mean log-prob, exp(-0.8 / 3)
    assert step_confidence(torch.tensor([-0.1, -0.5, -0.2]), "mean") == pytest.approx(0.76593, abs=1e-5)
    s = step_score(c, 0.8, beta=0.3)
    assert s == pytest.approx(0.3 * 0.60653 + 0.7 * 0.8, abs=1e-5)  # 0.742
    assert accept_step(s, 0.7) and not accept_step(s, 0.75)
    assert accept_step(0.0, 0.0)  # tau = 0 accepts everything
    assert accept_step(0.5, 0.5)  # at the threshold: accepted
    assert not accept_step(1.0, 1.01)  # tau above 1 rejects everything
    # the seed's rule: both signals must clear their own threshold, whatever their weighted sum
    assert (
        both_agree(0.5, 0.4, 0.5, 0.4) and not both_agree(0.49, 1.0, 0.5, 0.4) and not both_agree(1.0, 0.39, 0.5, 0.4)
    )
    assert step_score(0.2, 0.9, beta=1.0) == 0.2 and step_score(0.2, 0.9, beta=0.0) == 0.9


PIECES = {1: "Step", 2: " one", 3: ".\n", 4: "\n", 5: "Two", 6: "x.\n\ny", 7: "<eos>"}


def _decode(ids):
    return "".join(PIECES[i] for i in ids)


@pytest.mark.parametrize(
    "tokens, expected",
    [
        ([1, 2, 3, 4, 5], 4),  # the delimiter spans two tokens: the step ends with the second
        ([1, 2, 3], None),  # unfinished
        ([1, 2, 7, 5], 3),  # an end token ends the step, delimiter or not
        ([5, 6, 1], 2),  # the delimiter inside a token: the step ends with that token
        ([4, 4, 1], 2),
        ([], None),
    ],
)
def test_step_length(tokens, expected):
    assert step_length(tokens, _decode, "\n\n", stop_ids={7}) == expected


def test_candidate_sampling_is_seeded(tiny_engine):
    lm = tiny_engine.draft_lm
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 11], dtype=torch.long)

    def run(seed, temperature):
        g = torch.Generator().manual_seed(seed)
        return [draft_candidate(lm, seq, 12, temperature, g, lambda t: False).tokens for _ in range(3)]

    assert run(3, 0.7) == run(3, 0.7)
    assert run(3, 0.7) != run(4, 0.7)
    greedy = run(3, 0.0)
    assert greedy[0] == greedy[1] == greedy[2]
    c = draft_candidate(lm, seq, 12, 0.7, torch.Generator().manual_seed(0), lambda t: len(t) == 5)
    assert len(c.tokens) == 5 and c.logprobs.shape == (5,) and (c.logprobs <= 0).all()
    assert c.hidden.shape == (tiny_engine.draft.model.config.hidden_size,)


def test_candidate_embedding_is_over_its_own_tokens(tiny_engine):
    """The mean of the draft's last hidden state at the candidate's token positions: not the context's last
    position (the same for every candidate, pulling short candidates together), and including the last token."""
    lm = tiny_engine.draft_lm
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 11], dtype=torch.long)
    c = draft_candidate(lm, seq, 4, 0.0, None, lambda t: False)
    full = torch.cat([seq, torch.tensor(c.tokens)])
    with torch.no_grad():
        states = lm.model(full[None], output_hidden_states=True).hidden_states[-1][0].float()  # [L, D]
    own = states[-len(c.tokens) :].mean(0)
    producing = states[len(seq) - 1 : -1].mean(0)  # what the embedder used to average
    assert torch.allclose(c.hidden, own, atol=1e-4)
    assert not torch.allclose(c.hidden, producing, atol=1e-4)


class _Rest(Drafter):
    name = "rest"

    def __init__(self):
        self.heard = []

    def feedback(self, drafted, accepted, first_miss=None):
        self.heard.append((drafted, accepted))

    def propose(self, seq, k):
        from loosespec.drafters import Draft

        return Draft(torch.full((k,), 99, dtype=torch.long))


def test_candidate_first_drafts_the_candidate_until_the_target_diverges():
    d = CandidateFirst([1, 2, 3, 4, 5], start=2, rest=_Rest())
    assert d.propose(torch.tensor([7, 7]), 3).tokens.tolist() == [1, 2, 3]
    assert d.propose(torch.tensor([7, 7, 1, 2, 3]), 3).tokens.tolist() == [4, 5]  # the rest of it
    assert d.propose(torch.tensor([7, 7, 1, 8]), 3).tokens.tolist() == [99, 99, 99]  # diverged: the drafter
    assert d.propose(torch.tensor([7, 7, 1, 2, 3, 4, 5]), 2).tokens.tolist() == [99, 99]  # used up
    assert len(CandidateFirst([1], start=0, rest=None).propose(torch.tensor([2]), 3)) == 0


def test_candidate_first_passes_on_only_the_rounds_the_rest_drafted():
    """The rest is the cost-aware draft length: its acceptance estimate learns from its own proposals only, not
    from the rounds that verified the candidate."""
    rest = _Rest()
    d = CandidateFirst([1, 2, 3], start=1, rest=rest)
    d.propose(torch.tensor([7]), 3)
    d.feedback(3, 1)  # the candidate's round
    d.propose(torch.tensor([7, 1, 8]), 2)
    d.feedback(2, 0)  # the rest's round
    assert rest.heard == [(2, 0)]


def test_specguard_target_steps_use_the_cost_aware_draft_length(smol_engine):
    """The steps the target writes draft with the cost-aware length (not K every round), as exact-mla does."""
    kw = dict(max_new_tokens=40, has_draft_model=True, num_draft_tokens=15, sg_tau=1.01, sg_steps="always")
    r = smol_engine.generate(QUESTION, DecodeConfig.create("specguard", "mla", sg_delimiter=".", **kw))
    lengths = r.stats.to_dict()["draft_length_histogram"]
    assert r.stats.to_dict()["target_steps"] >= 1
    assert sum(n for k, n in lengths.items() if k != "15") > 1  # the candidate's rounds propose K, the rest choose
    fixed = smol_engine.generate(
        QUESTION, DecodeConfig.create("specguard", "mla", sg_delimiter=".", adaptive_draft_length=False, **kw)
    )
    fixed_lengths = fixed.stats.to_dict()["draft_length_histogram"]
    assert sum(n for k, n in fixed_lengths.items() if k != "15") <= 1  # K, but where the budget's end cuts it


def test_config_validation():
    for bad in (
        dict(sg_candidates=0),
        dict(sg_temperature=0.0),
        dict(sg_beta=1.5),
        dict(sg_tau=-0.1),
        dict(sg_delimiter=""),
        dict(sg_embedder="bert"),
        dict(sg_on_reject="skip"),
        dict(sg_verify="loose"),
        dict(sg_max_step_tokens=0),
        dict(sg_first="best"),
        dict(sg_decision="either"),
        dict(sg_decision="both", sg_grounding_tau=-0.1),
        dict(sg_grounding_tau=0.3),  # a G threshold the weighted rule would not read
    ):
        with pytest.raises(LoosespecError):
            DecodeConfig.create("specguard", "ngram", **bad)
    cfg = DecodeConfig.create("specguard", has_draft_model=True)
    assert cfg.lossy and cfg.drafter == "mla" and cfg.to_dict()["sg_tau"] == cfg.sg_tau


def test_the_rule_knobs_left_unset_take_the_calibrated_rule_of_the_selection_and_decision():
    from loosespec.presets import SG_RULES

    for (select, decision), rule in SG_RULES.items():
        cfg = DecodeConfig.create("specguard", "ngram", sg_select=select, sg_decision=decision)
        assert {k: getattr(cfg, k) for k in rule} == rule
        assert (cfg.sg_grounding_tau is None) == (decision == "weighted")
    # what is given stays as given; the rest comes from the rule
    cfg = DecodeConfig.create("specguard", "ngram", sg_decision="both", sg_tau=0.6)
    assert cfg.sg_tau == 0.6 and cfg.sg_grounding_tau == SG_RULES[("embedding", "both")]["sg_grounding_tau"]
    assert cfg.to_dict()["sg_decision"] == "both" and cfg.to_dict()["sg_grounding_tau"] == cfg.sg_grounding_tau


def test_the_first_candidate_is_greedy_or_sampled(tiny_engine):
    """sg_first sampled (the seed's): the first candidate is drawn at the temperature like the others."""
    lm = tiny_engine.draft_lm
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 11], dtype=torch.long)
    greedy = draft_candidate(lm, seq, 10, 0.0, None, lambda t: False).tokens
    for count in (1, 3):
        kept = [
            draft_candidates(lm, seq, count, 10, 1.5, torch.Generator().manual_seed(s), lambda t: False)[0].tokens
            for s in range(4)
        ]
        assert all(t == greedy for t in kept)
        firsts = [
            draft_candidates(lm, seq, count, 10, 1.5, torch.Generator().manual_seed(s), lambda t: False, False)[
                0
            ].tokens
            for s in range(4)
        ]
        assert any(t != greedy for t in firsts) and len({tuple(t) for t in firsts}) > 1


def test_specguard_needs_a_draft_model(smol_engine):
    from loosespec.decode.engine import Engine

    with pytest.raises(LoosespecError, match="draft model"):
        Engine(smol_engine.target).generate("Hi", DecodeConfig.create("specguard", "ngram", max_new_tokens=4))


# --- end to end on SmolLM2-135M (float32, the same weights as draft and target) ---------------

QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
# sg_steps always: these tests read what SpecGuard does with every step (adaptive may leave steps to the target)
SG = dict(max_new_tokens=24, sg_delimiter=".", sg_max_step_tokens=16, has_draft_model=True, sg_steps="always")


def test_confidence_variant_is_a_knob_the_step_loop_uses(smol_engine):
    cfgs = {v: DecodeConfig.create("specguard", "ngram", sg_tau=0.0, sg_confidence=v, **SG) for v in ("min", "mean")}
    recs = {v: smol_engine.generate(QUESTION, c).stats.steps for v, c in cfgs.items()}
    assert [r["grounding"] for r in recs["min"]] == [r["grounding"] for r in recs["mean"]]  # same steps (tau 0)
    assert all(m["confidence"] <= a["confidence"] + 1e-9 for m, a in zip(recs["min"], recs["mean"]))
    assert any(m["confidence"] < a["confidence"] for m, a in zip(recs["min"], recs["mean"]))


def test_the_seeds_rule_accepts_a_step_iff_both_signals_clear_their_thresholds(smol_engine):
    """sg_decision both: C >= sg_tau and G >= sg_grounding_tau decide, not S."""
    base = dict(SG, max_new_tokens=40)
    seen = smol_engine.generate(QUESTION, DecodeConfig.create("specguard", "ngram", sg_tau=0.0, **base)).stats.steps
    runs = {}
    # at its own G the first step passes; above 1 (G is a share of attention mass) every step fails on G alone
    for g_tau in (seen[0]["grounding"], 1.01):
        cfg = DecodeConfig.create("specguard", "ngram", sg_decision="both", sg_tau=0.0, sg_grounding_tau=g_tau, **base)
        runs[g_tau] = smol_engine.generate(QUESTION, cfg).stats.steps
        assert runs[g_tau] and all(r["accepted"] == (r["grounding"] >= g_tau) for r in runs[g_tau])  # C >= 0 always
    assert runs[seen[0]["grounding"]][0]["accepted"]
    # the weighted rule at S's threshold 0 would have accepted every step the seed's rule refused
    assert not any(r["accepted"] for r in runs[1.01]) and all(r["score"] >= 0.0 for r in runs[1.01])


def test_tau_zero_accepts_every_draft_step(smol_engine):
    r = smol_engine.generate(QUESTION, DecodeConfig.create("specguard", "ngram", sg_tau=0.0, **SG))
    s = r.stats.to_dict()
    assert s["steps"] >= 2 and s["accepted_steps"] == s["steps"] and s["target_steps"] == 0
    assert s["target_forwards"] == 0  # the target never ran
    assert 0 < s["ttft_s"] <= s["wall_s"]
    assert s["candidates_drafted"] == 4 * s["steps"]
    assert 0.0 <= s["mean_grounding"] <= 1.0 and 0.0 < s["mean_confidence"] <= 1.0
    assert r.config["lossy"] is True and r.config["sg_tau"] == 0.0
    assert_counts_only_committed(r)


@pytest.mark.parametrize(
    "on_reject, drafter",
    [
        ("regenerate", "ngram"),
        # draft-assisted at tau above 1 equals ar in make test across tokenizers (test_bridge); these: make test-full
        pytest.param("draft-assisted", "ngram", marks=pytest.mark.slow),
        pytest.param("draft-assisted", "mla", marks=pytest.mark.slow),
    ],
)
def test_tau_above_one_gives_the_targets_greedy_output(smol_engine, on_reject, drafter):
    ar = smol_engine.generate(QUESTION, DecodeConfig.create("ar", max_new_tokens=SG["max_new_tokens"]))
    r = smol_engine.generate(
        QUESTION, DecodeConfig.create("specguard", drafter, sg_tau=1.01, sg_on_reject=on_reject, **SG)
    )
    s = r.stats.to_dict()
    assert r.token_ids == ar.token_ids
    assert s["steps"] >= 2 and s["accepted_steps"] == 0 and s["target_steps"] == s["steps"]
    # the same weights draft and verify: the greedy candidate is the target's step (when it is the medoid)
    for rec in r.stats.steps:
        assert rec["agrees"] in (True, False) and 0 <= rec["agreed_prefix"] <= rec["tokens"]
        assert rec["agrees"] == (rec["agreed_prefix"] == rec["tokens"])  # same delimiter, same cap
    if on_reject == "regenerate":
        assert s["rounds"] == s["new_tokens"]  # the target alone, one token per forward
    else:
        assert s["rounds"] < s["new_tokens"]
    assert_counts_only_committed(r)


def assert_counts_only_committed(r):
    """Rounds that ran past a step's delimiter are counted up to it (issue 18: 67, 71, 75 counted for 60 made)."""
    st = r.stats
    assert sum(st.round_lengths) == len(r.token_ids) == st.new_tokens
    assert len(st.round_lengths) == st.rounds
    assert 0 <= st.accepted_tokens <= st.drafted_tokens
    assert st.accepted_tokens == sum(rec[1] for rec in st.round_records)
    assert all(0 <= a <= d for a, d in zip(st.accepted_at, st.drafted_at))
    assert sum(st.draft_lengths.values()) <= st.rounds


def test_cli_specguard_json_and_help(tmp_path):
    from conftest import run_cli

    out = run_cli(
        "generate",
        "--target",
        "smollm2-135m-instruct",
        "--draft",
        "smollm2-135m-instruct",
        "--method",
        "specguard",
        "--drafter",
        "ngram",
        "--dtype",
        "float32",
        "--sg-tau",
        "0",
        "--sg-delimiter",
        "\\n",
        "--max-new-tokens",
        "12",
        "--sg-candidates",
        "2",
        "--json",
        QUESTION,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["config"]["lossy"] is True and d["config"]["sg_delimiter"] == "\n" and d["config"]["sg_candidates"] == 2
    for key in ("steps", "accepted_steps", "target_steps", "candidates_drafted", "mean_score"):
        assert key in d["stats"]
    h = run_cli("generate", "--help", env={"COLUMNS": "200"})
    assert "specguard" in h.stdout and "LOSSY" in h.stdout and "--sg-on-reject" in h.stdout
    bad = run_cli(
        "generate", "--target", "smollm2-135m-instruct", "--method", "specguard", "--sg-embedder", "bert", "x"
    )
    assert bad.returncode == 2 and "--sg-embedder must be one of" in bad.stderr


def test_sentence_transformer_embedder_picks_the_consensus_text():
    from loosespec.decode.steps import SentenceEmbedder

    embed = SentenceEmbedder(torch.device("cpu"))
    texts = [
        "She has 16 eggs and eats 3, so 13 are left.",
        "The capital of France is Paris.",
        "16 eggs minus the 3 she eats leaves 13 eggs.",
        "After eating 3 of her 16 eggs she has 13.",
    ]
    e = embed([], texts)
    assert e.shape == (4, 384)
    assert medoid(e) in (0, 2, 3) and medoid(e[[1, 0, 2, 3]]) != 0  # never the off-topic sentence


def test_sentence_transformer_in_the_step_loop(smol_engine):
    r = smol_engine.generate(
        QUESTION,
        DecodeConfig.create(
            "specguard", "ngram", sg_tau=0.0, sg_embedder="sentence-transformer", sg_candidates=3, **SG
        ),
    )
    assert r.stats.to_dict()["accepted_steps"] >= 2 and r.config["sg_embedder"] == "sentence-transformer"


def test_attention_selection_picks_the_candidate_looking_where_the_others_look(tiny_engine, monkeypatch):
    """--sg-select attention (the seed's consistency): each candidate's attention profile over the context, and
    the medoid of those; the profile is a distribution over the context positions."""
    from loosespec.decode.steps import attention_profile

    lm = tiny_engine.draft_lm
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 11], dtype=torch.long)
    p = attention_profile(lm, seq, [12, 13, 14])
    assert p.shape == (7,) and torch.isclose(p.sum(), torch.tensor(1.0)) and (p >= 0).all()
    from loosespec.decode import steps

    calls = []
    real = steps.attention_profile
    monkeypatch.setattr(steps, "attention_profile", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(steps.DraftEmbedder, "__call__", lambda *a: pytest.fail("the embedder must not run"))
    r = tiny_engine.generate(
        "def f(x):\n",
        DecodeConfig.create(
            "specguard",
            "ngram",
            sg_tau=0.0,
            sg_select="attention",
            max_new_tokens=24,
            sg_delimiter="\n",
            sg_max_step_tokens=8,
            has_draft_model=True,
            sg_steps="always",
        ),
        raw=True,
    )
    assert r.stats.steps and r.stats.candidates_drafted == 4 * len(r.stats.steps)
    assert len(calls) == 4 * len(r.stats.steps)  # one profile per candidate, every step


def _old_attentions(lm, seq, rows, layers):
    """What the step loop did before: every layer's maps returned (output_attentions=True)."""
    from loosespec.decode.steps import eager_attention

    with eager_attention(lm.model):
        return lm.forward(seq, rows=rows, output_attentions=True).attentions[-layers:]


@pytest.mark.parametrize("layers", [2, 5])
def test_grounding_keeps_only_the_last_layers_maps_with_identical_values(layers, monkeypatch):
    """SpecGuard's grounding and attention profile read the last ROLLOUT_LAYERS layers' attention maps from hooks
    on those layers instead of output_attentions=True (every layer's maps: 2.8 GB at a 32k context for the
    1.5B); the forward is the same eager one, so G and the profile are bit for bit what they were."""
    from conftest import make_tiny_model

    from loosespec.decode.kv import CachedLM
    from loosespec.decode.steps import attention_profile, grounding, last_attentions
    from loosespec.verify.grounding import ROLLOUT_LAYERS, grounding_from_step_rows

    model = make_tiny_model(3, layers=layers)
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 11, 40, 41], dtype=torch.long)
    step = [12, 13, 14, 15]
    full = torch.cat([seq, torch.tensor(step)])
    before = CachedLM(model)
    before.forward(full, rows=1)  # the step already cached (as after drafting it): it must be fed again
    old = _old_attentions(before, full, len(step), ROLLOUT_LAYERS)
    lm = CachedLM(model)
    lm.forward(full, rows=1)  # the same cache state: the same forward shapes, the same values
    seen = []
    real = lm.forward
    monkeypatch.setattr(lm, "forward", lambda *a, **k: seen.append(k) or real(*a, **k))
    new = last_attentions(lm, full, len(step), ROLLOUT_LAYERS)
    assert not any(k.get("output_attentions") for k in seen)  # no layer returned maps but the hooked ones
    assert len(new) == min(layers, ROLLOUT_LAYERS) == len(old)
    for a, b in zip(new, old):
        assert torch.equal(a[0, :, -len(step) :], b[0, :, -len(step) :])
    g_old = grounding_from_step_rows([a[0, :, -len(step) :] for a in old], len(seq))

    def warm():
        lm = CachedLM(model)
        lm.forward(full, rows=1)
        return lm

    assert grounding(warm(), seq, step) == g_old
    assert model.config._attn_implementation == "sdpa"  # restored after the eager block
    p = attention_profile(warm(), seq, step)
    rows = torch.stack([a[0, :, -len(step) :, : len(seq)].float().mean(dim=(0, 1)) for a in old]).mean(dim=0)
    assert torch.equal(p, rows / rows.sum().clamp_min(1e-12))


def test_grounding_on_smollm_equals_the_all_layers_way(smol_engine):
    """The same on a real 30-layer model: the hooked last three layers give the G that output_attentions gave."""
    from loosespec.decode.kv import CachedLM
    from loosespec.decode.steps import grounding
    from loosespec.verify.grounding import ROLLOUT_LAYERS, grounding_from_step_rows

    model = smol_engine.draft.model
    seq = smol_engine.stream("Two plus two is", DecodeConfig.create("ar", max_new_tokens=1), raw=True).prompt_ids
    step = smol_engine.tokenizer(" four, because", add_special_tokens=False)["input_ids"]
    full = torch.cat([seq, torch.tensor(step)])
    old = _old_attentions(CachedLM(model), full, len(step), ROLLOUT_LAYERS)
    assert grounding(CachedLM(model), seq, step) == grounding_from_step_rows(
        [a[0, :, -len(step) :] for a in old], len(seq)
    )


def test_step_chooser_measures_every_arm_then_runs_the_cheapest_and_remeasures_the_others_ever_less_often():
    c = StepChooser("adaptive", candidates=4)
    assert c.arms == [0, 1, 3, 4]  # the target alone, then 1, 3 and 4 candidates (two have no medoid)
    price = {0: 0.5, 1: 0.4, 3: 1.0, 4: 1.2}  # seconds per 10-token step: one candidate is cheapest
    order = []
    for _ in range(len(c.arms) * StepChooser.WARMUP):
        k = c.choose()
        order.append(k)
        c.record(k, price[k], 10)
    # WARMUP steps of each arm first, the seed's 4 candidates first and the target alone last
    assert order == [k for k in reversed(c.arms) for _ in range(StepChooser.WARMUP)]
    chosen = []
    every = StepChooser.EXPLORE_EVERY
    for _ in range(7 * every):
        k = c.choose()
        chosen.append(k)
        c.record(k, price[k], 10)
    # the cheapest runs; after EXPLORE_EVERY - 1 exploitation steps the arm that ran least recently is measured again
    # (the one warmed up first), in turn; each exploration that changes nothing doubles the interval
    explored = [i for i, k in enumerate(chosen) if k != 1]
    assert explored == [every - 1, 3 * every - 1, 7 * every - 1]
    assert [chosen[i] for i in explored] == [4, 3, 0]
    assert c.explore_every == 8 * every
    assert c.per_token(1) == pytest.approx(0.04)
    # the cheapest arm moves (one candidate turns dear): the interval is back to EXPLORE_EVERY
    price[1] = 5.0
    for _ in range(StepChooser.WINDOW):
        k = c.choose()
        c.record(k, price[k], 10)
        if k != 1:
            break
    assert k == 0 and c.explore_every == every  # the target alone (0.05 per token) is now the cheapest
    for _ in range(20 * StepChooser.MAX_EXPLORE_EVERY):  # never beyond MAX_EXPLORE_EVERY
        k = c.choose()
        c.record(k, price[k], 10)
    assert c.explore_every == StepChooser.MAX_EXPLORE_EVERY
    always = StepChooser("always", candidates=4)
    always.record(4, 100.0, 1)
    assert all(always.choose() == 4 for _ in range(5))
    assert StepChooser("adaptive", candidates=1).arms == [0, 1]
    assert StepChooser("adaptive", candidates=2).arms == [0, 1]  # the second of two would be drafted for nothing
    assert StepChooser("adaptive", candidates=8).arms == [0, 1, 3, 4, 8]


def test_the_engine_keeps_the_step_chooser_across_generations(smol_engine):
    """The warm-up is paid once per configuration, not per answer: a second generation with the same settings
    (another max_new_tokens and seed) gets the same chooser; another configuration its own; reset forgets."""
    smol_engine.reset_step_choosers()
    cfg = DecodeConfig.create("specguard", "ngram", **{**SG, "sg_steps": "adaptive"})
    first = smol_engine.generate(QUESTION, cfg)
    chooser = smol_engine.step_chooser(cfg)
    measured = sum(len(q) for q in chooser.costs.values())
    assert measured == first.stats.to_dict()["steps"] + first.stats.skipped_steps >= 1
    again = DecodeConfig.create("specguard", "ngram", **{**SG, "sg_steps": "adaptive", "max_new_tokens": 30, "seed": 3})
    assert smol_engine.step_chooser(again) is chooser
    second = smol_engine.generate(QUESTION, again)
    assert sum(len(q) for q in chooser.costs.values()) == min(
        measured + second.stats.to_dict()["steps"] + second.stats.skipped_steps, StepChooser.WINDOW * len(chooser.arms)
    )
    other = DecodeConfig.create("specguard", "ngram", **{**SG, "sg_steps": "adaptive", "sg_tau": 0.5})
    assert smol_engine.step_chooser(other) is not chooser
    smol_engine.reset_step_choosers()
    assert smol_engine.step_chooser(cfg) is not chooser


def test_adaptive_steps_leave_dear_steps_to_the_target_losslessly(smol_engine, monkeypatch):
    """Attempts made to look dear (and already measured, as after earlier answers): the target writes the steps
    itself (with --drafter, exact), so at tau above 1 (every attempt rejected too) the output is still the target's
    greedy one; the summary says how many steps were never attempted."""
    monkeypatch.setattr(StepChooser, "per_token", lambda self, k: 1.0 if k else 0.1)
    smol_engine.reset_step_choosers()
    kw = {**SG, "sg_steps": "adaptive", "max_new_tokens": 60, "sg_delimiter": " "}  # a step per word: many steps
    cfg = DecodeConfig.create("specguard", "ngram", sg_tau=1.01, **kw)
    chooser = smol_engine.step_chooser(cfg)
    for k in chooser.arms[1:]:  # every attempt arm warmed up
        chooser.costs[k].extend([(1.0, 1)] * StepChooser.WARMUP)
    ar = smol_engine.generate(QUESTION, DecodeConfig.create("ar", max_new_tokens=kw["max_new_tokens"]))
    r = smol_engine.generate(QUESTION, cfg)
    s = r.stats.to_dict()
    assert r.token_ids == ar.token_ids
    assert s["skipped_steps"] >= StepChooser.WARMUP + 1  # the target's own warm-up, then its steps
    # attempts only to measure them again: the first after EXPLORE_EVERY steps, then ever less often
    assert 1 <= s["steps"] <= (s["skipped_steps"] + s["steps"]) // StepChooser.EXPLORE_EVERY
    assert chooser.explore_every == min(StepChooser.EXPLORE_EVERY * 2 ** s["steps"], StepChooser.MAX_EXPLORE_EVERY)
    assert_counts_only_committed(r)
