"""loosespec from ``model.generate``: a transformers ``custom_generate`` decoding method.

Two ways in, one decode loop (loosespec's :class:`~loosespec.decode.engine.Engine` on the caller's own models)::

    from loosespec.integrations.hf import generate as loosespec_generate

    out = model.generate(**inputs, custom_generate=loosespec_generate, assistant_model=draft,
                         method="fly", fly_window_size=6, fly_entropy_threshold=0.3, max_new_tokens=128)
    out = model.generate(**inputs, custom_generate="build/hf_custom_generate", trust_remote_code=True,
                         assistant_model=draft, method="exact", max_new_tokens=128)

The second is the Hub repository layout (``custom_generate/generate.py``) that ``make hf-custom-generate``
writes (:func:`loosespec.integrations.hf_hub.write_hub_layout`); its ``generate.py`` imports this module, so loosespec must be installed.

Methods (``method=``, the registry :mod:`loosespec.methods`): ``ar``, ``exact``, ``rejection`` are lossless;
**``fly`` (loose verification) and ``specguard`` (step-level verification) are LOSSY**: their output differs from
what the model alone would write, and their results say so (``decode_config["lossy"]``). Drafting: the
``assistant_model`` (``drafter`` ``model``, or ``mla`` by default), or n-gram prompt lookup (``ngram``, the default
without an assistant). Every other loosespec knob is a keyword argument under its schema name
(:data:`loosespec.config.KNOBS`: ``fly_window_size``, ``num_draft_tokens``, ``sg_tau``, ...), validated there, so
a bad value is refused with the knob's name.

From the caller's ``GenerationConfig`` (and ``generate``'s keyword arguments): ``max_new_tokens`` / ``max_length``,
``do_sample`` with ``temperature``, ``top_p``, ``top_k`` (transformers' defaults apply: top-k 50 when sampling),
``eos_token_id`` (generation ends at these, exactly as ``generate`` ends), ``pad_token_id`` (a left-padded prompt
keeps its padding in the output), ``streamer``, ``return_dict_in_generate`` (a :class:`LoosespecGenerateOutput`,
a ``GenerateDecoderOnlyOutput`` with loosespec's statistics). Sampling draws loosespec's ``seed`` from torch's
global generator unless ``seed=`` is given, so ``torch.manual_seed`` reproduces a run as it does for ``generate``.
What loosespec cannot honour (a batch of several prompts, beams, ``num_return_sequences`` > 1, logits processors
such as ``repetition_penalty``, ``output_scores``, ``stop_strings``, ...) is refused before decoding, with a
one-line :class:`GenerateArgumentError` naming the argument.

How transformers (5.2x) calls a ``custom_generate`` *callable*: as the decoding method, after preparing the
generation config, ``generate(model, input_ids, logits_processor=, stopping_criteria=, generation_config=,
**model_kwargs)``, plus those of ``generate``'s extra keyword arguments that the callable declares by name
(hence the knobs in this function's signature, derived from the schema). ``assistant_model`` and ``streamer``
are parameters of ``generate`` itself and ``tokenizer`` / ``assistant_tokenizer`` are popped before that step:
none of them reaches the callable, declared or not. loosespec reads ``assistant_model`` and ``streamer`` from
the running ``generate`` call's frame (:func:`_generate_call`) and loads each model's tokenizer from its
``name_or_path``. A *directory* instead is loaded and called in place of ``generate`` with every argument; its
``generate`` comes here and re-enters ``generate`` with this callable, carrying ``tokenizer`` and
``assistant_tokenizer`` along, so both ways share one preparation.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import sys
import weakref
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from loosespec.config import KNOBS, ConfigError, DecodeConfig, validate_knob
from loosespec.drafters import default_drafter, drafter_needs_draft_model
from loosespec.errors import LoosespecError
from loosespec.methods import METHODS

# knobs that come from the caller's GenerationConfig (transformers' names), not from keyword arguments; the stop
# strings would be generate's `stop_strings`, whose semantics differ (refused below)
FROM_GENERATION_CONFIG = ("max_new_tokens", "temperature", "top_p", "top_k", "stop")
# every other knob is a keyword argument of the custom_generate callable, under the schema's name
KNOB_KWARGS: tuple[str, ...] = tuple(n for n in KNOBS if n not in FROM_GENERATION_CONFIG)

# GenerationConfig fields loosespec does not implement, with the values that leave them off
_OFF: dict[str, tuple] = {
    "num_beams": (None, 1),
    "num_return_sequences": (None, 1),
    "num_beam_groups": (None, 1),
    "diversity_penalty": (None, 0.0),
    "penalty_alpha": (None, 0.0),
    "constraints": (None,),
    "force_words_ids": (None,),
    "dola_layers": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "max_time": (None,),
    "stop_strings": (None,),
    "min_p": (None,),
    "top_h": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
    "output_scores": (None, False),
    "output_logits": (None, False),
    "output_attentions": (None, False),
    "output_hidden_states": (None, False),
    "token_healing": (None, False),
    "assistant_early_exit": (None,),
    "use_mtp": (None, False),
}
_WHY = {
    "num_beams": "loosespec decodes one sequence, without beam search",
    "num_return_sequences": "loosespec returns one sequence per prompt",
    "num_beam_groups": "beam search is not supported",
    "diversity_penalty": "beam search is not supported",
    "output_scores": "loosespec returns sequences and statistics, not per-step scores",
    "output_logits": "loosespec returns sequences and statistics, not per-step logits",
    "output_attentions": "loosespec returns sequences and statistics, not attentions",
    "output_hidden_states": "loosespec returns sequences and statistics, not hidden states",
    "stop_strings": "end the generation with eos_token_id instead",
    "assistant_early_exit": "loosespec drafts with assistant_model or n-gram lookup",
}
# transformers' speculative decoding fields, when the caller set them (not transformers' defaults): the loosespec knob
# each is, and whether it drafts with the assistant_model (True), by prompt lookup (False) or either (None)
_ASSISTED_FIELDS: dict[str, tuple[str, bool | None]] = {
    "prompt_lookup_num_tokens": ("num_draft_tokens", False),
    "num_assistant_tokens": ("num_draft_tokens", True),
    "max_matching_ngram_size": ("prompt_lookup_max", None),
}
# ... and those with no loosespec equivalent, refused when set
_ASSISTED_REFUSED = {
    "assistant_confidence_threshold": "transformers adapts it as the assistant drafts; loosespec's draft model stops "
    "below a fixed top probability, draft_confidence_threshold= (drafter='model')",
}
# what transformers' own preparation adds to the lists it passes, for what loosespec does honour
_HONOURED_PROCESSORS = (
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "InfNanRemoveLogitsProcessor",
    "LogitNormalization",
)
_HONOURED_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")
# model inputs transformers prepares for every decoder-only generation: loosespec keeps its own cache
_PREPARED_INPUTS = (
    "attention_mask",
    "position_ids",
    "past_key_values",
    "use_cache",
    "logits_to_keep",
    "cache_position",
)

# tokenizers handed over by the directory entry (generate's `tokenizer`, `assistant_tokenizer`)
_TOKENIZERS: contextvars.ContextVar[tuple] = contextvars.ContextVar("loosespec_hf_tokenizers", default=(None, None))
_LOADED_TOKENIZERS: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()


class GenerateArgumentError(LoosespecError, ValueError):
    """An argument of ``model.generate`` loosespec cannot honour; the message names it, on one line."""


@dataclasses.dataclass
class LoosespecGenerateOutput(GenerateDecoderOnlyOutput):
    """``generate``'s output with ``return_dict_in_generate=True``, plus loosespec's run record.

    ``stats``: :meth:`loosespec.decode.stats.Stats.to_dict` (new tokens, rounds, target and draft forwards,
    drafted and accepted tokens, mean accepted length, acceptance rate, wall time, the method's counters);
    ``decode_config``: the method, drafter and every knob, ``lossy`` among them (true for ``fly`` and
    ``specguard``); ``finish_reason``: ``stop`` (an end token) or ``length``.
    """

    stats: dict | None = None
    decode_config: dict | None = None
    finish_reason: str | None = None


def generate(model, input_ids=None, logits_processor=None, stopping_criteria=None, generation_config=None, **kwargs):
    """loosespec's decode loop as ``model.generate``'s ``custom_generate`` (see the module docstring).

    Keyword arguments: ``method`` (``ar``, ``exact``, ``rejection``; ``fly`` and ``specguard`` are LOSSY),
    ``drafter`` and every knob of :data:`loosespec.config.KNOBS` except those the ``GenerationConfig`` carries.
    Returns the prompt and new tokens ``[1, P + N]``, or a :class:`LoosespecGenerateOutput`.
    """
    if "inputs" in kwargs and "assistant_model" in kwargs:  # a directory's generate.py: called instead of generate
        return _reenter(model, input_ids, logits_processor, stopping_criteria, generation_config, kwargs)
    return _decode(model, input_ids, logits_processor, stopping_criteria, generation_config, kwargs)


# transformers forwards to a callable only the keyword arguments it declares by name: declare every knob
_P = inspect.Parameter
generate.__signature__ = inspect.Signature(
    [
        _P("model", _P.POSITIONAL_OR_KEYWORD),
        *(
            _P(n, _P.POSITIONAL_OR_KEYWORD, default=None)
            for n in ("input_ids", "logits_processor", "stopping_criteria", "generation_config")
        ),
        *(_P(n, _P.KEYWORD_ONLY, default=None) for n in KNOB_KWARGS),
        _P("kwargs", _P.VAR_KEYWORD),
    ]
)


def _reenter(model, input_ids, logits_processor, stopping_criteria, generation_config, arguments: dict):
    """The Hub-layout entry: transformers calls a directory's ``generate`` with all of ``generate``'s arguments
    instead of ``generate``. Run ``generate`` itself with this callable, so both ways share its preparation."""
    arguments = dict(arguments)
    if input_ids is not None:
        arguments["input_ids"] = input_ids
    token = _TOKENIZERS.set((arguments.pop("tokenizer", None), arguments.pop("assistant_tokenizer", None)))
    try:
        return GenerationMixin.generate(
            model,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            custom_generate=generate,
            **arguments,
        )
    finally:
        _TOKENIZERS.reset(token)


def _generate_call() -> dict:
    """The running ``generate`` call's arguments that transformers does not pass to a custom_generate callable
    (``assistant_model``, ``streamer``, and the caller's own processors): read from its frame."""
    f = sys._getframe(1)
    while f is not None:
        loc = f.f_locals
        if loc.get("custom_generate") is generate and "assistant_model" in loc and "streamer" in loc:
            return loc
        f = f.f_back
    raise GenerateArgumentError(
        "loosespec's generate is a custom_generate method: call model.generate(..., custom_generate=generate) "
        f"(transformers {_transformers_version()} did not show generate's arguments to it)"
    )


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _decode(model, input_ids, logits_processor, stopping_criteria, generation_config, kwargs: dict):
    call = _generate_call()
    assistant = call.get("assistant_model")
    streamer = call.get("streamer")
    knobs = {k: kwargs.pop(k) for k in KNOB_KWARGS if k in kwargs}
    knobs = {k: v for k, v in knobs.items() if v is not None}
    _check_arguments(model, input_ids, generation_config, logits_processor, stopping_criteria, call, kwargs)
    prompt = _prompt(input_ids, kwargs.get("attention_mask"))  # a left padding stays in the output, as in generate
    max_new = int(generation_config.max_length) - int(input_ids.shape[1])
    if max_new < 1:
        raise GenerateArgumentError(
            f"max_length={generation_config.max_length} leaves no room after the "
            f"{input_ids.shape[1]}-token prompt; set max_new_tokens"
        )
    _assisted_fields(model, generation_config, knobs, assistant is not None)
    cfg = _decode_config(model, generation_config, knobs, assistant is not None, max_new)
    engine = _engine(model, assistant, cfg, generation_config)
    gen = engine.stream(prompt, cfg)
    try:
        for chunk in gen:
            if streamer is not None and chunk.token_ids:
                streamer.put(torch.tensor(chunk.token_ids, dtype=torch.long))
    finally:
        if streamer is not None:
            streamer.end()
    result = gen.result()
    new = torch.tensor(result.token_ids, dtype=torch.long, device=input_ids.device)
    sequences = torch.cat([input_ids[0], new]).unsqueeze(0)
    if not generation_config.return_dict_in_generate:
        return sequences
    return LoosespecGenerateOutput(
        sequences=sequences,
        stats=result.stats.to_dict(),
        decode_config=cfg.to_dict(),
        finish_reason=result.finish_reason,
    )


def _check_arguments(model, input_ids, gc, logits_processor, stopping_criteria, call: dict, model_kwargs: dict):
    """Refuse, before decoding and by name, what loosespec would otherwise silently ignore."""
    if input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise GenerateArgumentError("input_ids: loosespec's generate needs the prompt's token ids, [1, length]")
    if model.config.is_encoder_decoder:
        raise GenerateArgumentError(
            f"{type(model).__name__} is an encoder-decoder model; loosespec decodes causal "
            "(decoder-only) language models"
        )
    for name, off in _OFF.items():  # first: beams and num_return_sequences also multiply the batch
        value = getattr(gc, name, None)
        if not any(value is o or (o is not None and value == o) for o in off):
            why = _WHY.get(name, "loosespec does not implement it")
            raise GenerateArgumentError(
                f"{name}={value!r}{_origin(model, name, value)} is not supported by loosespec's "
                f"custom_generate ({why}); pass {name}={off[-1]!r}"
            )
    if input_ids.shape[0] != 1:
        raise GenerateArgumentError(
            f"input_ids: batch size {input_ids.shape[0]} is not supported, loosespec decodes "
            "one prompt at a time; call generate once per prompt"
        )
    for name in ("prefix_allowed_tokens_fn", "negative_prompt_ids", "negative_prompt_attention_mask"):
        if call.get(name) is not None:
            raise GenerateArgumentError(f"{name} is not supported by loosespec's custom_generate")
    for name in ("logits_processor", "stopping_criteria"):
        if call.get(name):  # the caller's own list, before transformers added its own
            raise GenerateArgumentError(
                f"{name}: loosespec's custom_generate cannot apply the caller's "
                f"{', '.join(type(p).__name__ for p in call[name])}"
            )
    for p in logits_processor or ():
        if type(p).__name__ not in _HONOURED_PROCESSORS:
            raise GenerateArgumentError(
                f"logits processor {type(p).__name__} (from the generation config) is not "
                "supported by loosespec's custom_generate"
            )
    for c in stopping_criteria or ():
        if type(c).__name__ not in _HONOURED_CRITERIA:
            raise GenerateArgumentError(
                f"stopping criterion {type(c).__name__} (from the generation config) is not "
                "supported by loosespec's custom_generate"
            )
    cache = model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise GenerateArgumentError(
            "past_key_values: loosespec keeps its own KV cache; pass the whole prompt without a cache"
        )
    for name, value in model_kwargs.items():
        if name not in _PREPARED_INPUTS and value is not None:
            raise GenerateArgumentError(
                f"{name}: loosespec's custom_generate decodes from input_ids alone and cannot pass {name} to the model"
            )


def _transformers_default(name: str):
    """transformers' default for a GenerationConfig field: what ``generate`` fills in when nobody set it."""
    from transformers import GenerationConfig

    fill = getattr(GenerationConfig, "_get_default_generation_params", None)  # transformers 5: None until generate
    default = getattr(GenerationConfig(), name, None)
    return fill().get(name, default) if fill is not None and default is None else default


def _assisted_fields(model, gc, knobs: dict, has_draft: bool) -> None:
    """transformers' speculative decoding fields the caller set, as loosespec's knobs (into ``knobs``): refused by
    name where loosespec has no equivalent, the other drafter is asked for, or a knob passed under loosespec's name
    says otherwise."""
    for name, why in _ASSISTED_REFUSED.items():
        value = getattr(gc, name, None)
        if value is not None and value != _transformers_default(name):
            raise GenerateArgumentError(
                f"{name}={value!r}{_origin(model, name, value)} is not supported by loosespec's custom_generate "
                f"({why}); leave it at {_transformers_default(name)!r}"
            )
    how = {True: "with the assistant_model", False: "by n-gram prompt lookup"}
    set_by: dict[str, str] = {}  # knob -> the field that set it
    drafter_by = None  # the field that chose the drafter
    for name, (knob, assisted) in _ASSISTED_FIELDS.items():
        value = getattr(gc, name, None)
        if value is None or value == _transformers_default(name):
            continue
        where = f"{name}={value!r}{_origin(model, name, value)}"
        if assisted and not has_draft:
            raise GenerateArgumentError(f"{where} drafts with assistant_model: pass assistant_model=<a smaller model>")
        if assisted is not None:
            drafter = knobs.get("drafter")
            if drafter is None and drafter_needs_draft_model(default_drafter(has_draft)) != assisted:
                drafter = knobs["drafter"] = default_drafter(assisted)
                drafter_by = where
            if drafter is not None and drafter_needs_draft_model(drafter) != assisted:
                other = drafter_by or f"drafter={drafter!r}"
                raise GenerateArgumentError(f"{where} drafts {how[assisted]}, {other} {how[not assisted]}: give one")
        try:
            value = validate_knob(knob, value)
        except ConfigError as e:
            raise GenerateArgumentError(f"{where}: as loosespec's {e.render('field')}") from None
        if knobs.get(knob, value) != value:
            raise GenerateArgumentError(f"{where} and {set_by.get(knob, knob)}={knobs[knob]!r}: give one")
        knobs[knob], set_by[knob] = value, name


def _origin(model, name: str, value) -> str:
    """Where a refused value comes from, when the caller did not pass it: the model's generation_config."""
    return " (the model's generation_config)" if getattr(model.generation_config, name, None) == value else ""


def _prompt(input_ids: torch.Tensor, attention_mask) -> torch.Tensor:
    """The prompt's ids on the CPU ([P]) without its left padding."""
    ids = input_ids[0].cpu()
    if attention_mask is None:
        return ids
    mask = attention_mask[0].cpu().bool()
    if mask.shape != ids.shape:
        raise GenerateArgumentError(
            f"attention_mask of shape {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}"
        )
    pad = int((~mask).long().cumprod(0).sum())  # leading masked positions
    if not bool(mask[pad:].all()) or pad == ids.shape[0]:
        raise GenerateArgumentError(
            "attention_mask: only left padding is supported (masked positions before the "
            "prompt, none inside or after it)"
        )
    return ids[pad:]


def _decode_config(model, gc, knobs: dict, has_draft: bool, max_new: int) -> DecodeConfig:
    """The DecodeConfig a call asks for: sampling and length from the generation config, the rest from knobs."""
    sample = bool(gc.do_sample)
    method = knobs.pop("method", None) or ("rejection" if sample else "exact")
    spec = METHODS.get(method)  # an unknown name: DecodeConfig.create says so
    if sample and spec is not None and spec.greedy_only:
        raise GenerateArgumentError(
            f"do_sample=True{_origin(model, 'do_sample', True)} with method={method!r}, which "
            "is greedy: pass do_sample=False, or sample with method='rejection' (lossless) or "
            "'fly'"
        )
    sampling = dict(temperature=0.0, top_p=1.0, top_k=0)
    if sample:
        sampling = dict(
            temperature=1.0 if gc.temperature is None else float(gc.temperature),
            top_p=1.0 if gc.top_p is None else float(gc.top_p),
            top_k=int(gc.top_k or 0),
        )
        if "seed" not in knobs:  # torch.manual_seed before generate reproduces the run, as it does for generate
            knobs["seed"] = int(torch.randint(0, 2**62, (1,)).item())
    drafter = knobs.pop("drafter", None)
    if not has_draft and spec is not None and spec.needs_draft_model:
        raise GenerateArgumentError(
            f"method={method!r} drafts whole steps with a draft model: pass assistant_model=<a smaller model>"
        )
    if not has_draft and drafter_needs_draft_model(drafter):
        raise GenerateArgumentError(
            f"drafter={drafter!r} drafts with a draft model: pass assistant_model=<a smaller "
            "model>, or use drafter='ngram'"
        )
    return DecodeConfig.create(
        method,
        drafter,
        knobs.pop("num_draft_tokens", None),
        has_draft_model=has_draft,
        max_new_tokens=max_new,
        **sampling,
        **knobs,
    )


class _NoTokenizer:
    """Stands in for a tokenizer loosespec could not load: token ids only (no text, which this entry returns
    none of anyway; no chat template, the caller's ``input_ids`` are already formatted)."""

    eos_token_id = None
    backend_tokenizer = None
    chat_template = None

    def get_vocab(self) -> dict:
        return {}

    def decode(self, ids, **kw) -> str:
        return ""


def _tokenizer(model, given):
    """``given``, else the tokenizer in the model's directory or local Hugging Face cache, else None."""
    if given is not None:
        return given
    if model in _LOADED_TOKENIZERS:
        return _LOADED_TOKENIZERS[model]
    tok = None
    path = getattr(model, "name_or_path", "") or ""
    if path:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception:  # no tokenizer files there: token ids only
            tok = None
        finally:
            hf_logging.set_verbosity(level)
    _LOADED_TOKENIZERS[model] = tok
    return tok


def _width(model) -> int:
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


def _loaded(model, tokenizer):
    from loosespec.models import LoadedModel, ModelSource

    path = getattr(model, "name_or_path", "") or ""
    # a forward's cost depends on the architecture, size, precision and machine, not on the weights: an unnamed
    # model's cost curve (loosespec.cost) is keyed by its class and size
    spec = path or f"{type(model).__name__}-{sum(p.numel() for p in model.parameters())}"
    revision = getattr(model.config, "_commit_hash", None) or "in-memory"
    return LoadedModel(ModelSource(spec, "transformers", path, revision), model, tokenizer)


def _engine(model, assistant, cfg: DecodeConfig, gc):
    """loosespec's engine on the caller's models, ending where generate ends (the config's eos_token_id)."""
    from loosespec.decode.engine import Engine

    given_target, given_draft = _TOKENIZERS.get()
    tok = _tokenizer(model, given_target)
    draft_tok = _tokenizer(assistant, given_draft) if assistant is not None else None
    if assistant is not None and (tok is None or draft_tok is None):
        if _width(assistant) != _width(model):
            raise GenerateArgumentError(
                f"assistant_model has another vocabulary ({_width(assistant)} tokens, the model {_width(model)}): "
                "drafting across tokenizers needs both tokenizers, and loosespec found none for "
                f"{'the model' if tok is None else 'assistant_model'} (it loads them from name_or_path)"
            )
        tok = draft_tok = tok or draft_tok  # one vocabulary: one tokenizer for both, as generate assumes
    needs_text = METHODS[cfg.method].step_level  # steps end at a delimiter in the text
    if tok is None and needs_text:
        raise GenerateArgumentError(
            f"method={cfg.method!r} finds steps in text and needs the model's tokenizer; "
            "loosespec found none (it loads it from the model's name_or_path)"
        )
    tok = tok if tok is not None else _NoTokenizer()
    engine = Engine(_loaded(model, tok), _loaded(assistant, draft_tok or tok) if assistant is not None else None)
    eos = gc.eos_token_id
    engine.stop_ids = frozenset([] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return engine
