"""What a record keeps of the request that produced it: the fields its chat template rendered the
prompt from (``messages``, ``tools``, ``chat_template_kwargs``), from a request body, an OpenAI
Batch input line, or a file of them joined to their responses by id.

A response alone does not say what prompt the model saw; OpenRouter and the Batch API never
report prompt ids. Keeping the request is what lets :mod:`recon.prompts` render that prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from recon.samples.io import RecordError, iter_json_lines


#: what a record keeps of the request that produced it: the fields its chat template rendered the
#: prompt from, under the names the OpenAI / vLLM / SGLang chat request gives them
REQUEST_FIELDS = ("messages", "tools", "chat_template_kwargs")


def request_fields(request: Any) -> dict:
    """The record fields a chat request carries (:data:`REQUEST_FIELDS`): a request body, or an
    OpenAI Batch input line (``{"custom_id", "body": {...}}``). SGLang and vLLM also take the
    template switches inside ``extra_body`` when a client sends them that way."""
    if not isinstance(request, dict):
        raise ValueError(f"request: expected an object, got {type(request).__name__}")
    body = request.get("body") if isinstance(request.get("body"), dict) else request
    found = {k: body[k] for k in REQUEST_FIELDS if body.get(k) is not None}
    extra = body.get("extra_body")
    if "chat_template_kwargs" not in found and isinstance(extra, dict) and extra.get("chat_template_kwargs") is not None:
        found["chat_template_kwargs"] = extra["chat_template_kwargs"]
    return found


def read_requests(paths: Iterable[str | Path], errors: list[RecordError]) -> dict[str, dict]:
    """The requests that produced a file of responses, by id: OpenAI Batch input lines
    (``{"custom_id", "method", "url", "body": {...}}``, joined to the Batch output by
    ``custom_id``) or ``{"id": ..., "request": {...}}`` / ``{"id": ..., "messages": ...}`` lines.
    Bad lines go to ``errors``; a repeated id is one too (which request produced the response?)."""
    found: dict[str, dict] = {}
    for path in paths:
        for line, obj in iter_json_lines(Path(path)):
            if isinstance(obj, RecordError):
                errors.append(obj)
                continue
            rid = obj.get("custom_id", obj.get("id")) if isinstance(obj, dict) else None
            if not isinstance(rid, (str, int)) or isinstance(rid, bool):
                errors.append(RecordError(str(path), line, "custom_id", "missing: a request line needs custom_id or id"))
                continue
            try:
                fields = request_fields(obj.get("request", obj))
            except ValueError as e:
                field_name, _, problem = str(e).partition(": ")
                errors.append(RecordError(str(path), line, field_name, problem or str(e)))
                continue
            if str(rid) in found:
                errors.append(RecordError(str(path), line, "custom_id", f"duplicate request id {rid!r}"))
                continue
            found[str(rid)] = fields
    return found
