"""The prefix audit of multi-turn trajectories: does turn k survive into turn k+1's prompt?

Each generation of an agentic or multi-turn run is one request. A trainer can take a trajectory
as one sequence only if, at every boundary k → k+1, ``prompt_ids(k) + output_ids(k)`` is a prefix
of ``prompt_ids(k+1)``: the engine's prompt ids where the record has them, else its request
rendered by the chat template (:class:`recon.prompts.render.PromptMaker`). Real templates break
this (Kimi-K2-Thinking writes earlier turns as ``<think></think>`` + content, Qwen3 and GLM keep
reasoning only after the last user query, object tool arguments go through ``tojson``), and so do
clients (stripped content, history edited). Where it breaks, a boundary says where: the first
divergence (token and byte), both sides' pieces, the region (``prompt``: turn k's own prompt was
rendered differently; ``reasoning``, ``content``, ``tool_call``, ``end``: the part of turn k's
output, from the profile's grammar; ``template``: after the output) and a cause (:data:`CAUSES`).

Records are linked as :mod:`recon.audit.turns` says. The driver of the audit engine sees every
generation in input order (:class:`Conversations`), so the result does not depend on how chunks
were spread over workers. It keeps, per open trajectory, its last generation's ids; past a budget
the least recently touched are spilled to a scratch file and read back when the trajectory goes on.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from recon.audit.turns import TurnInfo

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile

#: why turn k's sampled ids are not a prefix of turn k+1's prompt
CAUSES = ("reasoning_dropped", "tool_arguments_reserialized", "content_stripped", "content_changed",
          "stop_token_or_separator", "retokenized", "special_token_text", "template_text")
#: where the first divergence lies, in ``prompt_ids(k) + output_ids(k)``
REGIONS = ("prompt", "reasoning", "content", "tool_call", "end", "template")
STATUSES = ("kept", "broken", "unchecked")
#: why a trajectory was cut into turns besides a broken boundary
CUT_CAUSES = ("no_prompt", "turn_not_kept", "unordered")
COLUMNS = ["dataset", "conversation", "turn", "parent_id", "id", "link", "status", "cause", "region", "first_diff",
           "first_diff_byte", "prompt_tokens", "sampled_tokens", "next_prompt_tokens", "parent_piece", "next_piece",
           "context_parent", "context_next", "note"]
#: bytes of context either side of a divergence
CONTEXT = 40
#: ids kept in memory for open trajectories before the least recently used are spilled (4 bytes each)
MEMORY_IDS = 16_000_000


def arrow_schema():
    import pyarrow as pa

    ints = {"turn", "first_diff", "first_diff_byte", "prompt_tokens", "sampled_tokens", "next_prompt_tokens"}
    return pa.schema([(c, pa.int64() if c in ints else pa.string()) for c in COLUMNS])


@dataclass(eq=False)
class _Node:
    """A generation that may be followed: its ids (``seq`` = prompt + output) and its path's state."""

    dataset: str
    id: str
    conversation: str
    turn: int
    p_len: int
    o_len: int
    known: bool
    seq: np.ndarray | None
    spill: tuple[int, int] | None = None
    children: int = 0
    turns: int = 1
    whole: bool = True
    spans: tuple = ()
    causes: tuple = ()
    ids: tuple = ()
    sources: tuple = ()


def _first_diff(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _common_bytes(a: bytes, b: bytes) -> int:
    return _first_diff(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


def classify(bound: "BoundProfile", seq: np.ndarray, p_len: int, nxt: np.ndarray) -> dict:
    """Where and why ``seq`` (turn k's prompt + output, the prompt ``p_len`` ids) is not a prefix
    of ``nxt`` (turn k+1's prompt): the boundary row's divergence columns."""
    tok = bound.tok
    at = _first_diff(seq, nxt)
    whole_p, whole_n = tok.ids_bytes(seq.tolist()), tok.ids_bytes(nxt.tolist())
    byte_at = _common_bytes(whole_p, whole_n)
    prompt_bytes = len(tok.ids_bytes(seq[:p_len].tolist()))
    region, span_end = "template", len(whole_p)
    if at < p_len:
        region, span_end = "prompt", prompt_bytes
        tag = (bound.profile.reasoning_tag or "").strip().encode()
        if tag and at >= p_len - 2 and tag in tok.ids_bytes(seq[at:p_len].tolist()):
            region = "reasoning"  # the generation prompt opened the reasoning (DeepSeek, Kimi-K2.5)
    elif at < len(seq):
        out = seq[p_len:].tolist()
        offset = sum(map(tok.token_lengths.__getitem__, out[: at - p_len]))
        for name, start, end in bound.after_prompt_ids(seq[:p_len].tolist()).regions_of_ids(out):
            if start <= offset < end:
                region, span_end = name, prompt_bytes + end
                break
    rest_p, rest_n = whole_p[byte_at:], whole_n[byte_at:]
    tail_p, tail_n = tok.ids_bytes(seq[at:].tolist()), tok.ids_bytes(nxt[at:].tolist())
    if tail_n.startswith(tail_p):  # turn k's text is all there, cut into other tokens
        specials, lengths, j, size = tok.special_ids, tok.token_lengths, at, 0
        while j < len(nxt) and size < len(tail_p):  # the next prompt's tokens that spell turn k's rest
            size, j = size + lengths[int(nxt[j])], j + 1
        cause = ("special_token_text" if sum(int(i) in specials for i in seq[at:])
                 != sum(int(i) in specials for i in nxt[at:j]) else "retokenized")
    elif region == "reasoning":
        cause = "reasoning_dropped"
    elif region == "tool_call":
        cause = "tool_arguments_reserialized"
    elif region == "end":
        cause = "stop_token_or_separator"
    elif region == "content":
        cause = "content_stripped" if not whole_p[byte_at:span_end].strip() else "content_changed"
    elif rest_p.lstrip()[:16] == rest_n.lstrip()[:16]:
        cause = "stop_token_or_separator"  # only whitespace between blocks differs
    elif region == "prompt" and _reasoning_in(bound, whole_p[byte_at:prompt_bytes], whole_n):
        cause = "reasoning_dropped"  # an earlier turn's reasoning, kept in turn k's prompt, not in k+1's
    else:
        cause = "template_text"
    return {"status": "broken", "cause": cause, "region": region, "first_diff": at, "first_diff_byte": byte_at,
            "parent_piece": tok.piece(int(seq[at])) if at < len(seq) else None,
            "next_piece": tok.piece(int(nxt[at])) if at < len(nxt) else None,
            "context_parent": whole_p[max(0, byte_at - CONTEXT): byte_at + CONTEXT].decode("utf-8", "replace"),
            "context_next": whole_n[max(0, byte_at - CONTEXT): byte_at + CONTEXT].decode("utf-8", "replace")}


def _reasoning_in(bound: "BoundProfile", part: bytes, other: bytes) -> bool:
    """``part`` (from a divergence on) holds reasoning text, up to the close tag, that ``other`` lacks."""
    p = bound.profile
    open_, close = (p.reasoning_tag or p.reasoning_open or "").strip().encode(), (p.reasoning_close or "").strip().encode()
    end = part.find(close) if close else -1
    if not open_ or end < 0:
        return False
    text = part[:end]
    start = text.find(open_)
    text = (text[start + len(open_):] if start >= 0 else text).strip()
    return bool(text) and text not in other


def pieces_around(tok, seq, nxt, at: int, width: int = 6) -> list[dict]:
    """Token by token around a divergence: position, turn k's id and piece, turn k+1's, same or not."""
    rows = []
    for k in range(max(0, at - width), at + width + 1):
        a = int(seq[k]) if k < len(seq) else None
        b = int(nxt[k]) if k < len(nxt) else None
        if a is None and b is None:
            break
        rows.append({"position": k, "turn_k_id": a, "turn_k_piece": None if a is None else tok.piece(a),
                     "next_prompt_id": b, "next_prompt_piece": None if b is None else tok.piece(b),
                     "same": a == b, "first_diff": k == at})
    return rows


@dataclass
class Trajectory:
    """A path of two turns or more, ended: whole (one sequence) or cut into turns, and why."""

    dataset: str
    conversation: str
    turns: int
    whole: bool
    causes: tuple
    ids: tuple
    spans: tuple
    seq: np.ndarray | None
    sources: tuple = ()


@dataclass
class Conversations:
    """The prefix audit over generations in input order (:meth:`add`), then :meth:`finish`.
    ``on_row``: called with each boundary row; ``on_trajectory``: with each ended
    :class:`Trajectory` (its ``seq`` loaded only when ``want_seq`` says so)."""

    bound: "BoundProfile"
    on_row: Callable[[dict], None] | None = None
    on_trajectory: Callable[[Trajectory], None] | None = None
    want_seq: Callable[[Trajectory], bool] | None = None
    memory_ids: int = MEMORY_IDS
    keep_pairs: bool = False
    counts: Counter = field(default_factory=Counter)
    pairs: dict = field(default_factory=dict)

    def __post_init__(self):
        self._nodes: dict = {}
        self._hot: OrderedDict = OrderedDict()
        self._hot_ids = 0
        self._spill = None

    # -- the ids of open trajectories, in memory or spilled -----------------------------------------
    def _remember(self, node: _Node) -> None:
        if node.seq is None:
            return
        self._hot[id(node)] = node
        self._hot_ids += len(node.seq)
        while self._hot_ids > self.memory_ids and len(self._hot) > 1:
            _, old = self._hot.popitem(last=False)
            self._hot_ids -= len(old.seq)
            if self._spill is None:
                self._spill = tempfile.TemporaryFile(prefix="recon-turns-")
            self._spill.seek(0, os.SEEK_END)
            old.spill = (self._spill.tell(), len(old.seq))
            self._spill.write(old.seq.tobytes())
            old.seq = None

    def _forget(self, node: _Node) -> None:
        if self._hot.pop(id(node), None) is not None:
            self._hot_ids -= len(node.seq)

    def _seq(self, node: _Node) -> np.ndarray | None:
        if node.seq is not None or node.spill is None:
            return node.seq
        offset, n = node.spill
        self._spill.seek(offset)
        return np.frombuffer(self._spill.read(4 * n), dtype=np.int32)

    # -- generations in ---------------------------------------------------------------------------------
    def add_all(self, infos) -> None:
        for info in infos:
            if info is not None:
                self.add(info)

    def add(self, info: TurnInfo) -> None:
        self.counts["generations"] += 1
        if info.link == "explicit":
            key = ("c", info.dataset, info.key)
            parent = self._nodes.get(key)
            if parent is not None and info.turn is not None and info.turn <= parent.turn:
                self._row(parent, info, {"status": "unchecked", "note": f"turn {info.turn} is not above the "
                                         f"conversation's last ({parent.turn}): list each conversation's turns in order"})
                self.counts["unordered"] += 1
                return
            turn = info.turn if info.turn is not None else (parent.turn + 1 if parent is not None else 0)
            conversation = info.key
        else:
            key = ("h", info.dataset, info.key)
            parent = next((n for n in (self._nodes.get(("h", info.dataset, k)) for k in info.parents) if n is not None),
                          None)
            turn = parent.turn + 1 if parent is not None else 0
            conversation = parent.conversation if parent is not None else info.id
        known = info.prompt is not None and info.output is not None
        seq = np.concatenate([info.prompt, info.output]) if known else None
        node = _Node(info.dataset, info.id, conversation, turn, 0 if info.prompt is None else len(info.prompt),
                     0 if info.output is None else len(info.output), known, seq)
        span = (node.p_len, node.p_len + node.o_len)
        why = () if known else ("no_prompt",)
        why += () if info.keep else ("turn_not_kept",)
        if parent is None:
            node.whole, node.spans, node.causes = not why, (span,), why
        else:
            result = self._boundary(parent, node, info)
            parent.children += 1
            kept = result["status"] == "kept"
            if result["status"] == "broken":
                why = (result["cause"],) + why
            elif not kept and "no_prompt" not in why:
                why = ("no_prompt",) + why
            node.turns, node.whole = parent.turns + 1, parent.whole and kept and not why
            node.spans = parent.spans + (span,) if node.whole else ()
            node.causes = parent.causes + tuple(c for c in why if c not in parent.causes)
            node.ids = parent.ids
            node.sources = parent.sources
        node.ids += ((info.dataset, info.id),)
        node.sources += (info.prompt_source,)
        old = self._nodes.get(key)
        if old is not None:
            self._forget(old)
            if old.children == 0 and old is not parent:
                self._end(old)
        self._nodes[key] = node
        self._remember(node)

    def _boundary(self, parent: _Node, node: _Node, info: TurnInfo) -> dict:
        if not parent.known or info.prompt is None:
            side = "turn k" if not parent.known else "turn k+1"
            return self._row(parent, info, {"status": "unchecked", "note": f"no prompt or sampled ids for {side}"})
        seq, nxt = self._seq(parent), info.prompt
        n = len(seq)
        if len(nxt) >= n and np.array_equal(nxt[:n], seq):
            return self._row(parent, info, {"status": "kept"})
        found = classify(self.bound, seq, parent.p_len, nxt)
        if self.keep_pairs:
            self.pairs[(info.dataset, info.id)] = (seq, nxt, parent.p_len)
        return self._row(parent, info, found)

    def _row(self, parent: _Node, info: TurnInfo, found: dict) -> dict:
        row = dict.fromkeys(COLUMNS)
        row.update(dataset=info.dataset, conversation=parent.conversation, turn=parent.turn + 1, parent_id=parent.id,
                   id=info.id, link=info.link, prompt_tokens=parent.p_len if parent.known else None,
                   sampled_tokens=parent.o_len if parent.known else None,
                   next_prompt_tokens=None if info.prompt is None else len(info.prompt), **found)
        status = row["status"]
        self.counts["status:" + status] += 1
        self.counts["link:" + info.link] += 1
        if status == "broken":
            self.counts["cause:" + row["cause"]] += 1
            self.counts["region:" + row["region"]] += 1
            self.counts[f"region_cause:{row['region']}/{row['cause']}"] += 1
        if self.on_row is not None:
            self.on_row(row)
        return row

    # -- trajectories out ---------------------------------------------------------------------------------
    def _end(self, node: _Node) -> None:
        self._forget(node)
        if node.turns < 2:
            return
        trajectory = Trajectory(node.dataset, node.conversation, node.turns, node.whole, node.causes, node.ids,
                                node.spans, None, node.sources)
        self.counts["trajectories"] += 1
        self.counts["whole" if node.whole else "cut"] += 1
        for cause in node.causes:
            self.counts["cut_cause:" + cause] += 1
        if self.on_trajectory is not None:
            if self.want_seq is None or self.want_seq(trajectory):
                trajectory.seq = self._seq(node)
            self.on_trajectory(trajectory)

    def finish(self) -> dict:
        """End every open trajectory and return the summary (:meth:`summary`)."""
        for node in self._nodes.values():
            if node.children == 0:
                self._end(node)
        self._nodes.clear()
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        return self.summary()

    def summary(self) -> dict:
        c = self.counts

        def part(prefix: str) -> dict[str, int]:
            return {k[len(prefix):]: n for k, n in sorted(c.items()) if k.startswith(prefix) and n}

        kept, broken = c["status:kept"], c["status:broken"]
        by_region: dict[str, dict[str, int]] = {}
        for k, n in part("region_cause:").items():
            region, cause = k.split("/")
            by_region.setdefault(region, {})[cause] = n
        return {"boundaries": kept + broken, "prefix_kept": kept, "prefix_broken": broken,
                "by_cause": part("cause:"), "by_region": part("region:"), "causes_by_region": by_region,
                "unchecked": c["status:unchecked"], "by_link": part("link:"),
                "trajectories": c["trajectories"], "whole": c["whole"], "cut": c["cut"],
                "cut_by_cause": part("cut_cause:")}
