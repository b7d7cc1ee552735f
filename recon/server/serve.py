"""``recon serve``: a small OpenAI-compatible server over the local model, on FastAPI + uvicorn.

Routes: ``POST /v1/chat/completions`` (also ``stream: true``), ``POST /v1/completions`` (prompt
scoring and plain continuation, vLLM-style), ``GET /v1/models``, ``GET /v1/models/{id}``,
``GET /health`` (each also without the ``/v1``), SGLang's native ``POST /generate``
(:mod:`~recon.server.prompt_logprobs`) and ``GET /counts`` (what the scoring routes computed:
:mod:`~recon.server.counts`). Token ids come back in the fields vLLM users know:
``return_token_ids`` puts ``token_ids`` on each choice and ``prompt_token_ids`` at the top level
of a chat completion (on the choice of a text completion); ``return_tokens_as_token_ids`` writes
logprob tokens as ``token_id:N``; ``prompt_logprobs`` scores every prompt position, as does
``/generate`` with ``return_logprob`` (``token_ids_logprob`` for chosen ids at every position).

It exists so the client, the importers and recovery are tested against a real server, so it is
built to survive what a real server meets:

* Every bad request is an OpenAI-style JSON error, ``{"error": {"message", "type", "param",
  "code"}}``, with the status OpenAI uses: 400 for malformed JSON, wrong types and values out of
  range, 401 without the API key (when one is set), 403 for a foreign ``Host`` on a loopback
  server (DNS rebinding), 404 for an unknown route (``model_not_found`` for another model), 405
  for a wrong method, 408 for a request that takes longer than ``timeout`` to arrive, 411
  without ``Content-Length``, 413 for a body over the cap (refused from the header, never read),
  414/431 for an oversized request line or head, 415 for a body that is not
  ``application/json``, 429 when the queue is full, 503 when a queued request waited
  ``queue_timeout`` or the connections are all taken. Nothing a client sends produces a traceback.
* Load is bounded: at most ``max_concurrency`` requests at the model, ``max_queue`` more wait
  (each at most ``queue_timeout``), anything beyond is told 429 at once; connections are capped;
  every request must arrive within ``timeout`` of its first byte, and idle connections close
  after ``keep_alive``.
* The model runs one batch at a time (a lock): sampling seeds torch's global generator, so one
  at a time is what keeps a seeded request reproducible.
* It binds 127.0.0.1 unless told otherwise, and refuses any other address without an API key.

The pieces: :mod:`~recon.server.schemas` (request models), :mod:`~recon.server.fields` (field
validators, errors), :mod:`~recon.server.responses` (answers from samples),
:mod:`~recon.server.prompt_logprobs` (SGLang's ``/generate``), :mod:`~recon.server.counts` (what
the scoring routes computed), :mod:`~recon.server.limits` (limits, gate, deadlines),
:mod:`~recon.server.protocol` (uvicorn's h11 protocol with the limits it lacks),
:mod:`~recon.server.app` (routes and the checks in front). This module puts them on a socket.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Self

import uvicorn

from recon.errors import ReconError
from recon.recovery.model import LocalModel
from recon.server.app import create_app, host_allowed, is_loopback
from recon.server.limits import Gate, Limits
from recon.server.protocol import protocol_for
from recon.server.schemas import (
    ApiError,
    parse_body,
    parse_chat_request,
    parse_completion_request,
)

__all__ = ["ApiError", "Gate", "Limits", "Server", "host_allowed", "is_loopback", "make_server", "parse_body", "parse_chat_request",
           "parse_completion_request"]


class _OneLine(logging.Formatter):
    """uvicorn's and asyncio's errors as one line each, never a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(record.getMessage().split())[:300]
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f": {type(error).__name__}: {' '.join(str(error).split())[:200]}"
        return f"recon serve: {text}"


def quiet_logs() -> None:
    """Errors only, one line each: the server prints nothing else after its start line."""
    handler = logging.StreamHandler()
    handler.setFormatter(_OneLine())
    for name in ("uvicorn", "asyncio"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.ERROR)
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("transformers").setLevel(logging.ERROR)  # its per-request generation warnings


class Server:
    """A bound, listening socket and the uvicorn server that will serve it. ``serve_forever``
    blocks (the CLI); ``start``/``stop`` run it in a thread (tests); also a context manager."""

    def __init__(self, app, host: str, port: int, limits: Limits):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=128)
        self.server_address = self.socket.getsockname()[:2]
        self.server_port: int = self.server_address[1]
        self.limits = limits
        self.app = app
        config = uvicorn.Config(
            app, http=protocol_for(limits), lifespan="off", log_config=None, access_log=False, proxy_headers=False,
            server_header=False, headers=[("server", "recon-serve")],
            timeout_keep_alive=limits.keep_alive,  # type: ignore[arg-type]  # a float works: it goes to call_later
            # the cap is enforced at connect time (recon.server.protocol); uvicorn's own check, one higher, is a backstop
            limit_concurrency=limits.max_connections + 1,
            h11_max_incomplete_event_size=limits.max_header_bytes, backlog=128, timeout_graceful_shutdown=3,
        )
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.server_port}/v1"

    def serve_forever(self) -> None:
        quiet_logs()
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def start(self, timeout: float = 30.0) -> Self:
        self._thread = threading.Thread(target=self.serve_forever, name="recon-serve", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self.uvicorn.started:
            if time.monotonic() > end or not self._thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def make_server(model: LocalModel, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None, *,
                api_key: str | None = None) -> Server:
    """The server, bound to ``host`` (loopback by default) and ready for ``serve_forever`` or
    ``start``. Another address needs ``api_key``: requests then need ``Authorization: Bearer KEY``."""
    limits = limits or Limits()
    loopback = is_loopback(host)
    if not loopback and not api_key:
        raise ReconError(f"--host {host} is not a loopback address; anyone who can reach it could use the model: "
                         "give --api-key KEY (or set RECON_API_KEY)")
    app = create_app(model, limits, api_key=api_key, loopback_only=loopback)
    return Server(app, host, port, limits)
