"""The bench's method table: every name ``loosespec bench --methods`` takes, what runs it and whether it is lossy.

Methods (``<method>-<drafter>``): ``ar``; ``exact-``, ``rejection-`` and ``fly-`` with ``ngram``,
``model`` or ``mla``; ``specguard`` (draft-assisted, exact), ``specguard-regenerate`` and
``specguard-fly``; the peers ``hf-ar`` (``generate()``), ``hf-pld``
(``generate(prompt_lookup_num_tokens=10)``) and ``hf-assist`` (``generate(assistant_model=draft)``,
transformers' defaults, in the same precision as loosespec's methods); ``llamacpp-ar`` and
``llamacpp-pld`` (llama.cpp on the target's GGUF file, :mod:`loosespec.eval.peers.llamacpp`); ``vllm-ar``, ``vllm-ngram``, ``vllm-draft``, ``vllm-fly`` and
``vllm-fly-ngram`` served by vLLM with the loosespec plugin (:mod:`loosespec.eval.peers.vllm`; one
``vllm serve`` per method, its prompts in a block, measured against ``vllm-ar``). ``fly-*``,
``vllm-fly*`` and ``specguard*`` are LOSSY and marked so in every result.

A loosespec method also takes knob variants, ``<method>@<knob>=<value>`` (:func:`bench_method`), which
``--sweep`` builds (:func:`sweep_methods`); :func:`method_config` is a method's decoding configuration and
:func:`baseline_of` the method its speedup and accuracy are measured against.

A name is parsed here, once, into a :class:`BenchMethod` holding the registry's objects (its
:class:`~loosespec.methods.Method` and :class:`~loosespec.drafters.DrafterEntry`); what runs it, whether it
needs a draft model, whether it is lossy are read off those objects, never off the name. :data:`BASELINE`
is the bench name of the method that does not speculate (``ar``), listed first and measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from loosespec.config import DecodeConfig, knob_default
from loosespec.drafters import DRAFTERS, DrafterEntry
from loosespec.errors import LoosespecError
from loosespec.methods import BASELINE, Method  # noqa: F401 (BASELINE re-exported: the bench's first row)

HF_GENERATION_KWARGS = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}, "hf-assist": {}}
HF_ASSISTED = ("hf-assist",)  # transformers' assisted generation: runs the draft model, as a transformers model
SPECGUARD_PRESETS = {
    "specguard": {},
    "specguard-regenerate": {"sg_on_reject": "regenerate"},
    "specguard-fly": {"sg_verify": "fly"},
}
STEP_PRESETS = {"specguard": SPECGUARD_PRESETS}  # a step-level method's bench names and their settings


@dataclass(frozen=True)
class BenchMethod:
    """One name ``loosespec bench --methods`` takes: a loosespec method with its drafter (or a SpecGuard
    preset), or a peer. Lossiness comes from the method registry (loosespec.methods), never from the name."""

    name: str
    kind: str  # "loosespec" | "hf" | "llamacpp" | "vllm"
    lossy: bool
    needs_draft: bool  # loosespec's engine must load the draft model for it
    method: Method | None = None  # the loosespec method (the registry's object)
    drafter: DrafterEntry | None = None  # its drafter (None: none, or the method's default)
    overrides: dict = field(default_factory=dict)  # DecodeConfig keywords of a preset
    torch_draft: bool = False  # runs the draft as a transformers model (SpecGuard's attentions, hf-assist)

    @property
    def step_level(self) -> bool:
        """A step-level loosespec method (SpecGuard): it needs the dynamic cache."""
        return self.method is not None and self.method.step_level


_BENCH_METHODS: dict[str, BenchMethod] = {}


def bench_methods() -> dict[str, BenchMethod]:
    """Every bench method name: the registry's token-level methods x drafters, SpecGuard's presets, the peers."""
    if not _BENCH_METHODS:
        from loosespec.eval.peers.llamacpp import LLAMACPP_METHODS, SERVER_METHODS
        from loosespec.eval.peers.vllm import VLLM_METHODS, served
        from loosespec.methods import METHODS

        out = {}
        for m in METHODS.values():
            if not m.speculative:  # the target alone: its own name, no drafter
                out[m.name] = BenchMethod(m.name, "loosespec", m.lossy, False, m)
            elif not m.step_level:  # token-level: one per drafter, <method>-<drafter>
                for d in DRAFTERS.values():
                    name = f"{m.name}-{d.name}"
                    out[name] = BenchMethod(name, "loosespec", m.lossy, d.needs_draft_model, m, d)
            else:  # step-level: its presets (the default drafter drafts the rest of a target's step)
                for name, overrides in STEP_PRESETS.get(m.name, {m.name: {}}).items():
                    out[name] = BenchMethod(
                        name, "loosespec", m.lossy, m.needs_draft_model, m, None, overrides, m.torch_draft
                    )
        for name in HF_GENERATION_KWARGS:
            assisted = name in HF_ASSISTED
            out[name] = BenchMethod(name, "hf", False, assisted, torch_draft=assisted)
        for name in LLAMACPP_METHODS:
            out[name] = BenchMethod(name, "llamacpp", False, False)
        for name in SERVER_METHODS:  # llama.cpp's own speculative decoding with the draft's GGUF
            out[name] = BenchMethod(name, "llamacpp", False, True)
        for name in VLLM_METHODS:  # vLLM's FLy runs loosespec's rule in vLLM: the served method's lossiness
            out[name] = BenchMethod(name, "vllm", served(name)[0].lossy, False)
        out = {BASELINE: out.pop(BASELINE), **out}  # the baseline first
        _BENCH_METHODS.update(out)
    return _BENCH_METHODS


def all_method_names() -> list[str]:
    return list(bench_methods())


VARIANT_SEP = "@"
# what a variant may not change: the run's settings (the same for every method, so that speedup and accuracy
# compare like with like) and what the base name already says
NOT_PER_VARIANT = ("method", "drafter", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")


def bench_method(name: str) -> BenchMethod:
    """A bench method by name: a registered one, or a variant of a loosespec one with knobs set,
    ``<method>@<knob>=<value>[@<knob>=<value>...]`` (e.g. ``fly-ngram@num_draft_tokens=5``,
    ``fly-mla@fly_entropy_threshold=0.6``): the knobs are the decoding configuration's own names,
    validated by its schema. Lossiness is the base method's."""
    from loosespec.config import KNOBS, ConfigError, validate_knob

    known = bench_methods()
    if name in known:
        return known[name]
    base, *parts = name.split(VARIANT_SEP)
    spec = known.get(base)
    if spec is None or not parts:
        raise LoosespecError(
            f"unknown method '{name}'; choose from: {', '.join(known)} "
            f"(or a variant, e.g. fly-ngram{VARIANT_SEP}num_draft_tokens=5)"
        )
    if spec.kind != "loosespec":
        raise LoosespecError(f"'{name}': only loosespec's own methods take knob variants, not the peer '{base}'")
    overrides = dict(spec.overrides)
    for part in parts:
        knob, eq, value = part.partition("=")
        if not eq or knob not in KNOBS or knob in NOT_PER_VARIANT:
            allowed = ", ".join(k for k in KNOBS if k not in NOT_PER_VARIANT)
            raise LoosespecError(f"'{name}': '{part}' is not <knob>=<value> with a per-method knob ({allowed})")
        try:
            overrides[knob] = validate_knob(knob, value)
        except ConfigError as e:
            raise LoosespecError(f"'{name}': {e.render('field')}") from None
    return BenchMethod(
        name, spec.kind, spec.lossy, spec.needs_draft, spec.method, spec.drafter, overrides, spec.torch_draft
    )


def variant_knobs(name: str) -> dict[str, str]:
    """``fly-ngram@num_draft_tokens=5`` -> {"num_draft_tokens": "5"} (as written; {} for a plain name)."""
    return dict(p.partition("=")[::2] for p in name.split(VARIANT_SEP)[1:])


def base_name(name: str) -> str:
    return name.split(VARIANT_SEP)[0]


def sweep_methods(methods: Sequence[str], knob: str, values: Sequence[str]) -> list[str]:
    """``--sweep knob=v1,v2``: each loosespec method but ``ar`` becomes one variant per value (peers stay)."""
    out = []
    for m in methods:
        spec = bench_method(m)
        if spec.kind != "loosespec" or not spec.method.speculative:
            out.append(m)
        else:
            out += [f"{m}{VARIANT_SEP}{knob}={v}" for v in values]
    return out


def parse_methods(spec: str | Sequence[str]) -> list[str]:
    """``"ar,exact-ngram,..."`` -> validated list with ``ar`` first (the speedup baseline)."""
    items = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    for m in items:
        bench_method(m)  # raises, naming the method and what is wrong with it
    if len(set(items)) != len(items):
        raise LoosespecError(f"a method is listed twice in '{','.join(items)}'")
    return [BASELINE] + [m for m in items if m != BASELINE]


def needs_draft_model(method: str) -> bool:
    return bench_method(method).needs_draft


def is_lossy(method: str) -> bool:
    return bench_method(method).lossy


def baseline_of(method: str, methods: Sequence[str]) -> str:
    """The method a method's speedup and accuracy retention are measured against: ``vllm-ar`` for the
    ``vllm-*`` methods when it ran (same server software), ``ar`` otherwise."""
    from loosespec.eval.peers.vllm import VLLM_BASELINE, is_vllm_method

    return VLLM_BASELINE if is_vllm_method(method) and VLLM_BASELINE in methods else BASELINE


def method_config(
    method: str,
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    has_draft: bool,
    sg_tau: float | None = None,
    top_p: float = knob_default("top_p"),
    top_k: int = knob_default("top_k"),
    adaptive_draft_length: bool = knob_default("adaptive_draft_length"),
) -> DecodeConfig | None:
    """The DecodeConfig of a loosespec method (None for the transformers, llama.cpp and vLLM peers)."""
    spec = bench_method(method)
    if spec.kind != "loosespec":
        return None
    common = dict(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        top_p=top_p,
        top_k=top_k,
        has_draft_model=has_draft,
        adaptive_draft_length=adaptive_draft_length,
    )
    tau = {} if sg_tau is None or not spec.method.step_level else {"sg_tau": sg_tau}  # SpecGuard's tau
    drafter = spec.drafter.name if spec.drafter is not None else None
    # a variant's knobs win
    return DecodeConfig.create(spec.method.name, drafter, **{**common, **tau, **spec.overrides})
