"""vLLM's ``speculative_config`` in loosespec's knobs, and back: the one table between the two spellings.

A vLLM user writes ``--speculative-config '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max":
4}'`` or ``{"method": "draft_model", "model": "PATH_OR_ID", "num_speculative_tokens": 8, "rejection_sample_method":
"fly", "fly_window_size": 5}``; ``loosespec generate``, ``bench`` and ``serve`` take the same JSON
(``--speculative-config``), and the server the same object in a request (``speculative_config``).

The two spellings differ where the words do: vLLM's ``method`` is the proposer, loosespec's ``drafter``
(:data:`VLLM_METHODS`); vLLM's ``rejection_sample_method`` is the acceptance rule, loosespec's ``method``
(:data:`VLLM_REJECTION_SAMPLE_METHODS`); vLLM's ``model`` is the draft model (``--draft``). The other keys are
loosespec's knobs under vLLM's names, with vLLM's meanings (:data:`VLLM_KEYS`; ``fly_window_size`` counts the
positions after a mismatch in both). A key left out takes loosespec's default, not vLLM's (FLy's ``fly_preset``,
the drafter's draft length).

:func:`from_vllm` reads a ``speculative_config`` (refusing, by name, a key or a proposer loosespec does not have),
:func:`merge` puts its knobs with the ones given by loosespec's own names (a knob given both ways with two values is
refused, naming both), :func:`to_vllm` writes loosespec's knobs as vLLM's keys (what
:func:`loosespec.integrations.vllm.native.native_fly_config` passes to vLLM's native FLy).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from loosespec.config import ConfigError, validate_knob
from loosespec.methods import LOSSY_METHODS

# vLLM's key -> loosespec's knob: the same value, the same meaning
VLLM_KEYS: dict[str, str] = {
    "num_speculative_tokens": "num_draft_tokens",
    "prompt_lookup_max": "prompt_lookup_max",
    "prompt_lookup_min": "prompt_lookup_min",
    "fly_window_size": "fly_window_size",
    "fly_entropy_threshold": "fly_entropy_threshold",
    "fly_entropy_top_k": "fly_entropy_top_k",
}
# vLLM's method (the proposer) -> loosespec's drafter (loosespec.drafters.DRAFTERS); vLLM's others (eagle, eagle3,
# medusa, mtp, suffix, ...) have no loosespec drafter
VLLM_METHODS: dict[str, str] = {"ngram": "ngram", "draft_model": "model"}
# vLLM's rejection_sample_method (the acceptance rule) -> loosespec's method (loosespec.methods.METHODS); None:
# loosespec's default, a lossless one (vLLM's standard rejection sampling is lossless)
VLLM_REJECTION_SAMPLE_METHODS: dict[str, str | None] = {"standard": None, "fly": "fly"}
DRAFT_MODEL_KEY = "model"  # the draft model: loosespec's --draft
ACCEPTED_KEYS: tuple[str, ...] = ("method", DRAFT_MODEL_KEY, "rejection_sample_method", *VLLM_KEYS)
HELP = (
    "vLLM's speculative_config, as JSON: loosespec accepts the keys "
    + ", ".join(ACCEPTED_KEYS)
    + ". method: "
    + ", ".join(f"{k} (drafter {v})" for k, v in VLLM_METHODS.items())
    + "; model: the draft model (--draft); rejection_sample_method: standard (the default method) or fly (method "
    "fly, LOSSY); num_speculative_tokens is --num-draft-tokens, the others keep their names and vLLM's meanings. "
    "Keys left out take loosespec's defaults; an option also given with another value is an error."
)


class SpeculativeConfigError(ConfigError):
    """A bad ``speculative_config``; ``field`` is ``speculative_config.<key>``. ``{speculative_config}`` in the message
    is spelled for the reader: ``--speculative-config`` on the command line, ``speculative_config`` elsewhere."""

    def render(self, style: str = "field") -> str:
        values = self.values
        self.values = {
            **values,
            "speculative_config": "--speculative-config" if style == "cli" else "speculative_config",
        }
        try:
            return super().render(style)
        finally:
            self.values = values


@dataclass
class VllmSpec:
    """A ``speculative_config`` read: loosespec's knobs (``DecodeConfig`` keywords), the draft model it names (None:
    none), and whether it asked for vLLM's standard (lossless) rejection sampling by name."""

    knobs: dict[str, Any] = field(default_factory=dict)
    draft: str | None = None
    lossless: bool = False
    keys: dict[str, str] = field(default_factory=dict)  # knob -> the vLLM key it came from (for messages)


def _error(where: str, template: str, /, **values) -> SpeculativeConfigError:
    """The error at ``speculative_config.<where>``; ``values`` fill ``template`` (``key`` among them)."""
    return SpeculativeConfigError(f"speculative_config.{where}", template, **values)


def _choice(key: str, value, table: Mapping[str, Any], vllm_note: str):
    if not isinstance(value, str) or value not in table:
        raise _error(
            key,
            "{speculative_config} {key} {value!r} {note}; loosespec accepts: {accepted}",
            key=key,
            value=value,
            note=vllm_note,
            accepted=", ".join(table),
        )
    return table[value]


def from_vllm(spec: str | Mapping[str, Any]) -> VllmSpec:
    """``spec`` (a JSON object, or its text) as loosespec's knobs; :class:`SpeculativeConfigError` names a key
    loosespec does not take, a value it does not have (an EAGLE or MTP proposer, a synthetic rejection sampler), a
    bad value (under vLLM's name)."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SpeculativeConfigError(
                "speculative_config", "{speculative_config} is not valid JSON ({why})", why=str(e)
            ) from None
    if not isinstance(spec, Mapping):
        raise SpeculativeConfigError(
            "speculative_config",
            "{speculative_config} must be a JSON object such as {example}, got {got!r}",
            example='{"method": "ngram", "num_speculative_tokens": 5}',
            got=spec,
        )
    for key in spec:
        if key not in ACCEPTED_KEYS:
            raise _error(
                str(key),
                "{speculative_config} key {key!r} has no loosespec equivalent; loosespec accepts: {accepted}",
                key=key,
                accepted=", ".join(ACCEPTED_KEYS),
            )
    out = VllmSpec()
    draft = spec.get(DRAFT_MODEL_KEY)
    if draft is not None:
        if not isinstance(draft, str) or not draft.strip():
            raise _error(DRAFT_MODEL_KEY, "{speculative_config} model must be a model name or path, got {v!r}", v=draft)
        out.draft = draft
    proposer = spec.get("method")
    if proposer is None and draft is not None:
        proposer = "draft_model"  # vLLM's proposer for a model given without a method
    if proposer is not None:
        out.knobs["drafter"] = _choice("method", proposer, VLLM_METHODS, "is not a proposer loosespec has")
        out.keys["drafter"] = "method"
    rule = spec.get("rejection_sample_method")
    if rule is not None:
        method = _choice("rejection_sample_method", rule, VLLM_REJECTION_SAMPLE_METHODS, "has no loosespec method")
        if method is None:
            out.lossless = True
        else:
            out.knobs["method"], out.keys["method"] = method, "rejection_sample_method"
    for key, knob in VLLM_KEYS.items():
        if spec.get(key) is None:
            continue
        try:
            out.knobs[knob] = validate_knob(knob, spec[key])
        except ConfigError as e:
            why = e.render("field")
            why = why[len(knob) + 1 :] if why.startswith(knob + " ") else why
            raise _error(
                key,
                "{speculative_config} {key} {why}" + ("" if knob == key else " (loosespec's {%s})" % knob),
                key=key,
                why=why,
            ) from None
        out.keys[knob] = key
    return out


def merge(spec: VllmSpec, knobs: Mapping[str, Any], given: Collection[str] | None = None) -> dict:
    """``knobs`` (``DecodeConfig`` keywords) with ``spec``'s: a knob in ``given`` (default: every knob in ``knobs``,
    each set by the caller) with a value other than ``spec``'s is refused, naming both; one not given (a default)
    gives way. vLLM's standard rejection sampling, named, refuses a lossy method given."""
    given = set(knobs) if given is None else set(given)
    out = dict(knobs)
    for knob, value in spec.knobs.items():
        if knob in given and knobs.get(knob) is not None and knobs[knob] != value:
            key = spec.keys.get(knob, knob)
            raise _error(
                key,
                "{speculative_config} {key} is {a!r} but {%s} is {b!r}: give one of them" % knob,
                key=key,
                a=_vllm_value(key, value),
                b=knobs[knob],
            )
        out[knob] = value
    if spec.lossless and "method" in given and knobs.get("method") in LOSSY_METHODS:
        raise _error(
            "rejection_sample_method",
            "{speculative_config} rejection_sample_method 'standard' is lossless but {method} is {m!r}, which is "
            "LOSSY: give one of them",
            m=knobs["method"],
        )
    return out


def _vllm_value(key: str, value):
    """A knob's value as vLLM spells it under ``key`` (the proposer's name for a drafter)."""
    table = {"method": VLLM_METHODS, "rejection_sample_method": VLLM_REJECTION_SAMPLE_METHODS}.get(key)
    return next((k for k, v in table.items() if v == value), value) if table else value


def merge_draft(spec: VllmSpec, draft: str | None, given: bool, option: str = "--draft") -> str | None:
    """The draft model: ``spec``'s (vLLM's ``model``) unless ``draft`` was ``given`` too with another name (an
    error naming both); ``draft`` when ``spec`` names none."""
    if spec.draft is None:
        return draft
    if given and draft is not None and draft != spec.draft:
        raise _error(
            DRAFT_MODEL_KEY,
            "{speculative_config} model is {a!r} but {option} is {b!r}: give one of them",
            a=spec.draft,
            option=option,
            b=draft,
        )
    return spec.draft


def to_vllm(knobs: Mapping[str, Any], draft: str | None = None) -> dict:
    """loosespec's knobs (``DecodeConfig`` keywords; None: unset, left out) as vLLM's ``speculative_config`` keys.
    A knob the table does not name, a drafter vLLM has no proposer for (``mla``) or a method with no
    ``rejection_sample_method`` of vLLM's (``specguard``) is a ValueError naming it; a lossless method is vLLM's
    standard rejection sampling (the key left out)."""
    out: dict[str, Any] = {}
    keys = {knob: key for key, knob in VLLM_KEYS.items()}
    for knob, value in knobs.items():
        if value is None:
            continue
        if knob == "drafter":
            proposer = next((k for k, v in VLLM_METHODS.items() if v == value), None)
            if proposer is None:
                raise ValueError(f"vLLM has no proposer for drafter {value!r}; it has {', '.join(VLLM_METHODS)}")
            out["method"] = proposer
        elif knob == "method":
            rule = next((k for k, v in VLLM_REJECTION_SAMPLE_METHODS.items() if v == value), None)
            if rule is not None:
                out["rejection_sample_method"] = rule
            elif validate_knob("method", value) in LOSSY_METHODS:
                raise ValueError(f"vLLM has no rejection_sample_method for method {value!r}")
        elif knob in keys:
            out[keys[knob]] = validate_knob(knob, value)
        else:
            raise ValueError(f"{knob} has no key in vLLM's speculative_config")
    if draft is not None:
        out[DRAFT_MODEL_KEY] = draft
    return out
