"""The vocabulary of ``recon serve``'s request models (:mod:`recon.server.schemas`): OpenAI's
error object, the JSON body, and one strict validator per kind of field.

It exists so that the request models read as a list of fields: each field's type here says what
it takes and what it refuses, in words a client can act on. The validators are our own rather
than pydantic's coercing types, because the APIs served are strict: OpenAI's takes
``temperature: 1`` but not ``"1"``, ``n: 2`` but not ``true`` or ``2.0``, and SGLang's
``input_ids`` are ids, never strings. A validator raises :class:`Invalid` with a code and a
message; :func:`recon.server.schemas.api_error` turns it into an :class:`ApiError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import PlainValidator, ValidationInfo

MAX_TOP_LOGPROBS = 20  # OpenAI's cap for top_logprobs
MAX_PROMPTS = 256  # prompts in one /v1/completions or /generate request
ROLES = ("system", "developer", "user", "assistant", "tool")
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


def _id_lists(value: Any, info: ValidationInfo) -> tuple[bool, list[list[int]]] | None:
    """SGLang's ``input_ids`` (and ``token_ids_logprob``): one list of ids, or a batch of them."""
    if value is None:
        return None
    vocab_size = (info.context or {}).get("vocab_size", 2**31)
    batch = isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)
    rows = value if batch else [value]
    if not isinstance(value, list) or not value or len(rows) > MAX_PROMPTS:
        raise Invalid("invalid_type", lambda p: f"'{p}' must be a non-empty list of token ids, or at most {MAX_PROMPTS} of those")
    for k, row in enumerate(rows):
        for j, tid in enumerate(row if row else [None]):
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < vocab_size:
                raise Invalid("invalid_value", lambda p, tid=tid: f"'{p}' must hold token ids in [0, {vocab_size}), got "
                              f"{show(tid)}", sub=f"[{k}][{j}]" if batch else f"[{j}]")
    return batch, rows


def _texts(value: Any) -> str | list[str] | None:
    if value is None or isinstance(value, str) or (isinstance(value, list) and value and len(value) <= MAX_PROMPTS
                                                   and all(isinstance(t, str) for t in value)):
        return value
    raise Invalid("invalid_type", lambda p: f"'{p}' must be a string or a list of at most {MAX_PROMPTS} strings")


def _fixed(*allowed: Any) -> Any:
    """A sampling option this server has in one position only (SGLang's "off" value): anything else is refused."""
    def check(value: Any) -> Any:
        if value is None or any(value == a and type(value) is type(a) for a in allowed):
            return allowed[0]
        raise Invalid("unsupported_parameter", lambda p: f"'{p}' is not supported by recon serve (only {show(allowed[0])})")
    return Annotated[Any, PlainValidator(check)]
