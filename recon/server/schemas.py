"""What ``recon serve`` accepts: one pydantic model per endpoint, and OpenAI's error object.

It exists so that every request body is checked in one place, field by field, before anything
touches the model, and so that every refusal has the same shape, ``{"error": {"message", "type",
"param", "code"}}``, with ``param`` naming the field (``messages[2].content``, ``prompt[0][3]``)
and ``code`` saying what is wrong (``invalid_type``, ``invalid_value``, ``unsupported_parameter``,
``model_not_found``).

The fields are typed with validators of our own rather than pydantic's coercing types: OpenAI's
API takes ``temperature: 1`` but not ``"1"``, ``n: 2`` but not ``true`` or ``2.0``. A validator
raises :class:`Invalid`; :func:`api_error` turns the first error pydantic collected into an
:class:`ApiError`. Unknown fields are ignored (clients send ``user``, ``metadata``, ``store``...);
the fields in :data:`UNSUPPORTED` would change the output if ignored, so they are refused unless
they hold their "off" value. Server limits (``max_tokens`` cap, vocabulary size, served name)
come in through pydantic's validation context.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

MAX_TOP_LOGPROBS = 20  # OpenAI's cap for top_logprobs
MAX_N = 16
MAX_PROMPTS = 256  # prompts in one /v1/completions request
DEFAULT_MAX_TOKENS = 128
ROLES = ("system", "developer", "user", "assistant", "tool")
#: request fields that would change the output if ignored; refused rather than silently dropped
UNSUPPORTED = ("stop", "tools", "functions", "tool_choice", "response_format", "logit_bias", "suffix", "best_of")
SEED_RANGE = (-(2**63), 2**63 - 1)


class ApiError(Exception):
    """An error the client caused (or a busy server), sent as OpenAI's error object. ``close``
    asks for the connection to be closed after the answer (the body was not read, or cannot be)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers, self.close = dict(headers or {}), close

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def to_json(value: Any) -> bytes:
    """JSON as every answer is written: UTF-8, and never ``NaN`` (which is not JSON)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()


class Invalid(ValueError):
    """A field's value refused: ``text(param)`` is the message; ``param`` replaces the location
    pydantic reports (for checks across fields), ``sub`` extends it (``[3]`` inside a list)."""

    def __init__(self, code: str, text: Callable[[str], str], *, param: str | None = None, sub: str = "", status: int = 400):
        super().__init__(code)
        self.code, self.text, self.param, self.sub, self.status = code, text, param, sub, status


def show(value: Any) -> str:
    """A client's value, short, as JSON (never failing: a 5,000-digit int has no str() in 3.11)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _where(loc: tuple) -> str:
    """``('messages', 0, 'content')`` -> ``messages[0].content``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_FIRST = {"model": 0, "messages": 1, "prompt": 1, **{key: 2 for key in UNSUPPORTED}, "frequency_penalty": 2,
          "presence_penalty": 2}


def api_error(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as OpenAI's 400 (404 for another model's name)."""
    first = min(error.errors(), key=lambda e: _FIRST.get(e["loc"][0] if e["loc"] else "", 3))  # min is stable
    where = _where(first["loc"])
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, Invalid):
        param = cause.param or where + cause.sub
        return ApiError(cause.status, cause.text(param), param=param, code=cause.code)
    got = type(first.get("input")).__name__
    if first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return ApiError(400, f"'{where}' must be an object, got {got}", param=where, code="invalid_type")
    return ApiError(400, f"'{where}': {first['msg']}", param=where or None, code="invalid_value")


def parse_body(data: bytes) -> dict:
    """A request body as a JSON object; anything else is a 400 naming what is wrong."""

    def reject(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    try:
        body = json.loads(data, parse_constant=reject)
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON (nested too deeply)", code="invalid_json") from None
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not valid JSON (not UTF-8)", code="invalid_json") from None
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON ({getattr(e, 'msg', e)})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_type")
    return body


# -- field validators ---------------------------------------------------------------------------------
def _number(value: Any, lo: float, hi: float, lo_open: bool, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)) \
            or not (lo < value if lo_open else lo <= value) or value > hi:
        raise Invalid("invalid_value", lambda p: f"'{p}' must be a number in {'(' if lo_open else '['}{float(lo)}, "
                                                 f"{float(hi)}], got {show(value)}")
    return float(value)


def number(lo: float, hi: float, *, lo_open: bool = False, default: float = 1.0) -> Any:
    """A JSON number in [lo, hi] (``(lo, hi]`` with ``lo_open``); null is the default."""
    return Annotated[float, PlainValidator(lambda value: _number(value, lo, hi, lo_open, default))]


def integer(lo: int | str, hi: int | str, default: int | None) -> Any:
    """A JSON integer in [lo, hi]; a bound given as a name is read from the validation context."""

    def check(value: Any, info: ValidationInfo) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid("invalid_type", lambda p: f"'{p}' must be an integer, got {type(value).__name__}")
        low, high = ((info.context or {}).get(b, 2048) if isinstance(b, str) else b for b in (lo, hi))
        if not low <= value <= high:
            raise Invalid("invalid_value", lambda p: f"'{p}' must be in [{low}, {high}], got {show(value)}")
        return value

    return Annotated[int | None, PlainValidator(check)]


def _flag(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise Invalid("invalid_type", lambda p: f"'{p}' must be true or false, got {type(value).__name__}")
    return value


def _off(value: Any) -> Any:
    """An unsupported feature in its "off" position, or a refusal."""
    if value in (None, [], "", "none", {"type": "text"}):
        return None
    raise Invalid("unsupported_parameter", lambda p: f"'{p}' is not supported by recon serve")


def _penalty(value: Any) -> float:
    if _number(value, -2.0, 2.0, False, 0.0) != 0.0:
        raise Invalid("unsupported_parameter", lambda p: f"'{p}' is not supported by recon serve (only 0)")
    return 0.0


def _best_of(value: Any) -> Any:
    return None if value == 1 else _off(value)


def _model(value: Any, info: ValidationInfo) -> str | None:
    """The served model answers to its own name, to "default" and to no name at all."""
    served = (info.context or {}).get("served")
    if value is None or value == "default" or value == served or served is None:
        return value
    if not isinstance(value, str):
        raise Invalid("invalid_type", lambda p: f"'{p}' must be a string, got {type(value).__name__}")
    raise Invalid("model_not_found", lambda p: f"The model `{value[:200]}` does not exist; this server serves `{served}`.",
                  status=404)


def _non_empty_list(value: Any) -> list:
    if not isinstance(value, list) or not value:
        raise Invalid("invalid_type", lambda p: f"'{p}' must be a non-empty list")
    return value


def _no_stream_options(value: Any) -> None:
    if value is not None:
        raise Invalid("invalid_value", lambda p: f"'{p}' is only allowed with 'stream': true")


def _object(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise Invalid("invalid_type", lambda p: f"'{p}' must be an object, got {type(value).__name__}")
    return value


def _role(value: Any) -> str:
    if value not in ROLES:
        raise Invalid("invalid_value", lambda p: f"'{p}' must be one of {', '.join(ROLES)}, got {show(value)}")
    return value


def _content(value: Any) -> str:
    """A string, or text parts joined: this model reads text only."""
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise Invalid("invalid_type", lambda p: f"'{p}' must be a text part "
                              '({"type": "text", "text": "..."}); this model reads text only', sub=f"[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    if not isinstance(value, str):
        raise Invalid("invalid_type", lambda p: f"'{p}' must be a string or a list of text parts, got {type(value).__name__}")
    return value


def _prompts(value: Any, info: ValidationInfo) -> list[list[int] | str]:
    """``prompt`` as OpenAI and vLLM take it: a string, a list of ids, or a list of either."""
    vocab_size = (info.context or {}).get("vocab_size", 2**31)
    if isinstance(value, str) or (isinstance(value, list) and value and all(type(i) is int for i in value)):
        value = [value]  # one prompt
    if not isinstance(value, list) or not value:
        raise Invalid("invalid_type", lambda p: f"'{p}' must be a string, a non-empty list of token ids, or a list of those")
    if len(value) > MAX_PROMPTS:
        raise Invalid("invalid_value", lambda p: f"at most {MAX_PROMPTS} prompts in one request, got {len(value)}")
    for k, prompt in enumerate(value):
        if isinstance(prompt, str):
            continue
        if not isinstance(prompt, list) or not prompt:
            raise Invalid("invalid_type", lambda p: f"'{p}' must be a string or a non-empty list of token ids", sub=f"[{k}]")
        for j, tid in enumerate(prompt):
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < vocab_size:
                raise Invalid("invalid_value", lambda p, tid=tid: f"'{p}' must be a token id in [0, {vocab_size}), "
                              f"got {show(tid)}", sub=f"[{k}][{j}]")
    return value


Flag = Annotated[bool, PlainValidator(_flag)]
Off = Annotated[Any, PlainValidator(_off)]
Penalty = Annotated[float, PlainValidator(_penalty)]
Temperature = number(0.0, 2.0)
TopP = number(0.0, 1.0, lo_open=True)
Seed = integer(*SEED_RANGE, 0)
TopK = integer(0, MAX_TOP_LOGPROBS, None)


class _Request(BaseModel):
    """What both endpoints share. Errors are reported for ``model`` first, then for the messages
    or prompt, then for these unsupported features, then in the order the fields are declared."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: Annotated[str | None, PlainValidator(_model)] = None
    stop: Off = None
    tools: Off = None
    functions: Off = None
    tool_choice: Off = None
    response_format: Off = None
    logit_bias: Off = None
    suffix: Off = None
    best_of: Annotated[Any, PlainValidator(_best_of)] = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    _budget: int = PrivateAttr(0)

    @property
    def budget(self) -> int:
        """Tokens to generate per prompt or choice: ``max_completion_tokens``, else ``max_tokens``, else the default."""
        return self._budget

    def _resolve_budget(self, info: ValidationInfo, what: str, count: int, default: int) -> None:
        cap = (info.context or {}).get("max_tokens", 2048)
        value = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        value = min(default, cap) if value is None else value
        if count * value > cap:
            raise Invalid("invalid_value", lambda p: f"{what} x 'max_tokens' is {count} x {value} = {count * value} tokens; "
                          f"this server generates at most {cap} per request", param="max_tokens")
        self._budget = value

    @property
    def tokens_as_ids(self) -> bool:
        return self.return_tokens_as_token_ids


class Message(BaseModel):
    """One chat message: a role and its text (``name``, ``tool_call_id``... are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Annotated[str, PlainValidator(_role)] = Field(None, validate_default=True)
    content: Annotated[str, PlainValidator(_content)] = Field(None, validate_default=True)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    include_usage: Flag = False


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], BeforeValidator(_non_empty_list)] = Field(None, validate_default=True)
    logprobs: Flag = False
    top_logprobs: integer(0, MAX_TOP_LOGPROBS, 0) = 0
    stream: Flag = False
    stream_options: Annotated[StreamOptions | None, BeforeValidator(_object)] = None
    n: integer(1, MAX_N, 1) = 1
    max_tokens: integer(1, "max_tokens", None) = None
    max_completion_tokens: integer(1, "max_tokens", None) = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    seed: Seed = 0
    return_token_ids: Flag = False
    return_tokens_as_token_ids: Flag = False

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise Invalid("invalid_value", lambda p: "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if self.stream_options is not None and not self.stream:
            raise Invalid("invalid_value", lambda p: "'stream_options' is only allowed with 'stream': true", param="stream_options")
        self._resolve_budget(info, "'n'", self.n, DEFAULT_MAX_TOKENS)
        return self

    @property
    def chat_messages(self) -> list[dict]:
        """The messages as the chat template takes them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Request):
    """``POST /v1/completions``: prompts as strings or token ids; a ``budget`` of 0 scores them only."""

    prompt: Annotated[list, PlainValidator(_prompts)] = Field(None, validate_default=True)
    stream: Flag = False
    stream_options: Annotated[Any, PlainValidator(_no_stream_options)] = None
    n: integer(1, 1, 1) = 1
    max_tokens: integer(0, "max_tokens", None) = None
    max_completion_tokens: integer(0, "max_tokens", None) = None
    echo: Flag = False
    logprobs: TopK = None
    prompt_logprobs: TopK = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    seed: Seed = 0
    return_token_ids: Flag = False
    return_tokens_as_token_ids: Flag = False

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> CompletionRequest:
        if self.stream:
            raise Invalid("invalid_value", lambda p: "streaming is supported on /v1/chat/completions only", param="stream")
        self._resolve_budget(info, "prompts", len(self.prompt), 16)
        return self

    @property
    def prompts(self) -> list[list[int] | str]:
        return self.prompt


def _validate(cls: type[BaseModel], body: dict, context: dict) -> Any:
    try:
        return cls.model_validate(body, context=context)
    except ValidationError as e:
        raise api_error(e) from None


def parse_chat_request(body: dict, *, served: str, max_tokens: int = 2048) -> ChatRequest:
    """A chat completion body checked field by field; :class:`ApiError` names the first bad field."""
    return _validate(ChatRequest, body, {"served": served, "max_tokens": max_tokens})


def parse_completion_request(body: dict, *, served: str, vocab_size: int, max_tokens: int = 2048) -> CompletionRequest:
    """A ``/v1/completions`` body checked field by field (``max_tokens`` 0 scores the prompt only)."""
    return _validate(CompletionRequest, body, {"served": served, "max_tokens": max_tokens, "vocab_size": vocab_size})
