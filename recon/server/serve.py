"""``recon serve``: a small OpenAI-compatible server over the local model, hardened for bad input.

Routes: ``POST /v1/chat/completions`` (also ``stream: true``), ``POST /v1/completions`` (prompt
scoring and plain continuation, vLLM-style), ``GET /v1/models``, ``GET /v1/models/{id}``,
``GET /health``. Token ids come back in the fields vLLM users know: ``return_token_ids`` puts
``token_ids`` on each choice and ``prompt_token_ids`` at the top level of a chat completion (on
the choice of a text completion); ``return_tokens_as_token_ids`` writes logprob tokens as
``token_id:N``; ``prompt_logprobs`` scores every prompt position.

It exists so the client, the importers and recovery are tested against a real server, so it is
built to survive what a real server meets:

* Every bad request is an OpenAI-style JSON error, ``{"error": {"message", "type", "param",
  "code"}}``, with the status OpenAI uses: 400 for malformed JSON, wrong types and values out of
  range, 404 for an unknown route (``model_not_found`` for another model), 405 for a wrong
  method, 411 without ``Content-Length``, 413 for a body over the cap (refused from the header,
  never read), 429 when the queue is full. Nothing a client sends produces a traceback.
* Load is bounded: at most ``max_concurrency`` requests are served at once, ``max_queue`` more
  wait, anything beyond is told 429 at once; connections are capped too, and every socket has a
  timeout, so idle, half-sent or vanished clients free their thread.
* The model runs one batch at a time (a lock): sampling seeds torch's global generator, so one
  at a time is what keeps a seeded request reproducible.
* It binds 127.0.0.1 unless told otherwise and has no authentication. Bound to loopback it
  answers only requests whose ``Host`` is a loopback name (403 otherwise: DNS rebinding), and
  POST bodies must say ``Content-Type: application/json`` (415 otherwise), which a web page can
  only send after a CORS preflight that this server never grants.

Streaming generates the whole sample first and then sends it token by token as
``chat.completion.chunk`` events (one token per chunk, with its logprobs and ids), because the
model samples a batch in one ``generate`` call. The chunks are a view of the non-streamed
response, so their concatenated content, logprobs and ids are exactly the non-streamed ones.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO, Iterable, Iterator
from urllib.parse import urlsplit

from recon.recovery.model import LocalModel, Sample, batch_seed
from recon.samples.importers import to_vllm_chat
from recon.samples.records import Record

MAX_TOP_LOGPROBS = 20  # OpenAI's cap for top_logprobs
MAX_N = 16
MAX_PROMPTS = 256  # prompts in one /v1/completions request
MAX_PROMPT_TOKENS = 32_768  # tokens over all prompts of one /v1/completions request (the model is locked meanwhile)
DEFAULT_MAX_TOKENS = 128
ROLES = ("system", "developer", "user", "assistant", "tool")
#: request fields that would change the output if ignored; refused rather than silently dropped
UNSUPPORTED = ("stop", "tools", "functions", "tool_choice", "response_format", "logit_bias", "suffix", "best_of")


@dataclass(frozen=True)
class Limits:
    """What one server accepts. The defaults suit a laptop serving one user."""

    max_concurrency: int = 4  # requests served at once (the model itself runs one batch at a time)
    max_queue: int = 32  # requests waiting for a place; beyond this, 429
    #: tokens one request may generate (max_tokens x n). Sampling keeps every step's logits, 4 bytes
    #: x the vocabulary (49,152 for SmolLM2: 197 kB) per token, so this also bounds memory (~0.8 GB)
    max_tokens: int = 2048
    max_body_bytes: int = 1_000_000
    max_connections: int = 256  # open connections (threads); beyond this, 503 and close
    timeout: float = 30.0  # seconds a socket may sit idle while reading a request or sending


class ApiError(Exception):
    """An error the client caused (or a full queue), sent as OpenAI's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# -- request validation (pure) --------------------------------------------------------------------------
def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _show(value: Any) -> str:
    """A client's value, short, as JSON (never failing: a 5,000-digit int has no str() in 3.11)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _number(body: dict, key: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)) \
            or not (lo < value if lo_open else lo <= value) or value > hi:
        raise _bad(key, f"'{key}' must be a number in {'(' if lo_open else '['}{float(lo)}, {float(hi)}], got {_show(value)}")
    return float(value)


def _integer(body: dict, key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, f"'{key}' must be an integer, got {type(value).__name__}", "invalid_type")
    if not lo <= value <= hi:
        raise _bad(key, f"'{key}' must be in [{lo}, {hi}], got {_show(value)}")
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(key, f"'{key}' must be true or false, got {type(value).__name__}", "invalid_type")
    return value


def check_model(body: dict, served: str) -> None:
    """The served model answers to its own name, to "default" and to no name at all."""
    name = body.get("model")
    if name is None or name in ("default", served):
        return
    if not isinstance(name, str):
        raise _bad("model", f"'model' must be a string, got {type(name).__name__}", "invalid_type")
    raise ApiError(404, f"The model `{name[:200]}` does not exist; this server serves `{served}`.",
                   param="model", code="model_not_found")


def _check_unsupported(body: dict) -> None:
    for key in UNSUPPORTED:
        value = body.get(key)
        if value in (None, [], "", "none", {"type": "text"}) or (key == "best_of" and value == 1):
            continue
        raise _bad(key, f"'{key}' is not supported by recon serve", "unsupported_parameter")
    for key in ("frequency_penalty", "presence_penalty"):
        if _number(body, key, 0.0, -2.0, 2.0) != 0.0:
            raise _bad(key, f"'{key}' is not supported by recon serve (only 0)", "unsupported_parameter")


def _max_tokens(body: dict, cap: int, default: int, lo: int) -> int:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = _integer(body, key, None, lo, cap)
    return min(default, cap) if value is None else value


def _messages(value: Any) -> list[dict]:
    """Messages as the chat template wants them: role and text content (text parts joined)."""
    if not isinstance(value, list) or not value:
        raise _bad("messages", "'messages' must be a non-empty list", "invalid_type")
    out = []
    for k, message in enumerate(value):
        where = f"messages[{k}]"
        if not isinstance(message, dict):
            raise _bad(where, f"'{where}' must be an object, got {type(message).__name__}", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"'{where}.role' must be one of {', '.join(ROLES)}, got {_show(role)}")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"{where}.content[{j}]", f"'{where}.content[{j}]' must be a text part "
                               '({"type": "text", "text": "..."}); this model reads text only', "invalid_type")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise _bad(f"{where}.content", f"'{where}.content' must be a string or a list of text parts, "
                       f"got {type(content).__name__}", "invalid_type")
        out.append({"role": role, "content": content})
    return out


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int = 0
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    tokens_as_ids: bool = False


def _check_budget(n: int, max_tokens: int, cap: int, what: str) -> None:
    if n * max_tokens > cap:
        raise _bad("max_tokens", f"{what} x 'max_tokens' is {n} x {max_tokens} = {n * max_tokens} tokens; this server "
                   f"generates at most {cap} per request")


def parse_chat_request(body: dict, *, served: str, max_tokens: int = 2048) -> ChatRequest:
    """A chat completion body checked field by field; :class:`ApiError` names the first bad field."""
    check_model(body, served)
    messages = _messages(body.get("messages"))
    _check_unsupported(body)
    logprobs = _flag(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise _bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", "'stream_options' must be an object", "invalid_type")
    if options is not None and not stream:
        raise _bad("stream_options", "'stream_options' is only allowed with 'stream': true")
    n = _integer(body, "n", 1, 1, MAX_N)
    budget = _max_tokens(body, max_tokens, DEFAULT_MAX_TOKENS, 1)
    _check_budget(n, budget, max_tokens, "'n'")
    return ChatRequest(
        messages=messages, n=n,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        max_tokens=budget,
        seed=_integer(body, "seed", 0, -(2**63), 2**63 - 1),
        logprobs=logprobs, top_logprobs=top_logprobs, stream=stream,
        include_usage=_flag(options or {}, "include_usage"),
        return_token_ids=_flag(body, "return_token_ids"), tokens_as_ids=_flag(body, "return_tokens_as_token_ids"),
    )


@dataclass(frozen=True)
class CompletionRequest:
    prompts: list[list[int] | str]
    max_tokens: int = 16
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    return_token_ids: bool = False
    tokens_as_ids: bool = False


def _prompts(value: Any, vocab_size: int) -> list[list[int] | str]:
    """``prompt`` as OpenAI and vLLM take it: a string, a list of ids, or a list of either."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(type(i) is int for i in value)):
        value = [value]  # one prompt
    if not isinstance(value, list) or not value:
        raise _bad("prompt", "'prompt' must be a string, a non-empty list of token ids, or a list of those", "invalid_type")
    if len(value) > MAX_PROMPTS:
        raise _bad("prompt", f"at most {MAX_PROMPTS} prompts in one request, got {len(value)}")
    for k, prompt in enumerate(value):
        if isinstance(prompt, str):
            continue
        if not isinstance(prompt, list) or not prompt:
            raise _bad(f"prompt[{k}]", f"'prompt[{k}]' must be a string or a non-empty list of token ids", "invalid_type")
        for j, tid in enumerate(prompt):
            if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < vocab_size:
                raise _bad(f"prompt[{k}][{j}]", f"'prompt[{k}][{j}]' must be a token id in [0, {vocab_size}), got {_show(tid)}")
    return value


def parse_completion_request(body: dict, *, served: str, vocab_size: int, max_tokens: int = 2048) -> CompletionRequest:
    """A ``/v1/completions`` body checked field by field (``max_tokens`` 0 scores the prompt only)."""
    check_model(body, served)
    prompts = _prompts(body.get("prompt"), vocab_size)
    _check_unsupported(body)
    if _flag(body, "stream"):
        raise _bad("stream", "streaming is supported on /v1/chat/completions only")
    if body.get("stream_options") is not None:
        raise _bad("stream_options", "'stream_options' is only allowed with 'stream': true")
    _integer(body, "n", 1, 1, 1)
    budget = _max_tokens(body, max_tokens, 16, 0)
    _check_budget(len(prompts), budget, max_tokens, "prompts")
    return CompletionRequest(
        prompts=prompts, max_tokens=budget, echo=_flag(body, "echo"),
        logprobs=_integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS),
        prompt_logprobs=_integer(body, "prompt_logprobs", None, 0, MAX_TOP_LOGPROBS),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        seed=_integer(body, "seed", 0, -(2**63), 2**63 - 1),
        return_token_ids=_flag(body, "return_token_ids"), tokens_as_ids=_flag(body, "return_tokens_as_token_ids"),
    )


def check_context(prompt_len: int, max_tokens: int, context: int | None, param: str = "max_tokens") -> None:
    if context and prompt_len + max_tokens > context:
        raise _bad(param, f"This model's maximum context length is {context} tokens; the prompt has {prompt_len} "
                   f"and {param} asks for {max_tokens} more")


# -- admission -----------------------------------------------------------------------------------------
class Gate:
    """At most ``running`` requests inside and ``queued`` more waiting; anyone beyond is refused
    at once (429) instead of piling up threads and memory until the server falls over."""

    def __init__(self, running: int, queued: int):
        if running < 1 or queued < 0:
            raise ValueError("need running >= 1 and queued >= 0")
        self._slots = threading.Semaphore(running)
        self._lock = threading.Lock()
        self._capacity = running + queued
        self.inside = 0  # running + waiting

    @contextmanager
    def enter(self) -> Iterator[None]:
        with self._lock:
            if self.inside >= self._capacity:
                raise ApiError(429, f"the server is busy ({self._capacity} requests in flight or queued); retry later",
                               type="rate_limit_error", code="rate_limit_exceeded")
            self.inside += 1
        try:
            with self._slots:
                yield
        finally:
            with self._lock:
                self.inside -= 1


# -- responses (pure, given the model's samples and scores) ------------------------------------------------
def _lp(value: float) -> float:
    return round(value, 4) if math.isfinite(value) else -9999.0


def _token_text(tok, tid: int, as_ids: bool) -> tuple[str, list[int] | None]:
    if as_ids:
        return f"token_id:{tid}", None
    data = tok.id_to_bytes(tid)
    return data.decode("utf-8", "replace"), list(data)


def chat_response(model: LocalModel, req: ChatRequest, prompt_ids: list[int], samples: list[Sample]) -> dict:
    """The chat completion for ``samples``: vLLM's shape (``to_vllm_chat``, which the importers
    invert), with ``top_logprobs`` filled in and vLLM's id fields only when asked for."""
    request_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    choices = []
    for k, sample in enumerate(samples):
        resp = model.response(sample, logprobs=req.logprobs)
        if req.logprobs and req.tokens_as_ids:
            for entry, tid in zip(resp.logprobs, sample.output_ids):
                entry.token_id = tid
        rec = Record(request_id, "served", sample.output_ids, resp, prompt_ids)
        out = to_vllm_chat(rec, model=model.name, return_token_ids=req.return_token_ids, tokens_as_ids=req.tokens_as_ids)
        choice = out["choices"][0]
        choice["index"] = k
        if req.logprobs and req.top_logprobs:
            for entry, top in zip(choice["logprobs"]["content"], sample.top):
                entry["top_logprobs"] = [dict(zip(("token", "bytes"), _token_text(model.tokenizer, tid, req.tokens_as_ids)),
                                              logprob=_lp(lp)) for tid, lp in top[: req.top_logprobs]]
        choices.append(choice)
    out["choices"] = choices
    completion = sum(len(s.output_ids) for s in samples)
    out["usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                    "total_tokens": len(prompt_ids) + completion}
    return out


def content_deltas(decode, ids: list[int], special_ids: Iterable[int], content: str) -> list[str]:
    """One piece of ``content`` per token, joined they are ``content`` exactly.

    A token that ends inside a UTF-8 character (``' \\xf0\\x9f'``, half an emoji) has no text of
    its own yet; the prefix decoded so far is only released up to where it agrees with the final
    text, so a half character is held back until the token that completes it.
    """
    special = set(special_ids)
    shown: list[int] = []
    out: list[str] = []
    sent = 0
    for tid in ids:
        if tid not in special:
            shown.append(tid)
        prefix = decode(shown)
        agree = len(os.path.commonprefix([prefix, content]))
        out.append(content[sent:max(sent, agree)])
        sent = max(sent, agree)
    if out:
        out[-1] += content[sent:]
    return out


def chat_chunks(model: LocalModel, req: ChatRequest, response: dict, samples: list[Sample]) -> Iterator[dict]:
    """The streamed form of ``response``: per choice a role chunk, one chunk per token (its text,
    its logprobs entry, its id with ``return_token_ids``), a finish chunk; then usage if asked."""
    tok = model.tokenizer
    head = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"], "model": response["model"]}
    usage = {"usage": None} if req.include_usage else {}
    first = True
    for choice, sample in zip(response["choices"], samples):
        k = choice["index"]
        chunk = {**head, "choices": [{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}], **usage}
        if first and req.return_token_ids:
            chunk["prompt_token_ids"] = response["prompt_token_ids"]  # vLLM: in the first chunk only
        first = False
        yield chunk
        entries = (choice.get("logprobs") or {}).get("content")
        deltas = content_deltas(tok.decode, sample.output_ids, tok.special_ids, choice["message"]["content"] or "")
        for j, (tid, delta) in enumerate(zip(sample.output_ids, deltas)):
            part = {"index": k, "delta": {"content": delta}, "logprobs": {"content": [entries[j]]} if entries else None,
                    "finish_reason": None}
            if req.return_token_ids:
                part["token_ids"] = [tid]
            yield {**head, "choices": [part], **usage}
        yield {**head, "choices": [{"index": k, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}], **usage}
    if req.include_usage:
        yield {**head, "choices": [], "usage": response["usage"]}


def _legacy_logprobs(tok, ids: list[int], lps: list[float | None], tops: list[list[tuple[int, float]]],
                     k: int, as_ids: bool) -> dict:
    """OpenAI's legacy completion logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for tid, lp, top in zip(ids, lps, tops):
        text = _token_text(tok, tid, as_ids)[0]
        out["tokens"].append(text)
        out["token_logprobs"].append(None if lp is None else _lp(lp))
        if lp is None:
            out["top_logprobs"].append(None)
        else:
            best = {_token_text(tok, t, as_ids)[0]: _lp(v) for t, v in top[:k]}
            best.setdefault(text, _lp(lp))  # vLLM: the chosen token is always listed
            out["top_logprobs"].append(best)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _prompt_logprobs(tok, ids: list[int], scores, k: int) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: None for position 0, then {id: {logprob, rank, decoded_token}}
    holding the prompt's own token and the k most likely ones."""
    out: list[dict | None] = [None]
    for i in range(1, len(ids)):
        entry = {str(t): {"logprob": _lp(v), "rank": r + 1, "decoded_token": _token_text(tok, t, False)[0]}
                 for r, (t, v) in enumerate(scores.top[i][:k])}
        entry[str(ids[i])] = {"logprob": _lp(scores.logprobs[i]), "rank": scores.ranks[i],
                              "decoded_token": _token_text(tok, ids[i], False)[0]}
        out.append(entry)
    return out


def completion_response(model: LocalModel, req: CompletionRequest, prompt_ids: list[list[int]], texts: list[str],
                        scores: list | None, samples: list[Sample | None]) -> dict:
    """``/v1/completions`` in vLLM's shape: per prompt one choice with the (echoed) text, legacy
    ``logprobs``, and when asked ``prompt_logprobs``, ``prompt_token_ids`` and ``token_ids``."""
    tok = model.tokenizer
    k = req.logprobs or 0
    choices = []
    for index, (ids, text, sample) in enumerate(zip(prompt_ids, texts, samples)):
        out_ids = sample.output_ids if sample else []
        generated = tok.decode([i for i in out_ids if i not in tok.special_ids]) if out_ids else ""
        choice: dict[str, Any] = {"index": index, "text": (text if req.echo else "") + generated, "logprobs": None,
                                  "finish_reason": sample.finish_reason if sample else "length", "stop_reason": None}
        if req.logprobs is not None:  # over the echoed prompt (scored) and then the generated tokens
            all_ids, lps, tops = (list(ids), list(scores[index].logprobs), list(scores[index].top)) if req.echo else ([], [], [])
            if sample:
                all_ids += out_ids
                lps += sample.logprobs
                tops += sample.top or [[] for _ in out_ids]
            choice["logprobs"] = _legacy_logprobs(tok, all_ids, lps, tops, k, req.tokens_as_ids)
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _prompt_logprobs(tok, ids, scores[index], req.prompt_logprobs)
        if req.return_token_ids or req.prompt_logprobs is not None:
            choice["prompt_token_ids"] = ids
        if req.return_token_ids:
            choice["token_ids"] = out_ids
        choices.append(choice)
    prompt_tokens = sum(map(len, prompt_ids))
    completion = sum(len(s.output_ids) for s in samples if s)
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": model.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}}


# -- the model side ------------------------------------------------------------------------------------
def context_length(model: LocalModel) -> int | None:
    config = getattr(getattr(model, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def run_chat(model: LocalModel, req: ChatRequest, lock: threading.Lock) -> tuple[dict, list[Sample]]:
    try:
        prompt_ids = model.tokenizer.encode(model.render(req.messages))
    except Exception as e:  # a template that rejects these messages is the client's problem
        raise _bad("messages", f"cannot render messages with the chat template: {str(e)[:300]}") from None
    check_context(len(prompt_ids), req.max_tokens, context_length(model))
    with lock:
        samples = model.sample([prompt_ids] * req.n, temperature=req.temperature, top_p=req.top_p,
                               max_new_tokens=req.max_tokens, seed=batch_seed(req.seed, 0), top_logprobs=req.top_logprobs)
    return chat_response(model, req, prompt_ids, samples), samples


def run_completion(model: LocalModel, req: CompletionRequest, lock: threading.Lock) -> dict:
    tok = model.tokenizer
    prompt_ids = [tok.encode(p) if isinstance(p, str) else p for p in req.prompts]
    texts = [p if isinstance(p, str) else tok.decode(p) for p in req.prompts]
    context = context_length(model)
    for k, ids in enumerate(prompt_ids):
        if not ids:
            raise _bad(f"prompt[{k}]", f"'prompt[{k}]' encodes to no tokens")
        check_context(len(ids), req.max_tokens, context)
    if sum(map(len, prompt_ids)) > MAX_PROMPT_TOKENS:
        raise _bad("prompt", f"at most {MAX_PROMPT_TOKENS} prompt tokens in one request, got {sum(map(len, prompt_ids))}")
    need_scores = req.prompt_logprobs is not None or (req.echo and req.logprobs is not None)
    top_k = max(req.prompt_logprobs or 0, req.logprobs or 0)
    samples: list[Sample | None] = [None] * len(prompt_ids)
    with lock:
        scores = model.token_logprobs(prompt_ids, top_k=top_k) if need_scores else None
        if req.max_tokens > 0:
            for k, ids in enumerate(prompt_ids):
                samples[k] = model.sample([ids], temperature=req.temperature, top_p=req.top_p, max_new_tokens=req.max_tokens,
                                          seed=batch_seed(req.seed, k), top_logprobs=req.logprobs or 0)[0]
    return completion_response(model, req, prompt_ids, texts, scores, samples)


# -- HTTP ------------------------------------------------------------------------------------------------
ROUTES = {"/v1/chat/completions": "POST", "/chat/completions": "POST", "/v1/completions": "POST",
          "/completions": "POST", "/v1/models": "GET", "/models": "GET", "/health": "GET"}
_DIGITS = re.compile(r"[0-9]{1,15}")


def host_allowed(header: str | None, loopback_only: bool) -> bool:
    """On a loopback-bound server, only loopback names in ``Host``: a web page whose name an
    attacker re-points at 127.0.0.1 (DNS rebinding) sends its own name and is turned away."""
    if header is None or not loopback_only:
        return True
    try:
        name = urlsplit("//" + header.strip()).hostname or ""
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_body(data: bytes) -> dict:
    """A request body as a JSON object; anything else is a 400 naming what is wrong."""
    try:
        body = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON (nested too deeply)", code="invalid_json") from None
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not valid JSON (not UTF-8)", code="invalid_json") from None
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON ({getattr(e, 'msg', e)})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_type")
    return body


def send_events(wfile: BinaryIO, events: Iterable[dict]) -> bool:
    """Write server-sent events, then ``data: [DONE]``. False if the client went away on the way
    (its thread ends and its place is freed; nothing else notices)."""
    try:
        for event in events:
            wfile.write(b"data: " + json.dumps(event, ensure_ascii=False, allow_nan=False).encode() + b"\n\n")
        wfile.write(b"data: [DONE]\n\n")
        wfile.flush()
        return True
    except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout):
        return False


class Server(ThreadingHTTPServer):
    """One thread per connection, at most ``limits.max_connections`` of them."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of connections waits in the kernel

    def __init__(self, address: tuple[str, int], handler, limits: Limits):
        self.limits = limits
        self._open = 0
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        with self._open_lock:
            full = self._open >= self.limits.max_connections
            if not full:
                self._open += 1
        if full:
            body = json.dumps(ApiError(503, "too many open connections; retry later", type="server_error",
                                       code="server_overloaded").body()).encode()
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open -= 1

    def handle_error(self, request, client_address) -> None:  # one line, never a traceback
        print(f"recon serve: {client_address[0]}: {sys.exc_info()[1]!r}", file=sys.stderr, flush=True)


def make_server(model: LocalModel, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None) -> Server:
    """The server, bound to ``host`` (loopback by default) and ready for ``serve_forever``."""
    limits = limits or Limits()
    lock = threading.Lock()
    gate = Gate(limits.max_concurrency, limits.max_queue)
    vocab_size = model.tokenizer.vocab_size
    try:
        loopback_only = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback_only = host == "localhost"

    class Handler(BaseHTTPRequestHandler):
        server_version = "recon-serve"
        sys_version = ""
        protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive threads
        timeout = limits.timeout

        def _send(self, status: int, payload: Any, headers: dict | None = None) -> None:
            data = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _fail(self, error: ApiError, headers: dict | None = None) -> None:
            if error.status == 429:
                headers = {"Retry-After": "1", **(headers or {})}
            try:
                self._send(error.status, error.body(), headers)
            except OSError:
                self.close_connection = True

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """The base class's errors (a bad request line, a header too long, an unknown
            method) as OpenAI-style JSON instead of an HTML page."""
            self.close_connection = True
            if self.request_version == "HTTP/0.9":  # an unparseable request line: answer with headers anyway
                self.request_version = self.protocol_version
            phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else "Error"
            self._fail(ApiError(code, message or phrase, code=re.sub(r"[^a-z]+", "_", phrase.lower())))

        def _path(self) -> str:
            path = urlsplit(self.path).path
            return path.rstrip("/") or "/"

        def _route(self, method: str) -> str | None:
            """The route, or None after answering 403 (a foreign Host), 404 or 405."""
            if not host_allowed(self.headers.get("Host"), loopback_only):
                self._fail(ApiError(403, "this server answers to localhost only (Host header)", code="forbidden_host"))
                return None
            path = self._path()
            allowed = ROUTES.get(path) or ("GET" if path.startswith(("/v1/models/", "/models/")) else None)
            if allowed is None:
                self._fail(ApiError(404, f"no route {method} {path[:200]}", code="not_found"))
                return None
            if method != allowed:
                self._fail(ApiError(405, f"{path} takes {allowed}, not {method}", code="method_not_allowed"),
                           {"Allow": allowed})
                return None
            return path

        def _read_body(self) -> dict:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise ApiError(411, "chunked bodies are not supported; send Content-Length", code="length_required")
            lengths = self.headers.get_all("Content-Length") or []
            if not lengths:
                raise ApiError(411, "Content-Length is required", code="length_required")
            if len(set(v.strip() for v in lengths)) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
                self.close_connection = True
                raise ApiError(400, f"invalid Content-Length {', '.join(lengths)[:50]!r}", code="invalid_content_length")
            length = int(lengths[0])
            if length > limits.max_body_bytes:
                self.close_connection = True  # refused from the header; the body is never read
                raise ApiError(413, f"the body is {length} bytes; this server takes at most {limits.max_body_bytes}",
                               code="request_too_large")
            data = self.rfile.read(length)
            if len(data) < length:
                self.close_connection = True
                raise ApiError(400, f"the body ended after {len(data)} of {length} bytes", code="incomplete_body")
            media = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if media != "application/json":  # a web page can only send JSON after a CORS preflight, which fails here
                raise ApiError(415, f"send Content-Type: application/json, not {media or 'nothing'}",
                               code="unsupported_media_type")
            return parse_body(data)

        def do_GET(self) -> None:  # noqa: N802
            path = self._route("GET")
            if path is None:
                return
            card = {"id": model.name, "object": "model", "created": 0, "owned_by": "recon", "max_model_len": context_length(model)}
            if path == "/health":
                self._send(200, {"status": "ok"})
            elif path in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [card]})
            elif path.rsplit("/", 1)[1] == model.name:
                self._send(200, card)
            else:
                self._fail(ApiError(404, f"The model `{path.rsplit('/', 1)[1][:200]}` does not exist; this server "
                                         f"serves `{model.name}`.", param="model", code="model_not_found"))

        def do_POST(self) -> None:  # noqa: N802
            path = self._route("POST")
            if path is None:
                return
            try:
                body = self._read_body()
                if path.endswith("/chat/completions"):
                    req = parse_chat_request(body, served=model.name, max_tokens=limits.max_tokens)
                    with gate.enter():
                        response, samples = run_chat(model, req, lock)
                        if req.stream:
                            self._stream(chat_chunks(model, req, response, samples))
                        else:
                            self._send(200, response)
                else:
                    creq = parse_completion_request(body, served=model.name, vocab_size=vocab_size, max_tokens=limits.max_tokens)
                    with gate.enter():
                        self._send(200, run_completion(model, creq, lock))
            except ApiError as e:
                self._fail(e)
            except socket.timeout:
                self.close_connection = True
                self._fail(ApiError(408, f"no data for {limits.timeout:g} s; closing", code="request_timeout"))
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                self.close_connection = True  # the client left; nothing to answer
            except Exception as e:  # a bug or the model failing: one line in the log, a 500 to the client
                print(f"recon serve: {path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                self._fail(ApiError(500, f"internal error: {type(e).__name__}", type="server_error", code="internal_error"))

        def _stream(self, events: Iterable[dict]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.close_connection = True
            send_events(self.wfile, events)

        def _not_allowed(self) -> None:
            self._route(self.command)

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _not_allowed

        def log_message(self, format: str, *args) -> None:  # quiet by default
            pass

    return Server((host, port), Handler, limits)
