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
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from recon.samples.records import Record, Response

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile

LINKS = ("explicit", "inferred")


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


def _array(ids) -> np.ndarray | None:
    return None if ids is None else np.asarray(ids, dtype=np.int32)


def turn_infos(records: Sequence[Record], prompts: Sequence[list[int] | None], outputs: Sequence[list[int] | None],
               bound: "BoundProfile", keeps: Sequence[bool] | None = None,
               sources: Sequence[str] | None = None) -> list[TurnInfo | None]:
    """Each record's :class:`TurnInfo`, or None for a record that can't be in a trajectory (no
    ``conversation`` and no ``messages``). ``outputs``: the sampled ids the audit settled on
    (ground truth, else the reconstruction; an export's: the policy's)."""
    out: list[TurnInfo | None] = []
    for k, (rec, prompt, ids) in enumerate(zip(records, prompts, outputs)):
        keep = True if keeps is None else keeps[k]
        source = (sources[k] if sources is not None else ("none" if prompt is None else "given"))
        if rec.conversation is not None:
            out.append(TurnInfo(rec.dataset, rec.id, "explicit", rec.conversation, None, rec.turn, _array(prompt),
                                _array(ids), keep, source))
            continue
        if not rec.messages:
            out.append(None)
            continue
        response = rec.response
        if response is None and ids is not None:
            response = bound.after_prompt_ids(prompt).parse_ids(list(ids))
        if response is None:
            out.append(None)
            continue
        own, parents = link_keys(rec.messages, response)
        out.append(TurnInfo(rec.dataset, rec.id, "inferred", own, parents, None, _array(prompt), _array(ids), keep,
                            source))
    return out


def chunk_turns(records: Sequence[Record], rows: list[dict], prompts: list | None, exported: list | None,
                bound: "BoundProfile") -> list[TurnInfo | None]:
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
