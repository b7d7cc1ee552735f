"""Importers: what servers return, turned into the sample format (and rendered back).

* SGLang native ``/generate``: ``text``, ``output_ids``, ``meta_info`` (``id``,
  ``finish_reason: {"type": ...}``, ``output_token_logprobs: [[logprob, token_id, text], ...]``).
* vLLM OpenAI chat completions with ``return_token_ids``: ``choices[].token_ids``,
  top-level ``prompt_token_ids``; logprob tokens as ``"token_id:N"`` with
  ``return_tokens_as_token_ids``.
* OpenAI / OpenRouter chat completions: ``message.reasoning_content`` (or ``reasoning``),
  ``content``, ``tool_calls``, ``logprobs.content[].{token, bytes}``; also the OpenAI Batch
  API's output lines (``custom_id`` + ``response.body``).

Each input line is one server response (a JSON object, or a JSON array of them for batched
SGLang calls), optionally wrapped as ``{"id": ..., "response": <server response>,
"messages": ...}``. ``to_*`` render records back into each server's shape: ``recon serve``
answers with ``to_vllm_chat``, and the tests check that every importer inverts its renderer.
"""

from __future__ import annotations

import re
import time
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

TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def _unwrap(obj: dict) -> tuple[Any, dict, dict]:
    """(record id or None, the server response, extra record fields) for one input object."""
    if isinstance(obj.get("response"), dict) and isinstance(obj["response"].get("body"), dict):  # OpenAI Batch
        return obj.get("custom_id") or obj.get("id"), obj["response"]["body"], {}
    if isinstance(obj.get("response"), dict) and ("choices" in obj["response"] or "meta_info" in obj["response"]):
        extra = {k: obj[k] for k in ("messages", "meta", "dataset", "prompt_ids") if k in obj}
        return obj.get("id"), obj["response"], extra
    return None, obj, {}


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
        entries.append(entry)
    return {"content": entries}


def _message_response(choice: dict) -> dict:
    message = choice.get("message") or {}
    return {
        "reasoning_content": message.get("reasoning_content", message.get("reasoning")),
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls") or None,
        "finish_reason": choice.get("finish_reason"),
        "logprobs": _logprobs_openai(choice.get("logprobs")),
    }


def from_chat_completion(obj: dict, rid: Any = None) -> list[dict]:
    """vLLM / OpenAI / OpenRouter chat completion -> sample-format dicts, one per choice."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("choices: missing or empty")
    base = str(rid if rid is not None else obj.get("id", ""))
    out = []
    for k, choice in enumerate(choices):
        rec: dict[str, Any] = {"id": base if len(choices) == 1 else f"{base}-{choice.get('index', k)}",
                               "response": _message_response(choice)}
        if choice.get("token_ids") is not None:
            rec["output_ids"] = choice["token_ids"]
        if obj.get("prompt_token_ids") is not None:
            rec["prompt_ids"] = obj["prompt_token_ids"]
        meta = {key: obj[key] for key in ("model", "created") if key in obj}
        if meta:
            rec["meta"] = meta
        out.append(rec)
    return out


def from_sglang(obj: dict, rid: Any = None) -> list[dict]:
    """SGLang native ``/generate`` response -> one sample-format dict."""
    meta_info = obj.get("meta_info")
    if not isinstance(meta_info, dict):
        raise ValueError("meta_info: missing")
    finish = meta_info.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, dict) else finish
    logprobs = None
    lps = meta_info.get("output_token_logprobs")
    if isinstance(lps, list):
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
    return [rec]


IMPORTERS: dict[str, Callable[[dict, Any], list[dict]]] = {
    "sglang": from_sglang,
    "vllm": from_chat_completion,
    "openai": from_chat_completion,
}


def iter_import(kind: str, path: str | Path, *, dataset: str | None = None, vocab_size: int | None = None) -> Iterator[Record | RecordError]:
    """Records from a file of ``kind`` server responses; bad lines come out as RecordError."""
    if kind not in IMPORTERS:
        raise ReconError(f"unknown importer {kind!r}; choose one of {', '.join(IMPORTERS)}")
    path = Path(path)
    convert = IMPORTERS[kind]
    default = dataset or dataset_name(path)
    seen: dict[str, int] = {}
    for line, obj in iter_json_lines(path, allow_arrays=True):
        if isinstance(obj, RecordError):
            yield obj
            continue
        items = obj if isinstance(obj, list) else [obj]
        for item in items:
            if not isinstance(item, dict):
                yield RecordError(str(path), line, "", "expected a server response object")
                continue
            rid, response, extra = _unwrap(item)
            try:
                converted = convert(response, rid)
            except ValueError as e:
                field_name, _, problem = str(e).partition(": ")
                yield RecordError(str(path), line, field_name, problem or str(e))
                continue
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


# -- rendering back ------------------------------------------------------------------------------------
def _openai_logprobs(rec: Record, token_ids: bool) -> dict | None:
    if rec.response is None or rec.response.logprobs is None:
        return None
    content = []
    for t in rec.response.logprobs:
        if token_ids and t.token_id is not None:
            content.append({"token": f"token_id:{t.token_id}", "logprob": t.logprob, "bytes": None, "top_logprobs": []})
        else:
            content.append({"token": t.token, "logprob": t.logprob, "bytes": t.bytes, "top_logprobs": []})
    return {"content": content}


def to_vllm_chat(rec: Record, *, model: str = "recon", return_token_ids: bool = True, tokens_as_ids: bool = False) -> dict:
    """A record as vLLM's ``/v1/chat/completions`` returns it (one choice)."""
    resp = rec.response
    message: dict[str, Any] = {"role": "assistant", "content": resp.content if resp else None, "tool_calls": []}
    if resp and resp.reasoning_content is not None:
        message["reasoning_content"] = resp.reasoning_content
    if resp and resp.tool_calls:
        message["tool_calls"] = [c.to_dict() for c in resp.tool_calls]
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": _openai_logprobs(rec, tokens_as_ids),
                              "finish_reason": resp.finish_reason if resp else None}
    out: dict[str, Any] = {"id": rec.id, "object": "chat.completion", "created": int(time.time()), "model": model,
                           "choices": [choice]}
    if return_token_ids:
        choice["token_ids"] = rec.output_ids
        out["prompt_token_ids"] = rec.prompt_ids
    completion = len(rec.output_ids) if rec.output_ids is not None else 0
    prompt = len(rec.prompt_ids) if rec.prompt_ids is not None else 0
    out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return out


def to_openai_chat(rec: Record, *, model: str = "recon") -> dict:
    """A record as a plain OpenAI-compatible API returns it: text only, no ids."""
    out = to_vllm_chat(rec, model=model, return_token_ids=False)
    message = out["choices"][0]["message"]
    if "reasoning_content" in message:
        message["reasoning"] = message.pop("reasoning_content")  # OpenRouter's name
    return out


def to_sglang(rec: Record) -> dict:
    """A record as SGLang's native ``/generate`` returns it."""
    resp = rec.response
    meta: dict[str, Any] = {"id": rec.id, "finish_reason": {"type": resp.finish_reason if resp else None},
                            "prompt_tokens": len(rec.prompt_ids or []), "completion_tokens": len(rec.output_ids or [])}
    if resp and resp.logprobs is not None and rec.output_ids is not None:
        meta["output_token_logprobs"] = [[t.logprob, i, t.token] for t, i in zip(resp.logprobs, rec.output_ids)]
    return {"text": resp.content if resp else None, "output_ids": rec.output_ids, "meta_info": meta}


# -- files ----------------------------------------------------------------------------------------------
@dataclass
class ImportResult:
    records: int = 0
    errors: list[RecordError] = field(default_factory=list)


def import_file(kind: str, inputs: Iterable[str | Path], out: str | Path, *, dataset: str | None = None) -> ImportResult:
    result = ImportResult()
    good: list[Record] = []
    for path in inputs:
        for item in iter_import(kind, path, dataset=dataset):
            if isinstance(item, RecordError):
                result.errors.append(item)
            else:
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
                             gt.messages or answer.messages, {**answer.meta, **gt.meta}))
    write_records(paired, out)
    return PairResult(len(paired), sorted(set(truth) - set(answers)), sorted(set(answers) - set(truth)), errors)
