"""The engine: the loaded models, and what each configuration needs of them.

:meth:`Engine.build` asks the method (:mod:`loosespec.methods`) and the drafter table
(:data:`loosespec.drafters.DRAFTERS`) for a configuration's drafter and rule; a :class:`Generation` runs them in
the token-level loop (:mod:`loosespec.decode.loop`) or, for a step-level method, SpecGuard's step loop
(:mod:`loosespec.decode.steps`), and turns the committed tokens into text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from loosespec import __version__
from loosespec.config import DecodeConfig
from loosespec.decode.gguf import REFUSAL as GGUF_REFUSAL
from loosespec.decode.gguf import GgufLM, is_gguf
from loosespec.decode.kv import DEFAULT_MAX_CACHE_LEN, CachedLM, StaticCachedLM
from loosespec.decode.loop import decode
from loosespec.decode.stats import Stats
from loosespec.decode.steps import DraftEmbedder, SentenceEmbedder, StepChooser, StepParts, decode_steps
from loosespec.decode.text import TextAssembler, encode_prompt, end_token_ids
from loosespec.drafters import DRAFTERS, DraftParts
from loosespec.drafters.base import Drafter
from loosespec.drafters.bridge import BridgedDrafter, DraftSide, IntersectionDrafter, TokenizerBridge, VocabIntersection
from loosespec.errors import LoosespecError
from loosespec.hardware import sync
from loosespec.loading import LoadConfig
from loosespec.methods import METHODS, needs_draft_model
from loosespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, LoadedModel, load, same_tokenizer
from loosespec.verify import SamplingParams
from loosespec.verify.rules import Rule

log = logging.getLogger(__name__)


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
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
            "config": self.config,
        }


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
        if METHODS[cfg.method].step_level and cfg.sg_steps == "adaptive":  # StepChooser prices steps from these
            e.target_lm.cost = e.cost_curve("target", max(cfg.num_draft_tokens + 1, 16))
            e.draft_lm.cost = e.cost_curve("draft", max(cfg.mla_lookup_tokens + 1, cfg.sg_candidates))
        target_f0 = e.target_lm.forwards
        draft_f0 = e.draft_lm.forwards if e.draft_lm is not None else 0
        e.target_lm.reset()
        if e.draft_lm is not None:
            e.draft_lm.reset()
        sync(e.device)
        start = time.perf_counter()
        if METHODS[cfg.method].step_level:
            side = None
            if e.bridge is not None:
                eos = e.tokenizer.eos_token_id if e.tokenizer.eos_token_id in e.stop_ids else min(e.stop_ids)
                side = DraftSide(
                    lambda ids: e.draft.tokenizer.decode(ids, skip_special_tokens=True), e.draft_stop_ids, e.bridge, eos
                )
            parts = StepParts(
                e.target_lm,
                e.draft_lm,
                drafter,
                rule,
                e.embedder(cfg.sg_embedder),
                e.detokenize,
                e.stop_ids,
                generator,
                side,
                e.step_chooser(cfg),
            )
            chunks = decode_steps(parts, self.prompt_ids, cfg, self.stats)
        else:
            chunks = decode(
                e.target_lm,
                drafter,
                rule,
                self.prompt_ids,
                cfg.max_new_tokens,
                cfg.num_draft_tokens,
                e.stop_ids,
                self.stats,
            )
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
    """The role the draft's ``auto`` precision is resolved for: ``torch`` (never int4) when something will run the
    draft as a transformers model (SpecGuard's attentions, transformers' assisted generation), else ``draft``."""
    return "torch" if torch_draft else "draft"


def target_role(torch_target: bool) -> str:
    """The role the target's ``auto`` precision is resolved for: ``torch`` (never int4) when something will run the
    target as a transformers model (SpecGuard, transformers' ``generate`` peers), else ``target``."""
    return "torch" if torch_target else "target"


def _output_rows(model) -> int:
    """Rows of the output embedding (the logits' width): an ``nn.Linear`` or loosespec's int8 layer."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


class Engine:
    """Target (and optional draft) model, loaded once, serving any method and drafter.

    >>> eng = Engine.load("smollm2-135m-instruct", draft=None, dtype="float32")
    >>> print(eng.generate("Write a haiku about caches.", DecodeConfig(max_new_tokens=32)).text)

    A config's unset drafter (and its K) is filled from what was loaded (:meth:`DecodeConfig.resolved`): the
    method's default drafter with a draft model (mla), else ngram.
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        cache_implementation: str = "dynamic",
        compile: bool = False,
        max_cache_len: int = DEFAULT_MAX_CACHE_LEN,
        compile_backend: str = "inductor",
    ):
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
                    raise LoosespecError(
                        "a model run by llama.cpp (--quantize int4) keeps llama.cpp's own cache: "
                        "cache_implementation 'static' and compile do not apply"
                    )
                return GgufLM(model)
            if cache_implementation == "static":
                return StaticCachedLM(model, max_cache_len, compile, compile_backend)
            return CachedLM(model)

        # a draft with another vocabulary drafts through text, or samples in the shared vocabulary (loosespec.drafters.bridge)
        self.bridge = (
            TokenizerBridge(target.tokenizer, draft.tokenizer)
            if draft is not None and not same_tokenizer(target.tokenizer, draft.tokenizer)
            else None
        )
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
        self._choosers: dict = {}
        self.progress = False
        self._intersection: VocabIntersection | None = None

    @classmethod
    def load(
        cls,
        target: str = DEFAULT_TARGET,
        draft: str | None = DEFAULT_DRAFT,
        *,
        progress: bool = True,
        torch_draft: bool = False,
        torch_target: bool = False,
        **options,
    ) -> "Engine":
        """Load ``target`` and ``draft`` (None or ``"none"``: no draft model; ``"auto"``: the default draft for the
        default target) with ``options``, the other fields of :class:`~loosespec.loading.LoadConfig` by name
        (``dtype``, ``quantize``, ``draft_quantize``, ``device``, ``revision``, ``draft_revision``,
        ``cache_implementation``, ``compile``, ``max_cache_len``; their defaults there): :meth:`load_from`."""
        return cls.load_from(
            LoadConfig(target=target, draft=draft, **options),
            progress=progress,
            torch_draft=torch_draft,
            torch_target=torch_target,
        )

    @classmethod
    def load_from(
        cls, cfg: LoadConfig, *, progress: bool = True, torch_draft: bool = False, torch_target: bool = False
    ) -> "Engine":
        """The engine ``cfg`` describes. ``dtype``/``quantize`` ``auto``: the precision this hardware verifies fastest
        in (:func:`loosespec.hardware.resolve_precision`). ``draft_quantize``: the draft's; ``auto`` is ``quantize``
        when that is given, and with ``quantize="auto"`` the draft's own choice (int4 in llama.cpp for a GGUF draft
        where llama-cpp-python is installed: :func:`draft_quantize_for`), unless ``torch_draft`` (SpecGuard,
        transformers' assisted generation: :func:`draft_role`). The target's ``auto`` is int4 in llama.cpp on the same
        terms, unless ``torch_target`` or ``torch_draft`` (SpecGuard reads both models; transformers' ``generate``
        peers run the target: :func:`target_role`). The cache options: :meth:`__init__`.
        ``revision``/``draft_revision``: the Hugging Face Hub revision of a target/draft given as a Hub id
        (:func:`loosespec.models.load`); for any other kind of model an error, before anything loads."""
        check_cache_options(cfg.cache_implementation, cfg.compile)  # before loading anything
        from loosespec.hardware import QUANTIZE_CHOICES
        from loosespec.models import check_revision

        if cfg.draft_quantize not in QUANTIZE_CHOICES:
            raise LoosespecError(
                f"unknown quantize '{cfg.draft_quantize}' for the draft (--draft-quantize); choose "
                f"one of: {', '.join(QUANTIZE_CHOICES)}"
            )
        draft = cfg.draft_model
        log.debug("loading %s (draft %s; torch_draft %s)", cfg, draft or "none", torch_draft)
        check_revision(cfg.target, cfg.revision, "--revision")
        if draft is not None:
            check_revision(draft, cfg.draft_revision, "--draft-revision")
        role = target_role(torch_target or torch_draft)
        t = load(cfg.target, cfg.dtype, cfg.device, progress, cfg.quantize, role, revision=cfg.revision)
        d = (
            load(
                draft,
                cfg.dtype,
                str(t.model.device),
                progress,
                draft_quantize_for(cfg.quantize, cfg.draft_quantize),
                draft_role(torch_draft),
                revision=cfg.draft_revision,
            )
            if draft is not None
            else None
        )
        e = cls(t, d, cfg.cache_implementation, cfg.compile, cfg.max_cache_len)
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
            say = log.info if self.progress else None
            self._costs[key] = cost_curve(loaded, lm, max_n, progress=say)
        return self._costs[key]

    # what a request may change without changing what a SpecGuard step costs
    PER_REQUEST = frozenset({"max_new_tokens", "seed", "stop"})

    def step_chooser(self, cfg: DecodeConfig) -> StepChooser:
        """SpecGuard's step chooser for ``cfg``, kept across this engine's generations: one per configuration
        (apart from the per-request max_new_tokens, seed and stop), so its measurements of what a step costs
        carry over from one answer to the next. An adaptive generation's choices therefore depend on what the
        engine generated before with the same configuration (``reset_step_choosers`` forgets them)."""
        key = tuple((f, repr(getattr(cfg, f))) for f in sorted(cfg.__dataclass_fields__) if f not in self.PER_REQUEST)
        if key not in self._choosers:
            self._choosers[key] = StepChooser(cfg.sg_steps, cfg.sg_candidates)
        return self._choosers[key]

    def reset_step_choosers(self) -> None:
        """Forget what SpecGuard's steps have cost: the next adaptive generation measures afresh."""
        self._choosers.clear()

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def embedder(self, name: str):
        """SpecGuard's candidate embedder, created once per engine."""
        if name not in self._embedders:
            self._embedders[name] = DraftEmbedder() if name == "draft" else SentenceEmbedder(self.device)
        return self._embedders[name]

    def build(
        self, cfg: DecodeConfig, prompt_ids: torch.Tensor | None = None
    ) -> tuple[Drafter | None, Rule, torch.Generator]:
        """The drafter and rule a config asks for, and a fresh seeded generator they share; ``prompt_ids``:
        the request's prompt (FLy's copy guard compares drafts with it). The method
        (:class:`~loosespec.methods.Method`) says how its draft samples and which rule it verifies with, the drafter
        table (:data:`~loosespec.drafters.DRAFTERS`) builds the drafter.

        For a step-level method (``specguard``) these are the token-level drafter and rule of the target's steps.
        """
        cfg = cfg.resolved(self.draft_lm is not None)
        method = METHODS[cfg.method]
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        if method.step_level and self.cache_implementation != "dynamic":
            raise LoosespecError(
                f"method '{cfg.method}' needs cache_implementation 'dynamic': it copies the draft's "
                "cache per step and grows it along a batch of candidates"
            )
        if method.needs_draft_model and self.draft_lm is None:
            raise LoosespecError(f"method '{cfg.method}' needs a draft model (--draft): it drafts whole steps with it")
        if method.torch_draft and any(is_gguf(m.model) for m in (self.target, self.draft)):
            raise LoosespecError(f"method '{cfg.method}': {GGUF_REFUSAL}")
        sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k)
        draft_sampling = method.draft_sampling(cfg, sampling)
        entry = DRAFTERS[cfg.drafter] if cfg.drafter is not None else None
        with_model = entry is not None and entry.needs_draft_model  # drafts with the draft model
        if with_model and self.draft_lm is None:
            raise LoosespecError(f"drafter '{cfg.drafter}' needs a draft model (--draft), but none is loaded")
        self._check_rollback(cfg)
        tli = self.bridge is not None and with_model and method.needs_draft_probs(cfg, sampling)
        if tli:  # rejection sampling across vocabularies: draft inside the shared vocabulary (bridge.py)
            draft_sampling = SamplingParams(
                cfg.temperature, cfg.top_p, cfg.top_k, vocab_mask=self.intersection().draft_mask
            )
        elif self.bridge is not None:  # greedy drafting, the proposal carried over as text
            draft_sampling = SamplingParams(0.0)
        drafter: Drafter | None = None
        if entry is not None:
            drafter = entry.build(self._draft_parts(cfg, draft_sampling, generator))
        if tli:
            drafter = IntersectionDrafter(drafter, self.bridge, self.intersection())
        elif self.bridge is not None and with_model:
            drafter = BridgedDrafter(drafter, self.bridge, self.draft_stop_ids)
        if drafter is not None and cfg.adaptive_draft_length:
            # SpecGuard's target steps too: a step it leaves to the target is a token-level decode like any other,
            # and a rejected candidate's step drafts from the candidate first (steps.CandidateFirst), then from this
            drafter = self._cost_aware(drafter, cfg, generator)
        return drafter, method.make_rule(cfg, sampling, generator, prompt_ids), generator

    def _draft_parts(self, cfg: DecodeConfig, sampling: SamplingParams, generator: torch.Generator) -> DraftParts:
        """What the drafter table's factories build a drafter from."""
        return DraftParts(
            cfg,
            self.draft_lm,
            sampling,
            generator,
            self.stop_ids,
            self._draft_side_stops(),
            METHODS[cfg.method].full_drafts,
        )

    def _check_rollback(self, cfg: DecodeConfig) -> None:
        """Speculation rolls caches back (rejected drafts): refuse it up front for a model whose cache cannot
        be (loosespec.decode.kv), instead of failing at the first rejection."""
        method = METHODS[cfg.method]
        if cfg.drafter is None and not method.step_level:
            return  # ar: the cache only grows
        lms = [(self.target, self.target_lm)]
        if needs_draft_model(cfg.method, cfg.drafter):
            lms.append((self.draft, self.draft_lm))
        for loaded, lm in lms:
            problem = lm.rollback_problem
            if problem:
                raise LoosespecError(
                    f"method '{cfg.method}' cannot run on '{loaded.name}': {problem}; "
                    "method 'ar' can (it never rolls back)"
                )

    def _cost_aware(self, drafter, cfg: DecodeConfig, generator: torch.Generator):
        """The drafter behind the cost-aware draft length (loosespec.decode.draftlen), priced by the cost curves:
        one level for the drafter, and, before it, one per cheaper drafter its table entry lists (MLA's: the
        lookup alone, or the draft model), where the draft shares the target's tokenizer."""
        from loosespec.decode.draftlen import (
            MODEL_PRIOR_MEAN,
            AcceptanceEstimate,
            CostAwareDrafter,
            DraftLengthPolicy,
            Level,
            LoosePrices,
        )

        # one curve per model for every K up to 15 (FLy's), so methods in one run price alike
        target_cost = self.cost_curve("target", max(cfg.num_draft_tokens + 1, 16))
        k = cfg.num_draft_tokens
        entry = DRAFTERS[cfg.drafter]

        # a loose rule's deferrals are priced too (FLy): one estimate shared by the levels, as the gate is the target's
        shared = (
            LoosePrices(cfg.fly_window_size, cfg.fly_boundary, cfg.num_draft_tokens)
            if METHODS[cfg.method].loose_window
            else None
        )

        def loose():
            return shared

        if not entry.needs_draft_model:  # a free level: drafting costs no forward
            return CostAwareDrafter(
                [Level(entry.level, drafter, DraftLengthPolicy(target_cost, 0.0, k, loose=loose()))]
            )
        draft_lm = self.draft_lm
        draft_lm.cost = self.cost_curve("draft", cfg.mla_lookup_tokens + 1)
        # a forward per drafted token until the first rounds say otherwise
        model = Level(
            entry.level,
            drafter,
            DraftLengthPolicy(
                target_cost, draft_lm.cost(1), k, AcceptanceEstimate(k, prior_mean=MODEL_PRIOR_MEAN), loose=loose()
            ),
            draft_lm,
        )
        if self.bridge is not None:  # the cheaper levels work in the target's ids: not across tokenizers
            return CostAwareDrafter([model])
        parts = self._draft_parts(cfg, SamplingParams(0.0), generator)  # the cheaper levels are free lookups
        cheaper = [
            Level(
                DRAFTERS[name].level, DRAFTERS[name].build(parts), DraftLengthPolicy(target_cost, 0.0, k, loose=loose())
            )
            for name in entry.levels
        ]
        return CostAwareDrafter([*cheaper, model])

    def _draft_side_stops(self) -> frozenset[int]:
        """End tokens in the ids the draft model works in (its own across tokenizers)."""
        return self.draft_stop_ids if self.bridge is not None else self.stop_ids

    def intersection(self) -> VocabIntersection:
        """The vocabulary draft and target share (built on first use; a draft of another tokenizer only)."""
        if self._intersection is None:
            self._intersection = VocabIntersection.between(
                self.tokenizer, self.draft.tokenizer, _output_rows(self.target.model), _output_rows(self.draft.model)
            )
            if len(self._intersection) == 0:
                raise LoosespecError(
                    f"draft '{self.draft.name}' and target '{self.target.name}' share no token: "
                    "rejection sampling across them is impossible; use --temperature 0 or "
                    "--drafter ngram"
                )
        return self._intersection

    def config_dict(self, cfg: DecodeConfig, raw: bool) -> dict:
        """Everything needed to reproduce a run."""
        import transformers

        def model_info(m: LoadedModel | None):
            if m is None:
                return None
            info = {
                "spec": m.source.spec,
                "kind": m.source.kind,
                "revision": m.source.revision,
                "dtype": str(next(m.model.parameters()).dtype).replace("torch.", ""),
            }
            if m.source.requested_revision is not None:  # --revision, as asked (a branch, tag or commit)
                info["requested_revision"] = m.source.requested_revision
            return info

        from loosespec.hardware import describe_device

        def precision(m: LoadedModel | None, lm):
            if m is None or m.precision is None:
                return None
            forward = getattr(lm, "settings", None)  # a forward llama.cpp runs: its settings
            return {**m.precision.to_dict(), **({"forward": forward} if forward else {})}

        return {
            **cfg.to_dict(),
            "target": model_info(self.target),
            "draft": model_info(self.draft),
            "precision": precision(self.target, self.target_lm),
            "draft_precision": precision(self.draft, self.draft_lm),
            "hardware": describe_device(self.device),
            "device": str(self.device),
            "raw": raw,
            "cache_implementation": self.cache_implementation,
            "compile": self.compile,
            "loosespec": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        }

    def stream(self, prompt: str | Sequence[dict] | torch.Tensor, cfg: DecodeConfig, raw: bool = False) -> Generation:
        cfg = cfg.resolved(self.draft_lm is not None)  # the drafter and K, where unset, for the models loaded
        if isinstance(prompt, torch.Tensor) or hasattr(prompt, "keys") and "input_ids" in prompt:
            ids = prompt_tensor(prompt)  # on any device, [P] or [1, P]
        else:
            ids = encode_prompt(self.tokenizer, prompt, raw)
        if ids.numel() == 0:
            raise LoosespecError("empty prompt")
        return Generation(self, ids, cfg, self.config_dict(cfg, raw))

    def generate(
        self, prompt: str | Sequence[dict] | torch.Tensor | list, cfg: DecodeConfig | None = None, raw: bool = False
    ) -> GenerationResult | list[GenerationResult]:
        """``prompt``'s completion under ``cfg`` (None: ``DecodeConfig()``). A list of prompts (strings, chats'
        message lists, token id tensors) gives a list of results, in order: the prompts run one after another,
        not as a batch, each as it would alone (a run's seed is the config's, not advanced between prompts)."""
        cfg = DecodeConfig() if cfg is None else cfg
        if isinstance(prompt, (list, tuple)) and not any(
            isinstance(p, Mapping) and "input_ids" not in p for p in prompt
        ):
            return [self.stream(p, cfg, raw).result() for p in prompt]  # not one chat's messages: several prompts
        return self.stream(prompt, cfg, raw).result()
