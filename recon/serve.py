"""``recon serve``: a small OpenAI-compatible server over the local model.

``POST /v1/chat/completions`` answers with text as an OpenAI-compatible server does and, when
the request asks (``return_token_ids``, ``logprobs``, ``return_tokens_as_token_ids``: vLLM's
names), with the sampled ids. ``GET /v1/models`` lists the model. It exists so the client and
the importers are tested against a real server, started by the tests on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .generate import LocalModel, Sample, batch_seed
from .importers import to_vllm_chat
from .records import Record


class _BadRequest(Exception):
    pass


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _BadRequest(f"'{key}' must be a number in [{lo}, {hi}]")
    return value


def complete(model: LocalModel, body: dict, lock: threading.Lock) -> dict:
    """One chat completion for a request body (OpenAI fields plus vLLM's id options)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list")
    n = int(_number(body, "n", 1, 1, 16))
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    max_tokens = int(_number(body, "max_tokens", body.get("max_completion_tokens") or 128, 1, 4096))
    seed = int(_number(body, "seed", 0, 0, 2**63 - 1))
    try:
        prompt_ids = model.tokenizer.encode(model.render(messages))
    except Exception as e:  # a template error on odd messages is the client's problem
        raise _BadRequest(f"cannot render messages with the chat template: {e}") from None
    with lock:
        samples: list[Sample] = model.sample([prompt_ids] * n, temperature=temperature, top_p=top_p,
                                             max_new_tokens=max_tokens, seed=batch_seed(seed, 0))
    request_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    want_logprobs = bool(body.get("logprobs"))
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    choices = []
    for k, sample in enumerate(samples):
        resp = model.response(sample, logprobs=want_logprobs)
        if want_logprobs and as_ids:
            for entry, tid in zip(resp.logprobs, sample.output_ids):
                entry.token_id = tid
        rec = Record(request_id, "served", sample.output_ids, resp, prompt_ids)
        out = to_vllm_chat(rec, model=model.name, return_token_ids=bool(body.get("return_token_ids")), tokens_as_ids=as_ids)
        choice = out["choices"][0]
        choice["index"] = k
        choices.append(choice)
    out["choices"] = choices
    out["usage"]["completion_tokens"] = sum(len(s.output_ids) for s in samples)
    out["usage"]["total_tokens"] = out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    return out


def make_server(model: LocalModel, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": model.name, "object": "model", "owned_by": "recon"}]})
            elif self.path == "/health":
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._error(404, f"no route {self.path}")
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise _BadRequest("the body must be a JSON object")
                if body.get("stream"):
                    raise _BadRequest("streaming is not supported by recon serve")
                self._send(200, complete(model, body, lock))
            except json.JSONDecodeError as e:
                self._error(400, f"the body is not valid JSON ({e.msg})")
            except _BadRequest as e:
                self._error(400, str(e))

        def log_message(self, format: str, *args) -> None:  # quiet by default
            pass

    return ThreadingHTTPServer((host, port), Handler)
