"""A minimal OpenAI-compatible client: send prompts, keep what the server returns as records."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Iterator, Sequence

from recon.errors import ReconError
from recon.recovery.model import Prompt
from recon.samples.importers import from_chat_completion
from recon.samples.records import Record, parse_record

RETRY_STATUSES = (429, 503)  # the server is busy: wait and ask again


def _error_message(raw: bytes) -> str:
    """The ``message`` of an OpenAI-style error body, or the start of whatever came back."""
    text = raw.decode("utf-8", "replace")
    try:
        message = json.loads(text)["error"]["message"]
        if isinstance(message, str):
            return message[:300]
    except (ValueError, KeyError, TypeError):
        pass
    return text[:300]


def chat(url: str, body: dict, *, timeout: float = 600.0, api_key: str | None = None, retries: int = 5) -> dict:
    """POST one chat completion request to ``url`` (the server's base, e.g. http://127.0.0.1:8000/v1).

    A busy server (429 or 503) is asked again up to ``retries`` times, after the ``Retry-After``
    it names (at most 30 s) or a doubling pause; any other error status is a one-line
    :class:`ReconError` with the server's message.
    """
    endpoint = url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode()
    attempt = 0
    while True:
        request = urllib.request.Request(endpoint, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as e:
            detail = _error_message(e.read())
            if e.code in RETRY_STATUSES and attempt < retries:
                after = e.headers.get("Retry-After", "")
                time.sleep(min(30.0, float(after)) if after.isdigit() else min(30.0, 0.5 * 2**attempt))
                attempt += 1
                continue
            raise ReconError(f"{endpoint}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise ReconError(f"{endpoint}: cannot reach the server ({getattr(e, 'reason', e)})") from None
        except ValueError as e:
            raise ReconError(f"{endpoint}: the reply is not JSON ({e})") from None


def collect(url: str, prompts: Sequence[Prompt], *, dataset: str, model: str | None = None, n: int = 1,
            temperature: float = 0.7, top_p: float = 1.0, max_tokens: int = 128, seed: int = 0,
            token_ids: bool = True, logprobs: bool = True, api_key: str | None = None) -> Iterator[Record]:
    """One request per prompt; records carry the response, and the ids when the server returns them."""
    for k, prompt in enumerate(prompts):
        body = {"model": model or "default", "messages": prompt.messages, "n": n, "temperature": temperature,
                "top_p": top_p, "max_tokens": max_tokens, "seed": seed + k, "logprobs": logprobs}
        if token_ids:
            body["return_token_ids"] = True
        reply = chat(url, body, api_key=api_key)
        for rec in from_chat_completion(reply, prompt.id):
            rec["messages"] = prompt.messages
            parsed = parse_record(rec, path=url, line=k + 1, default_dataset=dataset)
            if isinstance(parsed, list):
                raise ReconError("; ".join(str(e) for e in parsed))
            yield parsed
