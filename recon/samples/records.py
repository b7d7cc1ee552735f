"""The sample format: one JSON object a line (JSONL, optionally gzipped) or a Parquet row.

::

    {"id": str,
     "dataset": str,                  # optional; default: the file's stem
     "output_ids": [int],             # ground truth: the ids the model sampled (optional)
     "response": {                    # what an OpenAI-compatible API returned (optional)
        "reasoning_content": str|null,    # "reasoning" accepted too
        "content": str|null,
        "tool_calls": [{"id": str, "type": "function",
                        "function": {"name": str, "arguments": str}}]|null,
        "finish_reason": str|null,
        "logprobs": {"content": [{"token": str, "bytes": [int]|null, "token_id": int|null}]}|null},
     "prompt_ids": [int],             # optional: the prompt as the engine saw it
     "messages": [...],               # optional: the request's chat messages
     "tools": [...],                  # optional: the request's tool schemas (OpenAI function tools)
     "chat_template_kwargs": {},      # optional: the request's template switches (enable_thinking, ...)
     "conversation": str, "turn": int,  # optional: the trajectory a generation belongs to, its place
     "meta": {}}                      # optional, carried through

At least one of ``output_ids`` / ``response``. Reading streams; every problem is reported with
its file, line and field, and every good record is kept.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator

from recon.errors import ReconError, one_line
from recon.samples.io import RecordError, bad_record_count, iter_raw_lines, parse_line
from recon.samples.seen import SeenIds
from recon.samples.validate import _ids, _messages, _opt_str, _Problems, conversation_fields  # noqa: F401 - names of this module before


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    type: str = "function"

    def to_dict(self) -> dict:
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class TokenLogprob:
    """One sampled token as an API reports it: its text, maybe its bytes, maybe its id."""

    token: str
    bytes: list[int] | None = None
    token_id: int | None = None
    logprob: float | None = None

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"token": self.token, "bytes": self.bytes}
        if self.token_id is not None:
            out["token_id"] = self.token_id
        if self.logprob is not None:
            out["logprob"] = self.logprob
        return out


@dataclass
class Response:
    """The API view of a completion."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict:
        return {
            "reasoning_content": self.reasoning_content,
            "content": self.content,
            "tool_calls": None if self.tool_calls is None else [c.to_dict() for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "logprobs": None if self.logprobs is None else {"content": [t.to_dict() for t in self.logprobs]},
        }


@dataclass
class Record:
    id: str
    dataset: str
    output_ids: list[int] | None = None
    response: Response | None = None
    prompt_ids: list[int] | None = None
    messages: list | None = None
    meta: dict = field(default_factory=dict)
    #: the request's tools and chat-template switches, named as in the OpenAI / vLLM / SGLang
    #: request: what the chat template rendered the prompt with besides ``messages``
    tools: list | None = None
    chat_template_kwargs: dict | None = None
    #: the multi-turn trajectory this generation belongs to, and its turn (0, 1, ...)
    conversation: str | None = None
    turn: int | None = None
    #: where the record was read from (file, line); not part of the format
    origin: tuple[str, int] | None = field(default=None, compare=False, repr=False)
    #: every id of ``output_ids`` was checked to be below this when read (so a reader that knows
    #: the vocabulary need not check again); not part of the format
    ids_below: int | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"id": self.id, "dataset": self.dataset}
        if self.output_ids is not None:
            out["output_ids"] = self.output_ids
        if self.response is not None:
            out["response"] = self.response.to_dict()
        if self.prompt_ids is not None:
            out["prompt_ids"] = self.prompt_ids
        if self.messages is not None:
            out["messages"] = self.messages
        if self.tools is not None:
            out["tools"] = self.tools
        if self.chat_template_kwargs is not None:
            out["chat_template_kwargs"] = self.chat_template_kwargs
        for name in ("conversation", "turn"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.meta:
            out["meta"] = self.meta
        return out


def _response(raw: Any, vocab_size: int | None, p: _Problems) -> Response | None:
    if not isinstance(raw, dict):
        p.add("response", f"expected an object, got {type(raw).__name__}")
        return None
    reasoning_key = "reasoning_content" if raw.get("reasoning_content") is not None else "reasoning"
    resp = Response(
        content=_opt_str(raw, "content", "response.content", p),
        reasoning_content=_opt_str(raw, reasoning_key, f"response.{reasoning_key}", p),
        finish_reason=_opt_str(raw, "finish_reason", "response.finish_reason", p),
    )
    calls = raw.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            p.add("response.tool_calls", "expected a list or null")
        else:
            resp.tool_calls = []
            for k, call in enumerate(calls):
                where = f"response.tool_calls[{k}]"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    p.add(f"{where}.function.name", "missing or not a string")
                    continue
                args = fn.get("arguments")
                if isinstance(args, (dict, list)):  # some servers return parsed JSON
                    args = json.dumps(args, ensure_ascii=False)
                if not isinstance(args, str):
                    p.add(f"{where}.function.arguments", "missing or not a string")
                    continue
                call_type = call.get("type") or "function"
                if not isinstance(call_type, str):
                    p.add(f"{where}.type", "expected a string")
                    continue
                resp.tool_calls.append(ToolCall(str(call.get("id", "")), fn["name"], args, call_type))
    lp = raw.get("logprobs")
    if lp is not None:
        content = lp.get("content") if isinstance(lp, dict) else None
        if not isinstance(content, list):
            p.add("response.logprobs.content", "expected a list of token entries")
        else:
            resp.logprobs = []
            for k, entry in enumerate(content):
                where = f"response.logprobs.content[{k}]"
                if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
                    p.add(f"{where}.token", "missing or not a string")
                    resp.logprobs = None
                    break
                data, tid = entry.get("bytes"), entry.get("token_id")
                if data is not None and (not isinstance(data, list) or not all(isinstance(b, int) and 0 <= b < 256 for b in data)):
                    p.add(f"{where}.bytes", "expected a list of byte values 0..255")
                    resp.logprobs = None
                    break
                if tid is not None and _ids([tid], f"{where}.token_id", vocab_size, p) is None:
                    resp.logprobs = None
                    break
                logprob = entry.get("logprob")
                if logprob is not None and (type(logprob) not in (int, float)):
                    p.add(f"{where}.logprob", f"expected a number or null, got {type(logprob).__name__}")
                    resp.logprobs = None
                    break
                resp.logprobs.append(TokenLogprob(entry["token"], data, tid, logprob))
    return resp


def parse_record(obj: dict, *, path: str, line: int, default_dataset: str, vocab_size: int | None = None) -> Record | list[RecordError]:
    """A validated :class:`Record`, or every problem found in the object."""
    p = _Problems(path, line)
    rid = obj.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool):
        rid = str(rid)
    if not isinstance(rid, str) or not rid:
        p.add("id", "missing or not a string")
    dataset = obj.get("dataset", default_dataset)
    if not isinstance(dataset, str) or not dataset:
        p.add("dataset", "expected a non-empty string")
    has_ids, has_response = obj.get("output_ids") is not None, obj.get("response") is not None
    if not has_ids and not has_response:
        p.add("output_ids", "neither output_ids nor response is present")
    output_ids = _ids(obj["output_ids"], "output_ids", vocab_size, p) if has_ids else None
    response = _response(obj["response"], vocab_size, p) if has_response else None
    if response is not None and not has_ids and not (response.content or response.reasoning_content or response.tool_calls):
        p.add("response", "empty: no content, reasoning or tool calls, and no output_ids")
    prompt_ids = _ids(obj["prompt_ids"], "prompt_ids", vocab_size, p, allow_empty=True) if obj.get("prompt_ids") is not None else None
    messages = obj.get("messages")
    if messages is not None:
        _messages(messages, p)
    tools = obj.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        p.add("tools", "expected a list of tool objects")
    kwargs = obj.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        p.add("chat_template_kwargs", f"expected an object, got {type(kwargs).__name__}")
    conversation, turn = conversation_fields(obj, p)
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        p.add("meta", "expected an object")
    if p.items:
        return p.items
    return Record(rid, dataset, output_ids, response, prompt_ids, messages, meta, tools, kwargs, conversation, turn,
                  ids_below=vocab_size if output_ids is not None else None)


# -- reading ----------------------------------------------------------------------------------------
def dataset_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict | RecordError]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends
        yield 1, RecordError(str(path), 1, "", f"not a readable Parquet file ({one_line(e)})")
        return
    row = 0
    batches = parquet.iter_batches(batch_size=4096)
    while True:
        try:
            batch = next(batches, None)
            objs = None if batch is None else batch.to_pylist()
        except Exception as e:  # a corrupt page or row group: report where reading stopped
            yield row + 1, RecordError(str(path), row + 1, "", f"file is cut or corrupt from this row on ({one_line(e)})")
            return
        if objs is None:
            return
        for obj in objs:
            row += 1
            yield row, {k: v for k, v in obj.items() if v is not None}




def iter_raw(path: str | Path, *, spans: bool = False) -> Iterator[tuple[int, bytes | dict | RecordError]]:
    """One file's records unparsed, in order: (line, raw JSONL bytes, a Parquet row as a dict, or a
    RecordError); :func:`parse_raw` makes each a record. The audit reads with this and parses in
    its workers, so the reading process only moves bytes (with ``spans``, for a plain JSONL file,
    only where the lines are: :class:`~recon.samples.io.LineSpan`, read with
    :func:`~recon.samples.io.read_spans`)."""
    path = Path(path)
    if not path.exists():
        raise ReconError(f"{path}: no such file")
    return _iter_parquet(path) if path.suffix == ".parquet" else iter_raw_lines(path, spans=spans)


def parse_raw(path: str | Path, line: int, item: bytes | dict | RecordError, *,
              vocab_size: int | None = None) -> Record | list[RecordError] | None:
    """One item of :func:`iter_raw`: a validated record, its problems, or None (a blank line).
    Duplicate ids are the caller's to find (see :class:`SeenIds`)."""
    obj = parse_line(item, path, line) if not isinstance(item, dict) else item
    if obj is None:
        return None
    if isinstance(obj, RecordError):
        return [obj]
    path = str(path)
    rec = parse_record(obj, path=path, line=line, default_dataset=_default_dataset(path), vocab_size=vocab_size)
    if isinstance(rec, Record):
        rec.origin = (path, line)
    return rec


@lru_cache(maxsize=64)
def _default_dataset(path: str) -> str:
    return dataset_name(Path(path))


def duplicate_error(path: str, line: int, rec_dataset: str, rid: str) -> RecordError:
    return RecordError(path, line, "id", f"duplicate id {rid!r} in dataset {rec_dataset!r} (an earlier line has it)")


def iter_records(path: str | Path, *, vocab_size: int | None = None) -> Iterator[Record | RecordError]:
    """Stream one file's records; bad ones come out as :class:`RecordError` (several per record possible)."""
    seen = SeenIds()
    for line, item in iter_raw(path):
        rec = parse_raw(path, line, item, vocab_size=vocab_size)
        if rec is None:
            continue
        if isinstance(rec, list):
            yield from rec
            continue
        if not seen.add(rec.dataset, rec.id):
            yield duplicate_error(str(path), line, rec.dataset, rec.id)
            continue
        yield rec


@dataclass
class ReadResult:
    records: list[Record]
    errors: list[RecordError]

    @property
    def bad_records(self) -> int:
        """Records with at least one problem (a record may have several)."""
        return bad_record_count(self.errors)

    def summary(self) -> str:
        fields = Counter(e.field or "(line)" for e in self.errors)
        detail = ", ".join(f"{f}: {n}" for f, n in fields.most_common())
        return f"{len(self.records)} good records, {self.bad_records} bad" + (f" ({detail})" if detail else "")


def read_records(paths: Iterable[str | Path] | str | Path, *, vocab_size: int | None = None) -> ReadResult:
    """Every good record of every file, and every problem."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    records, errors = [], []
    for path in paths:
        for item in iter_records(path, vocab_size=vocab_size):
            (errors if isinstance(item, RecordError) else records).append(item)
    return ReadResult(records, errors)


def write_records(records: Iterable[Record], path: str | Path, extras: Iterable[dict] | None = None) -> int:
    """Write records as JSONL (gzipped if the name ends in .gz); returns how many.
    ``extras``, one dict per record, adds top-level fields (e.g. ``recon_ids``).

    Records are often produced lazily (a model sampling, a server answering), so the file is
    written beside ``path`` and moved into place only when every record is in: a run that fails
    half-way leaves no half-written (or empty) file that looks like a result."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    partial = path.with_name(path.name + ".partial")
    n = 0
    extra_iter = iter(extras) if extras is not None else None
    try:
        with opener(partial, "wt", encoding="utf-8") as f:
            for rec in records:
                obj = rec.to_dict()
                if extra_iter is not None:
                    obj.update(next(extra_iter))
                f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
                n += 1
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return n
