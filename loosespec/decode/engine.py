"""The decode loop, and the engine object that holds the loaded models.

One loop serves every method: ``ar`` is the same loop with an empty draft (one target token per
round), so the speedup baseline is measured by the same code as the methods it is compared with.
What varies is passed in: the drafter (who proposes) and the rule (who decides).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from loosespec import __version__
from loosespec.drafters.bridge import BridgedDrafter, DraftSide, IntersectionDrafter, TokenizerBridge, VocabIntersection
from loosespec.config import DecodeConfig
from loosespec.drafters import Draft, Drafter, MlaDrafter, ModelDrafter, NgramDrafter
from loosespec.drafters.base import EMPTY_DRAFT
from loosespec.errors import LoosespecError
from loosespec.hardware import sync
from loosespec.decode.gguf import REFUSAL as GGUF_REFUSAL, GgufLM, is_gguf
from loosespec.decode.kv import DEFAULT_MAX_CACHE_LEN, CachedLM, StaticCachedLM
from loosespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, LoadedModel, load, same_tokenizer
from loosespec.decode.steps import DraftEmbedder, SentenceEmbedder, StepParts, decode_steps
from loosespec.decode.stats import Stats
from loosespec.decode.text import TextAssembler, encode_prompt, end_token_ids
from loosespec.methods import METHODS
from loosespec.verify.rules import Rule
from loosespec.verify import SamplingParams
from loosespec.verify.sampling import check_finite

def prompt_tensor(ids) -> torch.Tensor:
    """A prompt's token ids as the loop holds them, [P] int64 on the CPU, from what a caller may pass: a 1-D
    tensor, a [1, P] tensor as tokenizers return it (or their ``BatchEncoding``), on any device, of any integer
    dtype. Normalised once, on entry: the caches compare and concatenate CPU ids every round."""
    if not isinstance(ids, torch.Tensor) and hasattr(ids, "keys") and "input_ids" in ids:
        ids = ids["input_ids"]  # tokenizer(..., return_tensors="pt")
    ids = torch.as_tensor(ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise LoosespecError(f"one prompt at a time: got a batch of {ids.shape[0]} prompts ({list(ids.shape)})")
        ids = ids[0]
    if ids.dim() != 1:
        raise LoosespecError(f"a prompt's token ids must be [P] or [1, P], got shape {list(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise LoosespecError(f"a prompt's token ids must be integers, got {ids.dtype}")
    return ids.to(device="cpu", dtype=torch.long)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def decode(
    target: CachedLM,
    drafter: Drafter | None,
    rule: Rule,
    prompt_ids: torch.Tensor,  # [P] int64, CPU
    max_new_tokens: int,
    num_draft_tokens: int,
    stop_ids: Collection[int],
    stats: Stats,
) -> Iterator[list[int]]:
    """Yield committed token chunks until an end token or ``max_new_tokens``."""
    seq = prompt_ids
    produced = 0
    dtype = next(target.model.parameters()).dtype  # named in a non-finite-logits error
    target.prefill(seq[:-1])  # the prompt in a forward of its own, the same for every method (loosespec.quant)
    while produced < max_new_tokens:
        # 1. propose: at most K tokens, never more than the budget has room for (+1 target token)
        k = min(num_draft_tokens, max_new_tokens - produced - 1)
        proposed = drafter is not None and k > 0
        draft = drafter.propose(seq, k) if proposed else EMPTY_DRAFT
        if drafter is not None:
            stats.record_draft_length(getattr(drafter, "last_choice", k) if proposed else 0)
        # 2. verify: one target forward over [last committed, d_0 .. d_{K-1}] -> K + 1 rows
        logits = target.logits(torch.cat([seq, draft.tokens]), rows=len(draft) + 1)
        # 3. rule: accepted prefix + one correction-or-bonus token (NaN logits make multinomial fail: say why)
        try:
            verdict = rule(draft, logits)
        except RuntimeError:
            check_finite(logits, "target", dtype)
            raise
        level = None
        if proposed and hasattr(drafter, "feedback"):  # the drafter learns the round's outcome (cost-aware length)
            drafter.feedback(len(draft), verdict.num_accepted, verdict.first_miss)
            level = getattr(drafter, "round_events", None)  # the drafting level the round used (draftlen)
        # 4. commit, cut after an end token; caches roll back lazily (see kv.CachedLM.logits)
        tokens = verdict.tokens.tolist()
        check_finite(logits, "target", dtype)  # after the read above: the device is idle by now
        end = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
        if end is not None:
            tokens = tokens[: end + 1]
        seq = torch.cat([seq, torch.tensor(tokens, dtype=torch.long)])
        produced += len(tokens)
        # 5. stats
        events = verdict.events
        if level:
            events = {**(events or {}), **level}
        if draft.draft_units is not None:
            events = {**(events or {}), "draft_units_drafted": draft.draft_units}
        stats.record_round(len(draft), min(verdict.num_accepted, len(tokens)), len(tokens), events)
        # 6. stream
        yield tokens
        if end is not None:
            return


# ---------------------------------------------------------------------------------------------
# Engine: loaded models + the objects each config needs
# ---------------------------------------------------------------------------------------------


@dataclass
class Chunk:
    """One round's committed token ids and the text they release (may be "" while held back)."""

    token_ids: list[int]
    text: str


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (end token or stop string) | "length"
    stats: Stats
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict(), "config": self.config}


class Generation:
    """A running generation: iterate for text chunks; ``result()`` when done (drains it first)."""

    def __init__(self, engine: "Engine", prompt_ids: torch.Tensor, cfg: DecodeConfig, config_dict: dict):
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.cfg = cfg
        self.config = config_dict
        self.stats = Stats(prompt_tokens=int(prompt_ids.shape[0]), precision=engine.precision)
        self.assembler = TextAssembler(engine.tokenizer, cfg.stop)
        self.finish_reason = "length"
        self._iter = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._iter

    def _run(self) -> Iterator[Chunk]:
        e, cfg = self.engine, self.cfg
        drafter, rule, generator = e.build(cfg, self.prompt_ids)
        target_f0 = e.target_lm.forwards
        draft_f0 = e.draft_lm.forwards if e.draft_lm is not None else 0
        e.target_lm.reset()
        if e.draft_lm is not None:
            e.draft_lm.reset()
        sync(e.device)
        start = time.perf_counter()
        if cfg.method == "specguard":
            side = None
            if e.bridge is not None:
                eos = e.tokenizer.eos_token_id if e.tokenizer.eos_token_id in e.stop_ids else min(e.stop_ids)
                side = DraftSide(lambda ids: e.draft.tokenizer.decode(ids, skip_special_tokens=True),
                                 e.draft_stop_ids, e.bridge, eos)
            parts = StepParts(e.target_lm, e.draft_lm, drafter, rule, decode, e.embedder(cfg.sg_embedder),
                              e.detokenize, e.stop_ids, generator, side)
            chunks = decode_steps(parts, self.prompt_ids, cfg, self.stats)
        else:
            chunks = decode(e.target_lm, drafter, rule, self.prompt_ids, cfg.max_new_tokens, cfg.num_draft_tokens,
                            e.stop_ids, self.stats)
        try:
            first = True
            for tokens in chunks:
                if first:  # a SpecGuard step may take several rounds before its first chunk
                    sync(e.device)
                    self.stats.ttft_s = time.perf_counter() - start
                    first = False
                before = len(self.assembler.token_ids)
                delta = self.assembler.push(tokens)
                self.stats.uncommit(before + len(tokens) - len(self.assembler.token_ids))  # cut at a stop string
                if self.assembler.stopped or tokens[-1] in e.stop_ids:
                    self.finish_reason = "stop"
                # every round's committed ids (cut at a stop string); text may be held back ("")
                yield Chunk(self.assembler.token_ids[before:], delta)
                if self.assembler.stopped:
                    break
            tail = self.assembler.finish()
            if tail:
                yield Chunk([], tail)
        finally:
            sync(e.device)
            self.stats.wall_s = time.perf_counter() - start
            self.stats.target_forwards = e.target_lm.forwards - target_f0
            self.stats.draft_forwards = (e.draft_lm.forwards - draft_f0) if e.draft_lm is not None else 0
            self.stats.new_tokens = len(self.assembler.token_ids)

    def result(self) -> GenerationResult:
        for _ in self._iter:
            pass
        a = self.assembler
        return GenerationResult(a.text, list(a.token_ids), self.finish_reason, self.stats, self.config)


def check_cache_options(cache_implementation: str, compile: bool) -> None:
    """Refuse a cache implementation loosespec lacks, and ``compile`` without the static cache."""
    if cache_implementation not in ("dynamic", "static"):
        raise LoosespecError(f"cache_implementation must be 'dynamic' or 'static', got {cache_implementation!r}")
    if compile and cache_implementation != "static":
        raise LoosespecError("compile needs cache_implementation 'static' (fixed shapes and tensor addresses)")


def draft_quantize_for(quantize: str, draft_quantize: str = "auto") -> str:
    """The draft's ``quantize``: ``draft_quantize`` when given; else the target's when that was given (a run pinned
    to ``--quantize int8`` keeps its draft in int8); else ``auto``, resolved for the draft's role."""
    return draft_quantize if draft_quantize != "auto" else quantize


def draft_role(torch_draft: bool) -> str:
    """The role the draft's ``auto`` precision is resolved for: ``target`` (never int4) when something will run the
    draft as a transformers model (SpecGuard's attentions, transformers' assisted generation), else ``draft``."""
    return "target" if torch_draft else "draft"


def _output_rows(model) -> int:
    """Rows of the output embedding (the logits' width): an ``nn.Linear`` or loosespec's int8 layer."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


class Engine:
    """Target (and optional draft) model, loaded once, serving any method and drafter.

    >>> eng = Engine.load("smollm2-135m-instruct", draft=None, dtype="float32")
    >>> cfg = DecodeConfig.create("exact", max_new_tokens=32)
    >>> print(eng.generate("Write a haiku about caches.", cfg).text)
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, cache_implementation: str = "dynamic",
                 compile: bool = False, max_cache_len: int = DEFAULT_MAX_CACHE_LEN, compile_backend: str = "inductor"):
        """``cache_implementation`` (transformers' name): ``dynamic`` (a growing ``DynamicCache``) or
        ``static`` (preallocated at ``max_cache_len`` positions, full-attention models; SpecGuard needs
        ``dynamic``); ``compile``: ``torch.compile`` the fixed-shape forwards on the static cache, CUDA
        graphs on a GPU (:class:`~loosespec.decode.kv.StaticCachedLM`; ``compile_backend``: torch.compile's,
        tests use ``eager``). Off by default: on a CPU compiling costs minutes, and no GPU has measured it yet
        (``docs/gpu.md``)."""
        check_cache_options(cache_implementation, compile)
        self.cache_implementation, self.compile = cache_implementation, compile

        def lm(model):
            if is_gguf(model):  # --quantize int4: llama.cpp's forward and cache
                if cache_implementation != "dynamic" or compile:
                    raise LoosespecError("a model run by llama.cpp (--quantize int4) keeps llama.cpp's own cache: "
                                         "cache_implementation 'static' and compile do not apply")
                return GgufLM(model)
            if cache_implementation == "static":
                return StaticCachedLM(model, max_cache_len, compile, compile_backend)
            return CachedLM(model)

        # a draft with another vocabulary drafts through text, or samples in the shared vocabulary (loosespec.drafters.bridge)
        self.bridge = (TokenizerBridge(target.tokenizer, draft.tokenizer)
                       if draft is not None and not same_tokenizer(target.tokenizer, draft.tokenizer) else None)
        self.target = target
        self.draft = draft
        self.tokenizer = target.tokenizer
        self.target_lm = lm(target.model)
        self.draft_lm = lm(draft.model) if draft is not None else None
        self.device = self.target_lm.device
        self.stop_ids = end_token_ids(target.model, target.tokenizer)
        self.draft_stop_ids = end_token_ids(draft.model, draft.tokenizer) if draft is not None else frozenset()
        self._embedders: dict = {}
        self._costs: dict = {}
        self.progress = False
        self._intersection: VocabIntersection | None = None

    @classmethod
    def load(cls, target: str = DEFAULT_TARGET, draft: str | None = DEFAULT_DRAFT, dtype: str = "auto",
             device: str = "auto", progress: bool = True, quantize: str = "auto",
             cache_implementation: str = "dynamic", compile: bool = False,
             max_cache_len: int = DEFAULT_MAX_CACHE_LEN, draft_quantize: str = "auto",
             torch_draft: bool = False, revision: str | None = None,
             draft_revision: str | None = None) -> "Engine":
        """``dtype``/``quantize`` ``auto``: the precision this hardware verifies fastest in
        (:func:`loosespec.hardware.resolve_precision`). ``draft_quantize``: the draft's; ``auto`` is ``quantize``
        when that is given, and with ``quantize="auto"`` the draft's own choice (int4 in llama.cpp for a GGUF draft
        where llama-cpp-python is installed: :func:`draft_quantize_for`), unless ``torch_draft`` (SpecGuard,
        transformers' assisted generation: :func:`draft_role`). The cache options: :meth:`__init__`.
        ``revision``/``draft_revision``: the Hugging Face Hub revision of a target/draft given as a Hub id
        (:func:`loosespec.models.load`); for any other kind of model an error, before anything loads."""
        check_cache_options(cache_implementation, compile)  # before loading anything
        from loosespec.hardware import QUANTIZE_CHOICES
        from loosespec.models import check_revision

        if draft_quantize not in QUANTIZE_CHOICES:
            raise LoosespecError(f"unknown quantize '{draft_quantize}' for the draft (--draft-quantize); choose one "
                                 f"of: {', '.join(QUANTIZE_CHOICES)}")
        has_draft = draft not in (None, "none")
        check_revision(target, revision, "--revision")
        if has_draft:
            check_revision(draft, draft_revision, "--draft-revision")
        t = load(target, dtype, device, progress, quantize, revision=revision)
        d = (load(draft, dtype, str(t.model.device), progress, draft_quantize_for(quantize, draft_quantize),
                  draft_role(torch_draft), revision=draft_revision)
             if has_draft else None)
        e = cls(t, d, cache_implementation, compile, max_cache_len)
        e.progress = progress
        return e

    @property
    def precision(self) -> str:
        p = self.target.precision
        return p.name if p is not None else str(next(self.target.model.parameters()).dtype).replace("torch.", "")

    def cost_curve(self, role: str, max_n: int):
        """The measured cost curve of the target or the draft (``role``), cached per machine."""
        from loosespec.cost import cost_curve

        loaded, lm = (self.target, self.target_lm) if role == "target" else (self.draft, self.draft_lm)
        key = (role, max_n)
        if key not in self._costs:
            say = (lambda m: print(m, file=sys.stderr)) if self.progress else None
            self._costs[key] = cost_curve(loaded, lm, max_n, progress=say)
        return self._costs[key]

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def embedder(self, name: str):
        """SpecGuard's candidate embedder, created once per engine."""
        if name not in self._embedders:
            self._embedders[name] = DraftEmbedder() if name == "draft" else SentenceEmbedder(self.device)
        return self._embedders[name]

    def build(self, cfg: DecodeConfig, prompt_ids: torch.Tensor | None = None
              ) -> tuple[Drafter | None, Rule, torch.Generator]:
        """The drafter and rule a config asks for, and a fresh seeded generator they share; ``prompt_ids``:
        the request's prompt (FLy's copy guard compares drafts with it).

        For ``specguard`` these are the token-level drafter and rule of the target's steps.
        """
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        if cfg.method == "specguard" and self.cache_implementation != "dynamic":
            raise LoosespecError("method 'specguard' needs cache_implementation 'dynamic': it copies the draft's "
                                 "cache per step and grows it along a batch of candidates")
        if cfg.method == "specguard" and self.draft_lm is None:
            raise LoosespecError("method 'specguard' needs a draft model (--draft): it drafts whole steps with it")
        if cfg.method == "specguard" and any(is_gguf(m.model) for m in (self.target, self.draft)):
            raise LoosespecError(f"method 'specguard': {GGUF_REFUSAL}")
        sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)
        # FLy's two-sample variant drafts greedily, as the official code does
        draft_sampling = SamplingParams(0.0) if cfg.method == "fly" and cfg.fly_sampling == "two-sample" else sampling
        if cfg.drafter in ("model", "mla") and self.draft_lm is None:
            raise LoosespecError(f"drafter '{cfg.drafter}' needs a draft model (--draft), but none is loaded")
        self._check_rollback(cfg)
        tli = self.bridge is not None and cfg.drafter in ("model", "mla") and self._needs_draft_probs(cfg, sampling)
        if tli:  # rejection sampling across vocabularies: draft inside the shared vocabulary (bridge.py)
            draft_sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k,
                                            vocab_mask=self.intersection().draft_mask)
        elif self.bridge is not None:  # greedy drafting, the proposal carried over as text
            draft_sampling = SamplingParams(0.0)
        drafter: Drafter | None
        if cfg.drafter is None:
            drafter = None
        elif cfg.drafter == "ngram":
            drafter = NgramDrafter(cfg.prompt_lookup_max, cfg.prompt_lookup_min, self.stop_ids)
        elif cfg.drafter == "model":
            # FLy drafts the full K, as its official code: no confidence stop (methods.Method.full_drafts)
            threshold = 0.0 if METHODS[cfg.method].full_drafts else cfg.draft_confidence_threshold
            drafter = ModelDrafter(self.draft_lm, draft_sampling, generator, self._draft_side_stops(), threshold)
        else:
            drafter = MlaDrafter(self.draft_lm, draft_sampling, generator, self._draft_side_stops(), max_ngram=4,
                                 lookup_tokens=cfg.mla_lookup_tokens, min_ngram=cfg.prompt_lookup_min)
        if tli:
            drafter = IntersectionDrafter(drafter, self.bridge, self.intersection())
        elif self.bridge is not None and cfg.drafter in ("model", "mla"):
            drafter = BridgedDrafter(drafter, self.bridge, self.draft_stop_ids)
        if drafter is not None and cfg.adaptive_draft_length and cfg.method != "specguard":
            # SpecGuard's target steps draft from the rejected candidate first (specguard.CandidateFirst),
            # which no per-round estimate describes: they keep K
            drafter = self._cost_aware(drafter, cfg)
        return drafter, METHODS[cfg.method].make_rule(cfg, sampling, generator, prompt_ids), generator

    def _check_rollback(self, cfg: DecodeConfig) -> None:
        """Speculation rolls caches back (rejected drafts): refuse it up front for a model whose cache cannot
        be (loosespec.decode.kv), instead of failing at the first rejection."""
        if cfg.drafter is None and cfg.method != "specguard":
            return  # ar: the cache only grows
        lms = [(self.target, self.target_lm)]
        if cfg.drafter in ("model", "mla") or cfg.method == "specguard":
            lms.append((self.draft, self.draft_lm))
        for loaded, lm in lms:
            problem = lm.rollback_problem
            if problem:
                raise LoosespecError(f"method '{cfg.method}' cannot run on '{loaded.name}': {problem}; "
                                     "method 'ar' can (it never rolls back)")

    def _cost_aware(self, drafter, cfg: DecodeConfig):
        """The drafter behind the cost-aware draft length (loosespec.decode.draftlen), priced by the cost curves."""
        from loosespec.decode.draftlen import (MODEL_PRIOR_MEAN, AcceptanceEstimate, CostAwareDrafter,
                                               DraftLengthPolicy, Level, LoosePrices)

        # one curve per model for every K up to 15 (FLy's), so methods in one run price alike
        target_cost = self.cost_curve("target", max(cfg.num_draft_tokens + 1, 16))
        k = cfg.num_draft_tokens

        # a loose rule's deferrals are priced too (FLy): one estimate shared by the levels, as the gate is the target's
        shared = LoosePrices(cfg.fly_window_size, cfg.fly_boundary, cfg.num_draft_tokens) if cfg.method == "fly" else None

        def loose():
            return shared

        if cfg.drafter == "ngram":
            return CostAwareDrafter([Level("lookup", drafter, DraftLengthPolicy(target_cost, 0.0, k, loose=loose()))])
        draft_lm = self.draft_lm
        draft_lm.cost = self.cost_curve("draft", cfg.mla_lookup_tokens + 1)
        # a forward per drafted token until the first rounds say otherwise
        model = Level("model", drafter, DraftLengthPolicy(target_cost, draft_lm.cost(1), k,
                                                          AcceptanceEstimate(k, prior_mean=MODEL_PRIOR_MEAN),
                                                          loose=loose()), draft_lm)
        if cfg.drafter == "mla" and self.bridge is None:  # MLA's levels: the lookup alone, or the draft model
            lookup = NgramDrafter(cfg.prompt_lookup_max, cfg.prompt_lookup_min, self.stop_ids)
            return CostAwareDrafter([Level("lookup", lookup, DraftLengthPolicy(target_cost, 0.0, k, loose=loose())),
                                     model])
        return CostAwareDrafter([model])

    def _draft_side_stops(self) -> frozenset[int]:
        """End tokens in the ids the draft model works in (its own across tokenizers)."""
        return self.draft_stop_ids if self.bridge is not None else self.stop_ids

    @staticmethod
    def _needs_draft_probs(cfg: DecodeConfig, sampling: SamplingParams) -> bool:
        """Whether the rule needs the draft's distribution ``q`` (rejection sampling, or FLy on it)."""
        return not sampling.greedy and (cfg.method == "rejection" or (cfg.method == "fly" and cfg.fly_sampling ==
                                                                       "rejection"))

    def intersection(self) -> VocabIntersection:
        """The vocabulary draft and target share (built on first use; a draft of another tokenizer only)."""
        if self._intersection is None:
            self._intersection = VocabIntersection.between(self.tokenizer, self.draft.tokenizer,
                                                           _output_rows(self.target.model),
                                                           _output_rows(self.draft.model))
            if len(self._intersection) == 0:
                raise LoosespecError(f"draft '{self.draft.name}' and target '{self.target.name}' share no token: "
                                     "rejection sampling across them is impossible; use --temperature 0 or "
                                     "--drafter ngram")
        return self._intersection

    def config_dict(self, cfg: DecodeConfig, raw: bool) -> dict:
        """Everything needed to reproduce a run."""
        import transformers

        def model_info(m: LoadedModel | None):
            if m is None:
                return None
            info = {"spec": m.source.spec, "kind": m.source.kind, "revision": m.source.revision,
                    "dtype": str(next(m.model.parameters()).dtype).replace("torch.", "")}
            if m.source.requested_revision is not None:  # --revision, as asked (a branch, tag or commit)
                info["requested_revision"] = m.source.requested_revision
            return info

        from loosespec.hardware import describe_device

        def precision(m: LoadedModel | None):
            return m.precision.to_dict() if m is not None and m.precision is not None else None

        return {**cfg.to_dict(), "target": model_info(self.target), "draft": model_info(self.draft),
                "precision": precision(self.target), "draft_precision": precision(self.draft),
                "hardware": describe_device(self.device), "device": str(self.device), "raw": raw,
                "cache_implementation": self.cache_implementation, "compile": self.compile, "loosespec": __version__, "torch": torch.__version__,
                "transformers": transformers.__version__}

    def stream(self, prompt: str | Sequence[dict] | torch.Tensor, cfg: DecodeConfig, raw: bool = False) -> Generation:
        if isinstance(prompt, torch.Tensor) or hasattr(prompt, "keys") and "input_ids" in prompt:
            ids = prompt_tensor(prompt)  # on any device, [P] or [1, P]
        else:
            ids = encode_prompt(self.tokenizer, prompt, raw)
        if ids.numel() == 0:
            raise LoosespecError("empty prompt")
        return Generation(self, ids, cfg, self.config_dict(cfg, raw))

    def generate(self, prompt: str | Sequence[dict] | torch.Tensor, cfg: DecodeConfig,
                 raw: bool = False) -> GenerationResult:
        return self.stream(prompt, cfg, raw).result()
