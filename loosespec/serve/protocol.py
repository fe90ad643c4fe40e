"""The HTTP API's protocol: what ``loosespec serve`` was started with (:class:`ServerSettings`), its OpenAI-style
errors (:class:`ApiError`, the error body and status tables, request validation messages), the request models
(OpenAI fields + loosespec's per-request knobs) and the request limits (stop strings, the greedy temperature)."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

from loosespec.config import KNOBS, knob_help, knob_info, knob_type
from loosespec.speculative_config import HELP as SPECULATIVE_HELP

MAX_BODY_BYTES = 8 * 1024 * 1024  # a request body larger than this gets 413
MAX_STOP_STRINGS = 16  # stop strings per request (OpenAI allows 4, vLLM any number)
MAX_STOP_CHARS = 256  # characters per stop string (each round matches every stop string against the text's tail)
# a temperature (> 0) below this samples as greedy, as vLLM's _SAMPLING_EPS: dividing the logits by a temperature
# near 1e-38 overflows float32 (inf - inf = NaN in the softmax), and below 1e-5 sampling is greedy in all but name
SAMPLING_EPS = 1e-5
STALL_TIMEOUT_S = 300.0  # /health answers 503 when a generation made no progress for this long (0: never)
SHUTDOWN_TIMEOUT_S = 20.0  # on shutdown, requests still running or waiting after this long get 503


# ---------------------------------------------------------------------------------------------
# Settings and errors
# ---------------------------------------------------------------------------------------------


@dataclass
class ServerSettings:
    """What ``loosespec serve`` was started with; ``defaults`` are DecodeConfig fields requests may override."""

    served_model_name: str
    aliases: tuple[str, ...] = ()
    defaults: dict = field(default_factory=dict)  # method, drafter, num_draft_tokens, temperature, fly_*, sg_*, ...
    api_key: Optional[str] = None
    max_queue: int = 64
    max_tokens_default: int = 256
    max_body_bytes: int = MAX_BODY_BYTES
    host: str = "127.0.0.1"  # the address bound (--host): requests must be addressed to it (Host header)
    allow_origins: tuple[str, ...] = ()  # --allow-origin: more origins / host names accepted; "*": any
    stall_timeout_s: float = STALL_TIMEOUT_S
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S


class ApiError(Exception):
    """An OpenAI-style error response."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: Optional[dict] = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


_STATUS_TYPES = {
    401: ("authentication_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
}


def _http_error(status: int, message: str) -> ApiError:
    type_, code = _STATUS_TYPES.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return ApiError(status, message, type_, None, code)


def _validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
    # union members add their type to the location (messages.0.content.str): keep the field path
    param = (
        ".".join(
            x
            for x in loc
            if not any(c in x for c in "[]()")
            and x not in ("str", "int", "float", "bool", "list", "dict", "list[str]", "list[int]")
        )
        or None
    )
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    if not loc and e.get("type") == "missing":
        return "the request body is missing: send a JSON object (Content-Type: application/json)", None
    if not loc:
        return "the request body must be a JSON object (Content-Type: application/json)", None
    msg = str(e.get("msg", "invalid value"))
    value = e.get("input")
    if isinstance(value, (str, int, float, bool)) and len(repr(value)) <= 80:
        msg += f", got {json.dumps(value)}"
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + more, param


# ---------------------------------------------------------------------------------------------
# Request models (OpenAI fields + loosespec's extra fields, sent by clients as extra_body)
# ---------------------------------------------------------------------------------------------

_NAMESPACES = ("fly_", "sg_")


class _Base(BaseModel):
    # strict: "5" is not an int, "true" not a bool; NaN / Infinity are refused; unknown fields are kept
    # (model_extra) so that typos in loosespec's namespaces can be refused and the rest ignored
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def _request_field(name: str):
    """A knob as an optional request field: the declaration's type, bounds and choices (loosespec.config)."""
    k = knob_info(name)
    kind = knob_type(name)
    if k.choices is not None:
        kind = Literal[k.choices]
    elif typing.get_origin(kind) is Union:  # Optional[X] -> X; None is "not sent"
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if name == "drafter":  # "none": the method's default drafter, as vLLM clients may send it
        kind = Literal[k.choices + ("none",)]
    return (Optional[kind], Field(None, description=knob_help(name), **k.bounds))


# loosespec's per-request method selection: every knob declared as a request field in loosespec.config, with the
# CLI's names (--fly-window-size -> fly_window_size), derived from that one declaration
SpecFields = create_model(
    "SpecFields", __base__=_Base, **{name: _request_field(name) for name in KNOBS if knob_info(name).request}
)


class StreamOptions(_Base):
    include_usage: bool = False


class CommonFields(SpecFields):
    model: Optional[str] = None
    max_tokens: Optional[int] = None  # range checked against the context, with a clear message
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    user: Optional[str] = None
    # OpenAI fields accepted only at their no-op values
    logprobs: Optional[Union[bool, int]] = None
    top_logprobs: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    best_of: Optional[int] = None
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    tools: Optional[list] = None
    tool_choice: Optional[Any] = None
    response_format: Optional[dict] = None
    # vLLM's speculative_config, with the keys loosespec has (loosespec.speculative_config): the request's knobs
    speculative_config: Optional[dict[str, Any]] = Field(None, description=SPECULATIVE_HELP)


class TextPart(_Base):
    type: str
    text: Optional[str] = None


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None


class ChatCompletionRequest(CommonFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = None


class CompletionRequest(CommonFields):
    prompt: Union[str, list[str], list[int]]
