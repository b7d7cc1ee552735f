"""What a worker sends the driver about each generation of a multi-turn trajectory: how it links
to the generation before it, and the ids the prefix audit compares (:mod:`recon.audit.conversations`).

A record links to its trajectory in one of two ways:

* **explicit** — it carries ``conversation`` (and ``turn``): its parent is the record of the same
  dataset and conversation that came last before it in the input;
* **inferred** — it carries neither, but its ``messages`` extend an earlier record's messages
  plus that record's response (the assistant message made from it): its parent is that record.
  Messages are compared as a client sends history back, loosely: role, text with surrounding
  whitespace stripped, tool calls by name and parsed arguments; reasoning is not compared
  (clients and templates drop it, and that is what the audit is to find, not what hides a link).
  Of several candidates the one whose messages are longest wins (the latest turn), and of
  records with the same messages and response, the nearest before it in the input.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

import recon.kernel as kernel
from recon.samples.records import Record, Response

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile

LINKS = ("explicit", "inferred")
#: a boundary whose prefix holds (shared: it is never changed)
KEPT = {"status": "kept"}


@dataclass
class TurnInfo:
    """One generation, as the prefix audit needs it (small, picklable: ids as int32 arrays)."""

    dataset: str
    id: str
    #: "explicit" or "inferred"
    link: str
    #: explicit: the conversation; inferred: the hash of messages + this response (what a child extends)
    key: Any
    #: explicit: None; inferred: hashes of this record's message prefixes that end with an
    #: assistant message, longest first (the parents it may extend)
    parents: tuple | None
    turn: int | None
    prompt: np.ndarray | None
    output: np.ndarray | None
    #: an export's: the policy keeps this generation's ids
    keep: bool = True
    prompt_source: str = "none"
    #: the lengths of the prompt and of the sampled ids, and whether both are known (the ids
    #: themselves travel only where the driver needs them: see :func:`turn_infos`)
    p_len: int = 0
    o_len: int = 0
    known: bool = False
    #: explicit links: the boundary with the previous record of the conversation, when that one is
    #: in the same chunk (checked in the worker: :func:`recon.audit.prefix.check`)
    pre: dict | None = None


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return arguments


def _loose(message: Any) -> Any:
    """A message as linking compares it (see the module's docstring)."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str) or content is None:
        content = (content or "").strip()
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            calls.append([fn.get("name"), _args(fn.get("arguments"))])
    return [message.get("role"), content, calls]


def assistant_message(response: Response) -> dict:
    """The assistant message a client appends to the history from a response."""
    calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in response.tool_calls or []]
    return {"role": "assistant", "content": response.content or "", "tool_calls": calls}


def _hash(items: list) -> int:
    text = json.dumps(items, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def link_keys(messages: list, response: Response) -> tuple[int, tuple]:
    """(own key, parent keys longest first) of an inferred link."""
    loose = [_loose(m) for m in messages]
    own = _hash(loose + [_loose(assistant_message(response))])
    parents = tuple(_hash(loose[:k]) for k in range(len(loose), 0, -1)
                    if isinstance(messages[k - 1], dict) and messages[k - 1].get("role") == "assistant")
    return own, parents


class ChunkTurns:
    """A chunk's :class:`TurnInfo` s with every id in one int32 buffer: one array pickles at memory
    speed where thousands of small ones cost more than the audit of their records. Iterating
    gives the infos with ``prompt`` and ``output`` as views into the buffer."""

    def __init__(self, infos: list, parts: list):
        """``parts``: two per info (prompt, output), each the ids' int32 bytes or None."""
        self.infos, self.spans = infos, []
        self.ids = np.frombuffer(b"".join(p for p in parts if p is not None), dtype="<i4")
        at = 0
        for data in parts:
            size = 0 if data is None else len(data) // 4
            self.spans.append(None if data is None else (at, at + size))
            at += size

    def __len__(self) -> int:
        return len(self.infos)

    def __iter__(self):
        spans = iter(self.spans)
        for info in self.infos:
            if info is None:
                yield None
                continue
            p, o = next(spans), next(spans)
            info.prompt = None if p is None else self.ids[p[0]: p[1]]
            info.output = None if o is None else self.ids[o[0]: o[1]]
            yield info

    def filter(self, keep: list[bool]) -> "ChunkTurns":
        """Without the records ``keep`` says no to (duplicates)."""
        out = ChunkTurns.__new__(ChunkTurns)
        out.ids, out.infos, out.spans = self.ids, [], []
        spans = iter(self.spans)
        for info, ok in zip(self.infos, keep):
            mine = [] if info is None else [next(spans), next(spans)]
            if ok:
                out.infos.append(info)
                out.spans += mine
        return out


def unordered(parent_turn: int | None, turn: int | None) -> bool:
    """An explicit turn not above the previous record's: not checked, and a new trajectory starts."""
    return parent_turn is not None and turn is not None and turn <= parent_turn


@lru_cache(maxsize=4)
def _table(size: int) -> list[bytes]:
    """Each id's 4 bytes (int32, little-endian): :func:`recon.kernel.join` then lays a list of ids
    out as an int32 array in C, where comparing two Python lists of ints costs more."""
    return [i.to_bytes(4, "little") for i in range(size)]


def _packer(bound: "BoundProfile"):
    """ids -> their int32 bytes (None stays None)."""
    table = _table(bound.tok.vocab_size) if kernel.join is not kernel.join_py else None

    def pack(ids):
        if ids is None:
            return None
        data = kernel.join(ids, table, False) if table is not None else None
        return data if data is not None else np.asarray(ids, dtype="<i4").tobytes()
    return pack


def turn_infos(records: Sequence[Record], prompts: Sequence[list[int] | None], outputs: Sequence[list[int] | None],
               bound: "BoundProfile", keeps: Sequence[bool] | None = None,
               sources: Sequence[str] | None = None) -> ChunkTurns:
    """Each record's :class:`TurnInfo` (None for a record that can't be in a trajectory: no
    ``conversation`` and no ``messages``), as a :class:`ChunkTurns`. ``outputs``: the sampled ids
    the audit settled on (ground truth, else the reconstruction; an export's: the policy's).

    A record linked explicitly whose predecessor in its conversation is in the same chunk is
    checked against it here (``pre``), in the worker; the driver gets only the ids it needs to
    link chunks: the prompt of a conversation's first record in the chunk, the prompt and
    sampled ids of its last. Inferred links send everything (any earlier record may be a parent)."""
    from recon.audit.prefix import check

    pack = _packer(bound)
    infos: list[TurnInfo | None] = []
    last: dict = {}  # (dataset, conversation) -> index of its latest record in this chunk
    ended: set = set()  # records a new trajectory follows (their ids end one)
    lists: dict = {}  # index -> (prompt, output) as lists, for a divergence to be explained
    for k, (rec, prompt, ids) in enumerate(zip(records, prompts, outputs)):
        keep = True if keeps is None else keeps[k]
        source = (sources[k] if sources is not None else ("none" if prompt is None else "given"))
        known = prompt is not None and ids is not None
        p_len, o_len = None if prompt is None else len(prompt), 0 if ids is None else len(ids)
        if rec.conversation is not None:
            info = TurnInfo(rec.dataset, rec.id, "explicit", rec.conversation, None, rec.turn, pack(prompt), pack(ids),
                            keep, source, p_len, o_len, known)
            lists[k] = (prompt, ids)
            before = last.get((rec.dataset, rec.conversation))
            if before is not None:
                parent = infos[before]
                if unordered(parent.turn, rec.turn):
                    ended.add(before)
                    info.pre = {"status": "unchecked", "note": f"turn {rec.turn} is not above the previous record's "
                                                               f"({parent.turn}): a new trajectory starts here"}
                elif not parent.known or prompt is None:
                    info.pre = {"status": "unchecked", "note": "no prompt or sampled ids for turn " +
                                ("k" if not parent.known else "k+1")}
                elif info.prompt.startswith(parent.prompt + parent.output):
                    info.pre = KEPT
                else:
                    pp, po = lists[before]
                    info.pre = check(list(pp) + list(po), len(pp), list(prompt), bound)
            last[(rec.dataset, rec.conversation)] = k
            infos.append(info)
            continue
        response = rec.response if rec.messages else None
        if rec.messages and response is None and ids is not None:
            response = bound.after_prompt_ids(prompt).parse_ids(list(ids))
        if response is None:
            infos.append(None)
            continue
        own, parents = link_keys(rec.messages, response)
        infos.append(TurnInfo(rec.dataset, rec.id, "inferred", own, parents, None, pack(prompt), pack(ids), keep, source,
                              p_len, o_len, known))
    ends = set(last.values()) | ended
    parts = []
    for k, info in enumerate(infos):
        if info is None:
            continue
        needed = info.link == "inferred" or k in ends
        parts += (info.prompt if needed or info.pre is None else None, info.output if needed else None)
        info.prompt = info.output = None
    return ChunkTurns(infos, parts)


def chunk_turns(records: Sequence[Record], rows: list[dict], prompts: list | None, exported: list | None,
                bound: "BoundProfile") -> ChunkTurns:
    """A chunk's :func:`turn_infos` from its audit: ``prompts`` (:class:`~recon.prompts.render.Prompt`
    s, or None: the engine's ids only), the sampled ids the audit settled on (ground truth, else
    the reconstruction, ``rows``' ``recon_ids``) or, ``exported``, the policy's."""
    if prompts is None:
        plist = [r.prompt_ids for r in records]
        sources = ["none" if p is None else "engine" for p in plist]
    else:
        plist, sources = [p.ids for p in prompts], [p.source for p in prompts]
    if exported is not None:
        outputs, keeps = [e["ids"] for e in exported], [e["keep"] for e in exported]
    else:
        outputs = [r.output_ids if r.output_ids is not None else row.get("recon_ids") for r, row in zip(records, rows)]
        keeps = None
    return turn_infos(records, plist, outputs, bound, keeps, sources)
