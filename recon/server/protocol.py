"""uvicorn's h11 protocol with the limits it lacks before a request reaches the app.

It exists because, measured on uvicorn 0.55 with h11 (see docs/security.md), stock uvicorn

* arms ``timeout_keep_alive`` only after a response: a connection that never sends a byte, and
  one that sends its head or body a byte a second, is held for as long as the client likes (any
  byte cancels the timer);
* checks ``limit_concurrency`` only once a whole request head has arrived, and answers it in
  plain text; idle connections beyond the cap are accepted and held;
* answers every malformed request with a plain-text 400 (a header block over
  ``h11_max_incomplete_event_size`` too, which should be 431), and has no limit on the number
  of header lines.

:class:`Protocol` keeps uvicorn's parsing and ASGI cycle and adds: a refusal (503, OpenAI's
error object) at connect time beyond ``max_connections``; the keep-alive timer from the moment
a connection opens; a deadline for the request head (``timeout`` seconds from its first byte,
then 408); 414 for a request line and 431 for a head or a header count over the limits, answered
exactly when the limit is passed; and every protocol error as OpenAI's error object. It also
hands the app (:class:`recon.server.limits.Deadlines`) the time the request's first byte came
and a way to drop the connection, in ``scope["extensions"]["recon"]``.
"""

from __future__ import annotations

import asyncio
import re
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from recon.server.limits import Limits, busy, request_timeout
from recon.server.schemas import ApiError, to_json

GRACE = 1.0  # seconds past the request deadline before the connection is dropped without an answer
_HEAD_END = re.compile(rb"\n\r?\n")  # where h11 finds the end of a request head


def phrase_code(status: int) -> str:
    """``431`` -> ``request_header_fields_too_large``: the code for an error named by its status."""
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return re.sub(r"[^a-z]+", "_", phrase.lower()).strip("_")


def raw_response(error: ApiError) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, for when there is no ASGI cycle to send it."""
    body = to_json(error.body())
    reason = HTTPStatus(error.status).phrase if error.status in HTTPStatus._value2member_map_ else "Error"
    head = [f"HTTP/1.1 {error.status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close", *(f"{k.lower()}: {v}" for k, v in error.headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Head:
    """A request head as it arrives, checked against the limits one chunk at a time (each byte is
    looked at once, however finely the client splits its head)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.data = bytearray()
        self.newlines = 0
        self.first_newline = -1

    def add(self, chunk: bytes) -> ApiError | None:
        """Take ``chunk``; what is wrong with the head so far, or None."""
        start = len(self.data)
        self.data += chunk
        end = _HEAD_END.search(self.data, max(0, start - 2))  # the blank line may straddle two chunks
        stop = end.start() + 1 if end else len(self.data)
        self.newlines += self.data.count(b"\n", start, max(start, stop))
        if self.first_newline < 0:
            self.first_newline = self.data.find(b"\n", start, max(start, stop))
        line = self.first_newline if self.first_newline >= 0 else stop
        if line > self.limits.max_request_line:
            return ApiError(414, f"the request line is over {self.limits.max_request_line} bytes", code=phrase_code(414))
        if stop > self.limits.max_header_bytes:
            return ApiError(431, f"the request head is over {self.limits.max_header_bytes} bytes", code=phrase_code(431))
        if self.newlines - 1 > self.limits.max_headers:
            return ApiError(431, f"more than {self.limits.max_headers} header lines", code=phrase_code(431))
        return None


def head_problem(head: bytes, limits: Limits) -> ApiError | None:
    """What is wrong with a request head (complete or still arriving), or None."""
    return Head(limits).add(head)


class _Connection(h11.Connection):
    """h11's connection, remembering the protocol error it raised (uvicorn's handler gets only a
    fixed message)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.last_error = e
            raise


class Protocol(H11Protocol):
    """One connection. :func:`protocol_for` makes the subclass that knows the limits."""

    limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.limits.max_header_bytes)
        self._head = Head(self.limits)  # the request head so far
        self._started: float | None = None  # loop time of the current request's first byte
        self._timer: asyncio.TimerHandle | None = None
        self._finished = False  # answered here and closing: ignore whatever else arrives

    # -- the connection ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self.transport, self._finished = transport, True
            transport.write(raw_response(busy("too many open connections; retry later", 503, "server_overloaded")))
            transport.close()
            return
        super().connection_made(transport)
        # silence before the first request counts like silence between requests
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.flow is None:  # refused in connection_made: uvicorn never knew it
            return
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drop the connection now, unsent data and all (a client that stopped reading)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    # -- the request head --------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._finished or self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # bytes of a request head
            if self._started is None:
                self._started = self.loop.time()
                self._set_timer(self.limits.timeout)
            problem = self._head.add(data)
            if problem is not None:
                return self._answer(problem)
        super().data_received(data)
        self._check_done()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None:  # a new request; its ASGI task has not run yet
            started = self._started if self._started is not None else self.loop.time()
            self._started = started
            self.scope.setdefault("extensions", {})["recon"] = {"started": started, "abort": self.abort}  # type: ignore[typeddict-unknown-key]
            self._head = Head(self.limits)
            # the app answers a late body itself (408); this only drops a connection it could not answer on
            self._set_timer(started + self.limits.timeout + GRACE - self.loop.time())
        self._check_done()

    def _check_done(self) -> None:
        """Once a request has fully arrived its deadline is over; the next one starts its own."""
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED) and self._started is not None:
            self._cancel_timer()
            self._started = None

    def _set_timer(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(max(0.0, delay), self._too_slow)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self) -> None:
        self._timer = None
        if self._finished or self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # the head is still arriving
            self._answer(request_timeout(self.limits.timeout))
        elif self.conn.their_state is h11.SEND_BODY:
            self.abort()

    # -- answers without the app -------------------------------------------------------------------
    def _answer(self, error: ApiError) -> None:
        self._finished = True
        self._cancel_timer()
        self._unset_keepalive_if_required()
        self.transport.write(raw_response(error))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, as OpenAI's error object with h11's
        reason and status (400, 431 for an oversized head, 501 for an unknown transfer coding)."""
        error = self.conn.last_error
        status = getattr(error, "error_status_hint", 400) or 400
        reason = str(error) if error is not None and str(error) else msg
        code = "invalid_content_length" if "content-length" in reason.lower() else phrase_code(status)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # broken mid-body: the app must not answer too
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self._finished = True
                self.transport.close()
                return
        self._answer(ApiError(status, f"invalid HTTP request: {reason[:200]}", code=code))


def protocol_for(limits: Limits) -> type[Protocol]:
    """The protocol class for uvicorn's ``Config(http=...)``, bound to ``limits``."""
    return type("Protocol", (Protocol,), {"limits": limits})
