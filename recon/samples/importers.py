"""Importers: what servers return, turned into the sample format.

* SGLang native ``/generate``: ``text``, ``output_ids``, ``meta_info`` (``id``,
  ``finish_reason: {"type": ...}``, ``output_token_logprobs: [[logprob, token_id, text], ...]``).
* vLLM chat completions with ``return_token_ids``: ``choices[].token_ids``, top-level
  ``prompt_token_ids`` (SGLang chat and vLLM ``/v1/completions``: on each choice); logprob
  tokens as ``"token_id:N"`` with ``return_tokens_as_token_ids``.
* OpenAI / OpenRouter chat completions: ``message.reasoning_content`` (or ``reasoning``, or
  OpenRouter's ``reasoning_details`` of type ``reasoning.text``), ``content``, ``tool_calls`` (or
  the legacy ``function_call``), ``logprobs.content[].{token, bytes}`` (``bytes`` that are only a
  U+FFFD text re-encoded, as vLLM makes them, are dropped); OpenAI Batch output lines.

Each input line is one server response (a JSON object, or a JSON array of them for batched
SGLang calls), optionally wrapped as ``{"id": ..., "response": <server response>,
"messages": ..., "tools": ..., "chat_template_kwargs": ...}`` or ``{"id": ..., "request": <the
request sent>, "response": ...}`` (the record keeps the request's messages, tools and template
switches: what its prompt is rendered from; and ``conversation`` / ``turn`` from the wrapper or
the request, which link a multi-turn trajectory's generations); OpenAI Batch input files join their output by
``custom_id`` (:func:`read_requests`); streamed ``chat.completion.chunk`` lines are joined per ``id``. Rendering
records back into each server's shape is :mod:`recon.samples.render`.
The shapes each engine documents are in ``tests/data/importers/SOURCES.md``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from recon.errors import ReconError
from recon.samples.io import RecordError, iter_json_lines
from recon.samples.records import (
    Record,
    dataset_name,
    iter_records,
    parse_record,
    write_records,
)
from recon.samples.requests import REQUEST_FIELDS, read_requests, request_fields

#: what links a record to its trajectory, kept from the wrapper (or the request) as it is
LINKS = ("conversation", "turn")
TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def _unwrap(obj: dict) -> tuple[Any, dict, dict]:
    """(record id or None, the server response, extra record fields) for one input object."""
    if "custom_id" in obj or (isinstance(obj.get("response"), dict) and isinstance(obj["response"].get("body"), dict)):
        body = obj["response"].get("body") if isinstance(obj.get("response"), dict) else None  # OpenAI Batch output
        return obj.get("custom_id") or obj.get("id"), body if isinstance(body, dict) else {"error": obj.get("error") or "no response body"}, {}
    if isinstance(obj.get("response"), dict) and ("choices" in obj["response"] or "meta_info" in obj["response"]):
        extra = {k: obj[k] for k in ("meta", "dataset", "prompt_ids", *REQUEST_FIELDS, *LINKS) if k in obj}
        if obj.get("request") is not None:  # {"request": <what was sent>, "response": <what came back>}
            request = obj["request"]
            links = {k: request[k] for k in LINKS if isinstance(request, dict) and k in request}
            extra = {**request_fields(request), **links, **extra}
        return obj.get("id"), obj["response"], extra
    return None, obj, {}


def _server_error(obj: dict) -> None:
    """Raise on an error object: ``{"error": ...}`` (OpenAI, OpenRouter), ``{"object": "error"}`` (vLLM, SGLang)."""
    err = obj if obj.get("object") == "error" else obj.get("error")
    if isinstance(err, dict):
        err = err.get("message") or err.get("code") or json.dumps(err)
    if err:
        raise ValueError(f"error: the server answered with an error, not a completion: {err}")


def _logprobs_openai(lp: Any) -> dict | None:
    if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return None
    entries = []
    for e in lp["content"]:
        if not isinstance(e, dict):
            return {"content": lp["content"]}  # let validation name the bad entry
        token = e.get("token")
        entry = {"token": token, "bytes": e.get("bytes"), "logprob": e.get("logprob")}
        m = TOKEN_ID.match(token) if isinstance(token, str) else None
        if m:  # vLLM --return-tokens-as-token-ids
            entry["token_id"] = int(m.group(1))
            entry["bytes"] = None
        elif isinstance(e.get("token_id"), int):
            entry["token_id"] = e["token_id"]
        if isinstance(token, str) and "\ufffd" in token and entry["bytes"] == list(token.encode("utf-8")):
            entry["bytes"] = None  # the replaced text's bytes (vLLM), not the token's: unknown
        entries.append(entry)
    return {"content": entries}


def _reasoning(message: dict) -> Any:
    for key in ("reasoning_content", "reasoning"):  # DeepSeek, SGLang, vLLM < 0.11; vLLM, OpenRouter
        if message.get(key) is not None:
            return message[key]
    details = message.get("reasoning_details")  # OpenRouter: only reasoning.text is the model's own text
    texts = [d["text"] for d in details if isinstance(d, dict) and d.get("type") == "reasoning.text"
             and isinstance(d.get("text"), str)] if isinstance(details, list) else []
    return "".join(texts) if texts else None


def _message_response(choice: dict, k: int) -> dict:
    message = choice.get("message", {})
    if not isinstance(message, dict):
        raise ValueError(f"choices[{k}].message: expected an object, got {type(message).__name__}")
    calls = message.get("tool_calls") or None
    if calls is None and isinstance(message.get("function_call"), dict):  # OpenAI's legacy function calling
        calls = [{"id": "", "type": "function", "function": message["function_call"]}]
    return {
        "reasoning_content": _reasoning(message),
        "content": message.get("content") if "message" in choice else choice.get("text"),  # /v1/completions: text
        "tool_calls": calls,
        "finish_reason": choice.get("finish_reason"),
        "logprobs": _logprobs_openai(choice.get("logprobs")),
    }


def from_chat_completion(obj: dict, rid: Any = None) -> list[dict]:
    """vLLM / SGLang / OpenAI / OpenRouter chat completion -> sample-format dicts, one per choice."""
    _server_error(obj)
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("choices: missing or empty")
    base = str(rid if rid is not None else obj.get("id", ""))
    out = []
    for k, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise ValueError(f"choices[{k}]: expected an object, got {type(choice).__name__}")
        rec: dict[str, Any] = {"id": base if len(choices) == 1 else f"{base}-{choice.get('index', k)}",
                               "response": _message_response(choice, k)}
        if choice.get("token_ids") is not None:
            rec["output_ids"] = choice["token_ids"]
        prompt = choice.get("prompt_token_ids")  # SGLang chat, vLLM completions: on the choice
        if prompt is None:
            prompt = obj.get("prompt_token_ids")  # vLLM chat: on the response
        if prompt is not None:
            rec["prompt_ids"] = prompt
        meta = {key: obj[key] for key in ("model", "created") if key in obj}
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        if len(choices) == 1 and _count(usage.get("completion_tokens")) is not None:
            meta["completion_tokens"] = usage["completion_tokens"]  # per request: with n > 1 a sum
        if meta:
            rec["meta"] = meta
        out.append(rec)
    return out


def from_sglang(obj: dict, rid: Any = None) -> list[dict]:
    """SGLang native ``/generate`` response -> one sample-format dict (its chat API: as OpenAI's)."""
    _server_error(obj)
    if "choices" in obj and "meta_info" not in obj:
        return from_chat_completion(obj, rid)
    meta_info = obj.get("meta_info")
    if not isinstance(meta_info, dict):
        raise ValueError("meta_info: missing")
    finish = meta_info.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, dict) else finish
    logprobs = None
    lps = meta_info.get("output_token_logprobs")
    if isinstance(lps, list):
        for k, e in enumerate(lps):
            if not (isinstance(e, list) and len(e) >= 2 and type(e[1]) is int):
                raise ValueError(f"meta_info.output_token_logprobs[{k}]: expected [logprob, token_id, text], got {e!r:.60}")
        logprobs = {"content": [
            {"token": e[2] if len(e) > 2 and isinstance(e[2], str) else f"token_id:{e[1]}", "bytes": None,
             "token_id": e[1], "logprob": e[0]}
            for e in lps
        ]}
    ids = obj.get("output_ids")
    if ids is None and isinstance(lps, list):
        ids = [e[1] for e in lps]
    rec: dict[str, Any] = {
        "id": str(rid if rid is not None else meta_info.get("id", "")),
        "response": {"content": obj.get("text"), "reasoning_content": None, "tool_calls": None,
                     "finish_reason": reason, "logprobs": logprobs},
    }
    if ids is not None:
        rec["output_ids"] = ids
    if _count(meta_info.get("completion_tokens")) is not None:
        rec["meta"] = {"completion_tokens": meta_info["completion_tokens"]}
    return [rec]


def _count(value: Any) -> int | None:
    """A token count as servers report it (``usage.completion_tokens``): recovery's length constraint."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# -- streams: chat.completion.chunk lines joined into the completion they make ------------------------
def _is_chunk(obj: dict) -> bool:
    choices = obj.get("choices")
    return obj.get("object") == "chat.completion.chunk" or (
        isinstance(choices, list) and any(isinstance(c, dict) and "delta" in c for c in choices))


class _Stream:
    """The chunks of one streamed chat completion, as one ``chat.completion`` (OpenAI's streaming
    shape; vLLM adds ``token_ids`` per chunk and ``prompt_token_ids`` on the first)."""

    def __init__(self, first: dict, line: int, rid: Any, extra: dict):
        self.line, self.rid, self.extra, self.broken = line, rid, extra, False  # broken: a bad chunk was reported
        self.obj: dict[str, Any] = {k: first[k] for k in ("id", "model", "created") if k in first}
        self.choices: dict[Any, dict] = {}

    def add(self, chunk: dict) -> None:
        if self.broken:
            return
        if chunk.get("prompt_token_ids") is not None and "prompt_token_ids" not in self.obj:
            self.obj["prompt_token_ids"] = chunk["prompt_token_ids"]
        if not isinstance(chunk.get("choices") or [], list):
            raise ValueError("choices: expected a list")
        for k, c in enumerate(chunk.get("choices") or []):
            delta = c.get("delta") if isinstance(c, dict) else None
            if not isinstance(delta, dict):
                raise ValueError(f"choices[{k}].delta: expected an object")
            i = c["index"] if type(c.get("index")) is int else k
            ch = self.choices.setdefault(i, {"index": i, "message": {}, "finish_reason": None})
            msg = ch["message"]
            for key in ("content", "reasoning_content", "reasoning"):
                if delta.get(key) is not None:
                    if not isinstance(delta[key], str):
                        raise ValueError(f"choices[{k}].delta.{key}: expected a string")
                    msg[key] = msg.get(key, "") + delta[key]
            if isinstance(delta.get("reasoning_details"), list):
                msg.setdefault("reasoning_details", []).extend(delta["reasoning_details"])
            for j, t in enumerate(delta.get("tool_calls") or []):
                fn = t.get("function") if isinstance(t, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("arguments", ""), str):
                    raise ValueError(f"choices[{k}].delta.tool_calls[{j}].function: expected name and arguments")
                calls = msg.setdefault("tool_calls", {})
                idx = t["index"] if type(t.get("index")) is int else j
                call = calls.setdefault(idx, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = t.get("id") or call["id"]
                call["function"]["name"] = fn.get("name") or call["function"]["name"]
                call["function"]["arguments"] += fn.get("arguments") or ""
            lp = c.get("logprobs")
            if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                ch.setdefault("logprobs", {"content": []})["content"].extend(lp["content"])
            if isinstance(c.get("token_ids"), list):
                ch["token_ids"] = ch.get("token_ids", []) + c["token_ids"]
            if isinstance(c.get("prompt_token_ids"), list):
                ch.setdefault("prompt_token_ids", c["prompt_token_ids"])
            ch["finish_reason"] = c.get("finish_reason") or ch["finish_reason"]

    @property
    def done(self) -> bool:
        return bool(self.choices) and all(c["finish_reason"] is not None for c in self.choices.values())

    def completion(self) -> dict:
        choices = [dict(c, message={**c["message"], "tool_calls": list(c["message"].get("tool_calls", {}).values())})
                   for c in self.choices.values()]
        return {**self.obj, "object": "chat.completion", "choices": choices}


IMPORTERS: dict[str, Callable[[dict, Any], list[dict]]] = {
    "sglang": from_sglang,
    "vllm": from_chat_completion,
    "openai": from_chat_completion,
}


def _bad(path: Path, line: int, e: ValueError) -> RecordError:
    field_name, _, problem = str(e).partition(": ")
    return RecordError(str(path), line, field_name, problem or str(e))


def iter_import(kind: str, path: str | Path, *, dataset: str | None = None, vocab_size: int | None = None,
                requests: dict[str, dict] | None = None) -> Iterator[Record | RecordError]:
    """Records from a file of ``kind`` server responses; bad lines come out as RecordError.
    ``requests`` (:func:`read_requests`): the request fields of each response by its id, joined in."""
    if kind not in IMPORTERS:
        raise ReconError(f"unknown importer {kind!r}; choose one of {', '.join(IMPORTERS)}")
    path = Path(path)
    convert = IMPORTERS[kind]
    default = dataset or dataset_name(path)
    seen: dict[str, int] = {}
    streams: dict[Any, _Stream] = {}  # open streams by id, until every choice has a finish_reason

    def records(line: int, rid: Any, response: dict, extra: dict, convert=convert) -> Iterator[Record | RecordError]:
        try:
            converted = convert(response, rid)
        except ValueError as e:
            yield _bad(path, line, e)
            return
        for rec in converted:
            rec.update(extra)
            if not rec["id"]:
                rec["id"] = f"{default}-{line}"
            parsed = parse_record(rec, path=str(path), line=line, default_dataset=default, vocab_size=vocab_size)
            if isinstance(parsed, list):
                yield from parsed
            elif parsed.id in seen:
                yield RecordError(str(path), line, "id", f"duplicate id {parsed.id!r} (first at line {seen[parsed.id]})")
            else:
                seen[parsed.id] = line
                yield parsed

    def finish(stream: _Stream) -> Iterator[Record | RecordError]:
        if stream.choices and not stream.broken:  # usage-only chunks hold no completion
            yield from records(stream.line, stream.rid, stream.completion(), stream.extra, from_chat_completion)

    for line, obj in iter_json_lines(path, allow_arrays=True):
        if isinstance(obj, RecordError):
            yield obj
            continue
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            if not isinstance(item, dict):
                yield RecordError(str(path), line, "", "expected a server response object")
                continue
            try:
                rid, response, extra = _unwrap(item)
            except ValueError as e:
                yield _bad(path, line, e)
                continue
            if requests is not None:
                extra = {**requests.get(str(rid if rid is not None else response.get("id")), {}), **extra}
            if not _is_chunk(response):
                yield from records(line, rid, response, extra)
                continue
            key = str(rid if rid is not None else response.get("id"))
            stream = streams.setdefault(key, _Stream(response, line, rid, extra))
            try:
                stream.add(response)
            except ValueError as e:
                stream.broken = True
                yield _bad(path, line, e)
            if stream.done:
                yield from finish(streams.pop(key))
    for stream in streams.values():  # streams cut short: what arrived, with no finish_reason
        yield from finish(stream)


# -- files ----------------------------------------------------------------------------------------------
@dataclass
class ImportResult:
    records: int = 0
    errors: list[RecordError] = field(default_factory=list)


def import_file(kind: str, inputs: Iterable[str | Path], out: str | Path, *, dataset: str | None = None,
                meta: dict | None = None, requests: Iterable[str | Path] = ()) -> ImportResult:
    """Every good response of ``inputs`` as a record in ``out``. ``meta`` goes into each record's
    meta: what the responses do not say and recovery needs, the sampler the requests asked for
    (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``sampler_order``, ``engine``).
    ``requests``: files of the requests that produced them (:func:`read_requests`), whose
    messages, tools and template switches each record keeps."""
    result = ImportResult()
    good: list[Record] = []
    joined = read_requests(requests, result.errors) if requests else None
    for path in inputs:
        for item in iter_import(kind, path, dataset=dataset, requests=joined):
            if isinstance(item, RecordError):
                result.errors.append(item)
            else:
                if meta:
                    item.meta = {**(item.meta or {}), **meta}
                good.append(item)
    result.records = write_records(good, out)
    return result


@dataclass
class PairResult:
    paired: int
    only_ground_truth: list[str]
    only_api: list[str]
    errors: list[RecordError]


def pair_files(ground_truth: str | Path, api: str | Path, out: str | Path) -> PairResult:
    """One paired file: ``output_ids`` (and prompt ids) from ``ground_truth``, ``response`` from ``api``,
    matched by (dataset, id) — by id alone when the two files name their datasets differently."""
    errors: list[RecordError] = []

    def load(path) -> dict[str, Record]:
        found = {}
        for item in iter_records(path):
            if isinstance(item, RecordError):
                errors.append(item)
            else:
                found[item.id] = item
        return found

    truth, answers = load(ground_truth), load(api)
    paired = []
    for rid, gt in truth.items():
        answer = answers.get(rid)
        if answer is None:
            continue
        if gt.output_ids is None:
            errors.append(RecordError(*gt.origin, "output_ids", f"record {rid!r} has no output_ids to pair"))
            continue
        if answer.response is None:
            errors.append(RecordError(*answer.origin, "response", f"record {rid!r} has no response to pair"))
            continue
        paired.append(Record(rid, gt.dataset, gt.output_ids, answer.response, gt.prompt_ids or answer.prompt_ids,
                             gt.messages or answer.messages, {**answer.meta, **gt.meta},
                             gt.tools if gt.tools is not None else answer.tools,
                             gt.chat_template_kwargs if gt.chat_template_kwargs is not None else answer.chat_template_kwargs,
                             gt.conversation if gt.conversation is not None else answer.conversation,
                             gt.turn if gt.turn is not None else answer.turn))
    write_records(paired, out)
    return PairResult(len(paired), sorted(set(truth) - set(answers)), sorted(set(answers) - set(truth)), errors)
