"""How much ``recon serve`` takes on, and for how long: the limits and the two pieces that enforce
them inside the ASGI app.

It exists because uvicorn bounds connections and idle keep-alive time but not the time a
request takes to arrive, nor the requests that wait for the model:

* :class:`Gate` lets ``max_concurrency`` requests at the model at once and ``max_queue`` more
  wait; anyone beyond is told 429 at once, and a request that waited ``queue_timeout`` seconds
  is told 503 instead of waiting on.
* :class:`Deadlines` wraps ``receive`` so that the body must have arrived ``timeout`` seconds
  after the request's first byte (408 otherwise: a client trickling its body cannot hold a
  connection), and wraps ``send`` so that a client that stops reading is dropped after
  ``timeout`` seconds without progress. An answer given before the body was read closes the
  connection (the unread rest is never waited for).

What happens before the ASGI app sees a request (the connection cap, slow or oversized request
heads) is in :mod:`recon.server.protocol`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from recon.server.schemas import ApiError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    """What one server accepts. The defaults suit a laptop serving one user."""

    max_concurrency: int = 4  # requests at the model at once (the model itself runs one batch at a time)
    max_queue: int = 32  # requests waiting for a place; beyond this, 429
    queue_timeout: float = 60.0  # seconds a request may wait for a place; then 503
    #: tokens one request may generate (max_tokens x n). Sampling keeps every step's logits, 4 bytes
    #: x the vocabulary (49,152 for SmolLM2: 197 kB) per token, so this also bounds memory (~0.8 GB)
    max_tokens: int = 2048
    max_body_bytes: int = 1_000_000
    max_connections: int = 256  # open connections; beyond this, 503 and close
    #: seconds from a request's first byte to its last (head and body), and the longest a send may stall
    timeout: float = 30.0
    keep_alive: float = 5.0  # seconds an open connection may be silent before or between requests
    max_request_line: int = 65_536  # bytes; beyond, 414
    max_header_bytes: int = 65_536  # the whole request head; beyond, 431
    max_headers: int = 100  # header lines; beyond, 431

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.max_queue < 0 or self.max_connections < 1:
            raise ValueError("need max_concurrency >= 1, max_queue >= 0 and max_connections >= 1")
        if min(self.timeout, self.keep_alive, self.queue_timeout) <= 0:
            raise ValueError("timeouts must be positive")


def busy(message: str, status: int = 429, code: str = "rate_limit_exceeded") -> ApiError:
    kind = "rate_limit_error" if status == 429 else "server_error"
    return ApiError(status, message, type=kind, code=code, headers={"Retry-After": "1"})


class Gate:
    """At most ``running`` requests inside and ``queued`` more waiting; anyone beyond is refused
    at once (429) instead of piling up tasks and memory, and nobody waits longer than
    ``queue_timeout`` seconds (503). Used from the event loop only."""

    def __init__(self, running: int, queued: int, queue_timeout: float = 60.0):
        if running < 1 or queued < 0:
            raise ValueError("need running >= 1 and queued >= 0")
        self._slots: asyncio.Semaphore | None = None  # made in the loop that uses it
        self._running = running
        self._capacity = running + queued
        self.queue_timeout = queue_timeout
        self.inside = 0  # running + waiting

    @asynccontextmanager
    async def enter(self) -> AsyncIterator[None]:
        if self.inside >= self._capacity:
            raise busy(f"the server is busy ({self._capacity} requests in flight or queued); retry later")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._running)
        self.inside += 1
        try:
            try:
                async with asyncio.timeout(self.queue_timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise busy(f"waited {self.queue_timeout:g} s in the queue for the model; retry later", 503,
                           "queue_timeout") from None
            try:
                yield
            finally:
                self._slots.release()
        finally:
            self.inside -= 1


def request_timeout(timeout: float) -> ApiError:
    return ApiError(408, f"the request did not arrive within {timeout:g} s; closing", code="request_timeout", close=True)


def _declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


class Deadlines:
    """ASGI middleware: the whole request (from its first byte, as :mod:`recon.server.protocol`
    records it) within ``timeout`` seconds, no send stalled longer than that."""

    def __init__(self, app: Callable, timeout: float):
        self.app, self.timeout = app, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        connection = scope.get("extensions", {}).get("recon", {})
        deadline = connection.get("started", loop.time()) + self.timeout
        abort = connection.get("abort")
        pending = _declares_body(scope["headers"])  # body bytes still to come
        gone = False

        async def receive_in_time() -> dict:
            nonlocal pending
            if not pending:  # the body is in: from now on receive only waits for a disconnect
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise request_timeout(self.timeout) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                pending = False
            return message

        async def send_in_time(message: dict) -> None:
            nonlocal gone
            if gone:
                return
            if message["type"] == "http.response.start" and pending:  # answered before the body was read
                headers = list(message.get("headers", []))
                if (b"connection", b"close") not in headers:
                    message = {**message, "headers": headers + [(b"connection", b"close")]}
            try:
                async with asyncio.timeout(self.timeout):
                    await send(message)
            except TimeoutError:  # the client stopped reading: drop it rather than hold its task
                gone = True
                if abort is not None:
                    abort()

        await self.app(scope, receive_in_time, send_in_time)
