"""The ``recon serve`` ASGI app: FastAPI routes over the local model, and the checks in front.

It exists to put the HTTP side in one place: which routes there are, what is checked before a
route runs and in what order, and how every refusal becomes OpenAI's error object. A request
meets, in order: the method (501 for one HTTP does not know), the ``Host`` header on a
loopback-bound server (403: DNS rebinding), the API key when one is set (401, everywhere but
``/health``), the route (404, 405 with ``Allow``), the body's framing (411 without
``Content-Length`` or with chunks, 400 for a bad one, 413 over the cap, read from the header
before any body byte), the body within the request deadline (408), its type (415 unless
``application/json``, which a web page can only send after a CORS preflight this server never
grants), JSON (400), the schema
(:mod:`recon.server.schemas`), then the gate (:mod:`recon.server.limits`: 429, 503). The model
work runs in a worker thread; streaming sends the finished sample as chunks
(:func:`recon.server.responses.chat_chunks`).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from recon.recovery.model import LocalModel
from recon.server import prompt_logprobs, responses
from recon.server.counts import Counts
from recon.server.limits import Deadlines, Gate, Limits, Scope
from recon.server.schemas import (
    ApiError,
    parse_body,
    parse_chat_request,
    parse_completion_request,
    parse_generate_request,
    to_json,
)

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE")
OPEN_PATHS = ("/health",)  # answered without an API key
_DIGITS = re.compile(r"[0-9]{1,15}")


def log(line: str) -> None:
    """One line on stderr: the server's only output after its start line."""
    print(f"recon serve: {line}", file=sys.stderr, flush=True)


class Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return to_json(content)


def error_response(error: ApiError) -> Json:
    headers = dict(error.headers)
    if error.close:
        headers["Connection"] = "close"
    return Json(error.body(), status_code=error.status, headers=headers)


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


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Front:
    """ASGI middleware: what is checked before any route (method, header count, Host, API key);
    paths lose a trailing slash, as ``/v1/models/`` is ``/v1/models``."""

    def __init__(self, app: Callable, *, loopback_only: bool, api_key: str | None, max_headers: int):
        self.app, self.loopback_only, self.max_headers = app, loopback_only, max_headers
        self.api_key = api_key.encode() if api_key else None

    def check(self, scope: Scope) -> ApiError | None:
        method, headers = scope["method"], scope["headers"]
        if method not in METHODS:
            return ApiError(501, f"Unsupported method ({method[:20]!r})", code="not_implemented", close=True)
        if len(headers) > self.max_headers:
            return ApiError(431, f"more than {self.max_headers} header lines", code="request_header_fields_too_large", close=True)
        host = next((v.decode("latin-1") for k, v in headers if k == b"host"), None)
        if not host_allowed(host, self.loopback_only):
            return ApiError(403, "this server answers to localhost only (Host header)", code="forbidden_host", close=True)
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            given = next((v for k, v in headers if k == b"authorization"), b"")
            scheme, _, key = given.partition(b" ")
            if scheme.lower() != b"bearer" or not key.strip():
                return ApiError(401, "no API key: send the header 'Authorization: Bearer KEY'", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
            if not hmac.compare_digest(key.strip(), self.api_key):
                return ApiError(401, "Incorrect API key provided.", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return None

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = {**scope, "path": scope["path"].rstrip("/") or "/"}
        error = self.check(scope)
        if error is not None:
            return await error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)


class Guard:
    """The outermost ASGI layer: an exception that got past everything else (a bug) is one line on
    stderr and a 500 in OpenAI's shape, never uvicorn's traceback."""

    def __init__(self, app: Callable):
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        state = {"started": False, "complete": False}

        async def tracked(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            if scope["type"] != "http":
                raise
            log(f"{scope.get('path', '')[:100]}: {type(e).__name__}: {str(e)[:300]}")
            if not state["started"]:
                error = ApiError(500, f"internal error: {type(e).__name__}", type="server_error", code="internal_error",
                                 close=True)
                await error_response(error)(scope, receive, send)
            elif not state["complete"]:
                abort = scope.get("extensions", {}).get("recon", {}).get("abort")
                if abort is not None:
                    abort()


async def read_json(request: Request, limits: Limits) -> dict:
    """The body as a JSON object, its framing checked before a byte of it is read."""
    headers = request.headers
    if "transfer-encoding" in headers:
        raise ApiError(411, "chunked bodies are not supported; send Content-Length", code="length_required", close=True)
    lengths = headers.getlist("content-length")
    if not lengths:
        raise ApiError(411, "Content-Length is required", code="length_required", close=True)
    if len({v.strip() for v in lengths}) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
        raise ApiError(400, f"invalid Content-Length {', '.join(lengths)[:50]!r}", code="invalid_content_length", close=True)
    length = int(lengths[0])
    if length > limits.max_body_bytes:
        raise ApiError(413, f"the body is {length} bytes; this server takes at most {limits.max_body_bytes}",
                       code="request_too_large", close=True)
    data = bytearray()
    try:
        async for chunk in request.stream():
            data += chunk
            if len(data) > limits.max_body_bytes:  # h11 holds the client to its Content-Length; this is a second lock
                raise ApiError(413, f"the body is over {limits.max_body_bytes} bytes", code="request_too_large", close=True)
    except ClientDisconnect:
        raise ApiError(400, f"the body ended after {len(data)} of {length} bytes", code="incomplete_body", close=True) from None
    media = (headers.get("content-type") or "").split(";")[0].strip().lower()
    if media != "application/json":  # a web page can only send JSON after a CORS preflight, which fails here
        raise ApiError(415, f"send Content-Type: application/json, not {media[:60] or 'nothing'}", code="unsupported_media_type")
    return parse_body(bytes(data))


def create_app(model: LocalModel, limits: Limits | None = None, *, api_key: str | None = None,
               loopback_only: bool = True) -> Callable:
    """The ASGI app serving ``model``: FastAPI routes inside :class:`Front`, :class:`Deadlines`
    and :class:`Guard`. ``app.state`` of the FastAPI app holds the gate, the model lock and what
    the scoring routes computed (:class:`~recon.server.counts.Counts`, also ``GET /counts``)."""
    limits = limits or Limits()
    lock = threading.Lock()  # one model batch at a time: sampling seeds torch's global generator
    gate = Gate(limits.max_concurrency, limits.max_queue, limits.queue_timeout)
    counts = Counts()
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    api.state.gate, api.state.lock, api.state.counts = gate, lock, counts
    card = {"id": model.name, "object": "model", "created": 0, "owned_by": "recon",
            "max_model_len": responses.context_length(model)}

    @api.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> Json:
        return error_response(error)

    @api.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException) -> Json:
        method, path = request.method, request.url.path
        if error.status_code == 405:
            allow = ", ".join(m for m in (error.headers or {}).get("Allow", "").split(", ") if m and m != "HEAD")
            return error_response(ApiError(405, f"{path[:200]} takes {allow}, not {method}", code="method_not_allowed",
                                           headers={"Allow": allow}))
        if error.status_code == 404:
            return error_response(ApiError(404, f"no route {method} {path[:200]}", code="not_found"))
        return error_response(ApiError(error.status_code, str(error.detail)[:200], code=f"http_{error.status_code}"))

    @api.exception_handler(Exception)
    async def _bug(request: Request, error: Exception) -> Json:  # Guard logs it when Starlette re-raises
        return error_response(ApiError(500, f"internal error: {type(error).__name__}", type="server_error",
                                       code="internal_error"))

    async def health() -> Json:
        return Json({"status": "ok"})

    async def models() -> Json:
        return Json({"object": "list", "data": [card]})

    async def counted() -> Json:
        return Json(counts.snapshot())

    async def model_card(model_id: str) -> Json:
        if model_id != model.name:
            raise ApiError(404, f"The model `{model_id[:200]}` does not exist; this server serves `{model.name}`.",
                           param="model", code="model_not_found")
        return Json(card)

    async def chat(request: Request) -> Response:
        body = await read_json(request, limits)
        req = parse_chat_request(body, served=model.name, max_tokens=limits.max_tokens)
        async with gate.enter():
            response, samples = await anyio.to_thread.run_sync(responses.run_chat, model, req, lock)
        if not req.stream:
            return Json(response)

        async def events() -> AsyncIterator[bytes]:
            for data in responses.encode_events(responses.chat_chunks(model, req, response, samples), log):
                yield data

        return StreamingResponse(events(), media_type="text/event-stream; charset=utf-8", headers={"Cache-Control": "no-cache"})

    async def completions(request: Request) -> Json:
        body = await read_json(request, limits)
        req = parse_completion_request(body, served=model.name, vocab_size=model.tokenizer.vocab_size,
                                       max_tokens=limits.max_tokens)
        async with gate.enter():
            return Json(await anyio.to_thread.run_sync(responses.run_completion, model, req, lock, counts))

    async def generate(request: Request) -> Json:  # SGLang's native route (no /v1)
        body = await read_json(request, limits)
        req = parse_generate_request(body, vocab_size=model.tokenizer.vocab_size, max_tokens=limits.max_tokens)
        async with gate.enter():
            return Json(await anyio.to_thread.run_sync(prompt_logprobs.run_generate, model, req, lock, counts))

    api.add_api_route("/health", health, methods=["GET"])
    api.add_api_route("/counts", counted, methods=["GET"])
    api.add_api_route("/generate", generate, methods=["POST"])
    for prefix in ("/v1", ""):
        api.add_api_route(prefix + "/models", models, methods=["GET"])
        api.add_api_route(prefix + "/models/{model_id:path}", model_card, methods=["GET"])
        api.add_api_route(prefix + "/chat/completions", chat, methods=["POST"])
        api.add_api_route(prefix + "/completions", completions, methods=["POST"])
    front = Front(api, loopback_only=loopback_only, api_key=api_key, max_headers=limits.max_headers)
    app = Guard(Deadlines(front, limits.timeout))
    app.api = api  # type: ignore[attr-defined]
    return app
