"""Request -> (prompt ids, config): :class:`Frontend` checks a request, tokenizes its prompt and builds its
DecodeConfig from the server's defaults and the request's fields."""

from __future__ import annotations

import copy
import logging
import threading
from typing import Optional

import torch

from loosespec.config import ConfigError, DecodeConfig
from loosespec.decode.text import encode_prompt
from loosespec.methods import METHODS, needs_draft_model
from loosespec.serve.protocol import (
    _NAMESPACES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    SAMPLING_EPS,
    ApiError,
    ChatCompletionRequest,
    CommonFields,
    ServerSettings,
    SpecFields,
)
from loosespec.speculative_config import from_vllm, merge

log = logging.getLogger(__name__)

_SPEC_FIELDS = tuple(SpecFields.model_fields)
_UNSUPPORTED = {  # OpenAI field -> its accepted no-op values
    "n": (None, 1),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None,),
    "tool_choice": (None, "none", "auto"),
    "logit_bias": (None,),
}


def context_length(engine) -> int:
    cfg = engine.target.model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return 2048


class Frontend:
    """Validation, tokenization and response building; owns nothing the worker touches."""

    def __init__(self, engine, settings: ServerSettings):
        self.engine = engine
        self.settings = settings
        self.names = {settings.served_model_name, *settings.aliases}
        self.context = context_length(engine)
        self.vocab_size = int(getattr(engine.target.model.config, "vocab_size", 0) or len(engine.tokenizer))
        # the engine's tokenizer belongs to the worker (Rust tokenizers are not safe to share between
        # threads); requests are tokenized with a copy, one at a time, off the event loop
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.tokenizer_lock = threading.Lock()

    # -- checks ---------------------------------------------------------------------------------

    def check_common(self, req: CommonFields) -> None:
        if req.model is not None and req.model not in self.names:
            raise ApiError(
                404,
                f"The model '{req.model}' does not exist; this server serves "
                f"'{self.settings.served_model_name}' (GET /v1/models)",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        for name, ok in _UNSUPPORTED.items():
            value = getattr(req, name)
            if value in ok or (name == "logit_bias" and not value) or (name == "tools" and not value):
                continue
            raise ApiError(
                400, f"'{name}' is not supported by loosespec (got {value!r})", param=name, code="unsupported_parameter"
            )
        if req.response_format is not None and req.response_format.get("type", "text") != "text":
            raise ApiError(
                400,
                "only response_format {'type': 'text'} is supported",
                param="response_format",
                code="unsupported_parameter",
            )
        if req.stream_options is not None and not req.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
        typos = [k for k in (req.model_extra or {}) if k.startswith(_NAMESPACES)]
        if typos:
            raise ApiError(
                400,
                f"unknown parameter '{typos[0]}'; loosespec's parameters are: {', '.join(_SPEC_FIELDS)}",
                param=typos[0],
                code="unknown_parameter",
            )
        if req.stop is not None:
            stop = [req.stop] if isinstance(req.stop, str) else req.stop
            if len(stop) > MAX_STOP_STRINGS:
                raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", param="stop")
            for s in stop:
                if not s:
                    raise ApiError(400, "stop strings must be non-empty", param="stop")
                if len(s) > MAX_STOP_CHARS:
                    raise ApiError(
                        400,
                        f"a stop string may have at most {MAX_STOP_CHARS} characters, got one of {len(s)}",
                        param="stop",
                    )
        if req.fly_entropy_top_k is not None and req.fly_entropy_top_k > self.vocab_size:
            raise ApiError(
                400, f"fly_entropy_top_k must be <= the vocabulary size {self.vocab_size}", param="fly_entropy_top_k"
            )
        if req.model_extra:
            log.debug("ignoring unknown request fields: %s", ", ".join(req.model_extra))

    def request_knobs(self, req: CommonFields) -> dict:
        """The knobs the request sets: its fields, and its speculative_config's (vLLM's spelling, a bad key or a
        value its own fields contradict answered 400 naming the key; its model must be the server's draft)."""
        own = {k: getattr(req, k) for k in _SPEC_FIELDS if getattr(req, k) is not None}
        if req.speculative_config is None:
            return own
        try:
            spec = from_vllm(req.speculative_config)
            own = merge(spec, own)
        except ConfigError as e:
            raise ApiError(400, e.render("field"), param=e.field) from None
        draft = self.engine.draft
        if spec.draft is not None and (draft is None or spec.draft not in (draft.name, draft.source.path)):
            loaded = "has no draft model" if draft is None else f"drafts with {draft.name!r}"
            raise ApiError(
                400,
                f"speculative_config model {spec.draft!r}: this server {loaded} (--draft) and a request cannot load "
                "one; leave model out",
                param="speculative_config.model",
            )
        return own

    def decode_config(self, req: CommonFields, max_new_tokens: int) -> DecodeConfig:
        d = self.settings.defaults
        own = self.request_knobs(req)
        # None (neither names one): exact when greedy, rejection when sampling, by the request's temperature
        method = own.get("method", d.get("method"))
        kw: dict = {}
        # server defaults, then the request's fields; the server's drafter and K only go with its method
        same_method = method == d.get("method")
        for k, v in d.items():
            if k in ("method",) or (k in ("drafter", "num_draft_tokens") and not same_method):
                continue
            kw[k] = v
        kw.update(own)
        kw.pop("method", None)
        if kw.get("drafter") == "none":
            kw["drafter"] = None
        if kw.get("top_k") == -1:  # vLLM's "disabled"
            kw["top_k"] = 0
        if req.stop is not None:  # count and length checked by check_common
            kw["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        temperature = kw.get("temperature")
        if temperature is not None and temperature < SAMPLING_EPS:  # 1e-40 is greedy (as in vLLM), not a NaN
            kw["temperature"] = 0.0
        sg_temperature = kw.get("sg_temperature")
        if sg_temperature is not None and sg_temperature < SAMPLING_EPS:
            raise ApiError(
                400,
                f"sg_temperature must be >= {SAMPLING_EPS:g} (with sg_first greedy, the default, the first "
                f"SpecGuard candidate is already the greedy one), got {sg_temperature!r}",
                param="sg_temperature",
            )
        has_draft = self.engine.draft is not None
        try:
            cfg = DecodeConfig.create(
                method,
                kw.pop("drafter", None),
                kw.pop("num_draft_tokens", None),
                has_draft_model=has_draft,
                max_new_tokens=max_new_tokens,
                **kw,
            )
        except ConfigError as e:  # names the field: the request's own name for it
            raise ApiError(400, e.render("field"), param=e.field) from None
        except TypeError as e:  # a wrong type that slipped through (should not happen)
            raise ApiError(400, f"bad parameter: {e}") from None
        if not has_draft and needs_draft_model(cfg.method, cfg.drafter):
            own = METHODS[cfg.method].needs_draft_model  # the method's own steps, else its drafter
            what = f"method '{cfg.method}'" if own else f"drafter '{cfg.drafter}'"
            raise ApiError(
                400,
                f"{what} needs a draft model, but this server has none (start it with "
                "--draft); use drafter 'ngram' or method 'ar'",
                param="method" if own else "drafter",
            )
        return cfg

    def max_new_tokens(self, requested: Optional[int], prompt_len: int, param: str, chat: bool) -> int:
        room = self.context - prompt_len
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {prompt_len} tokens; this model's context is {self.context} "
                "tokens, leaving no room for a completion",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        if requested is None:
            return min(self.settings.max_tokens_default, room)
        if requested < 1:
            raise ApiError(400, f"{param} must be a positive integer, got {requested}", param=param)
        if requested > room:
            raise ApiError(
                400,
                f"this model's context is {self.context} tokens; the prompt has {prompt_len} "
                f"and {param} asks for {requested} more (at most {room})",
                param=param,
                code="context_length_exceeded",
            )
        return requested

    # -- tokenization (in a thread) -------------------------------------------------------------

    def _encode(self, prompt, raw: bool) -> torch.Tensor:
        with self.tokenizer_lock:
            try:
                return encode_prompt(self.tokenizer, prompt, raw)
            except Exception as e:  # no chat template, a template raising on odd roles, ...
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ApiError(400, f"cannot format the prompt: {first[:300]}") from None

    def chat_prompt(self, req: ChatCompletionRequest) -> list[dict]:
        messages = []
        for i, msg in enumerate(req.messages):
            content = msg.content
            if isinstance(content, list):
                if any(p.type != "text" or p.text is None for p in content):
                    raise ApiError(400, "only text content parts are supported", param=f"messages.{i}.content")
                content = "".join(p.text for p in content)
            if content is None:
                raise ApiError(400, "a message needs content", param=f"messages.{i}.content")
            messages.append({"role": "system" if msg.role == "developer" else msg.role, "content": content})
        return messages

    async def prepare(self, req: CommonFields, chat: bool) -> tuple[torch.Tensor, DecodeConfig]:
        """Tokenize (in a thread) and build the request's config; run after :meth:`check_common` and the
        worker's admission (:meth:`Worker.reserve`), so that a refused request costs no tokenizing."""
        from starlette.concurrency import run_in_threadpool

        if chat:
            ids = await run_in_threadpool(self._encode, self.chat_prompt(req), False)
            requested, param = (
                (req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens),
                ("max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"),
            )
        else:
            prompt = req.prompt
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                if any(t < 0 or t >= self.vocab_size for t in prompt):
                    raise ApiError(400, f"token ids must lie in [0, {self.vocab_size})", param="prompt")
                ids = torch.tensor(prompt, dtype=torch.long)
            else:
                if isinstance(prompt, list):
                    if len(prompt) != 1:
                        raise ApiError(
                            400, "one prompt per request (batched prompts are not supported)", param="prompt"
                        )
                    prompt = prompt[0]
                ids = await run_in_threadpool(self._encode, prompt, True) if prompt else torch.zeros(0)
            requested, param = req.max_tokens, "max_tokens"
        if ids.numel() == 0:
            raise ApiError(400, "the prompt is empty", param="messages" if chat else "prompt")
        cfg = self.decode_config(req, self.max_new_tokens(requested, int(ids.numel()), param, chat))
        return ids, cfg
