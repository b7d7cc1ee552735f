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
the least recently touched wait in a scratch file (:mod:`recon.audit.spill`) and are read back when
the trajectory goes on.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from recon.audit.prefix import CAUSES, REGIONS, classify, pieces_around  # noqa: F401 - this module's names too
from recon.audit.spill import NodeStore
from recon.audit.turns import TurnInfo, unordered

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile

STATUSES = ("kept", "broken", "unchecked")
#: why a trajectory was cut into turns besides a broken boundary
CUT_CAUSES = ("no_prompt", "turn_not_kept")
COLUMNS = ["dataset", "conversation", "turn", "parent_id", "id", "link", "status", "cause", "region", "first_diff",
           "first_diff_byte", "prompt_tokens", "sampled_tokens", "next_prompt_tokens", "parent_piece", "next_piece",
           "context_parent", "context_next", "note"]
#: ids kept in memory for open trajectories before the least recently used are spilled (4 bytes each)
#: (``$RECON_PREFIX_MEMORY_IDS`` sets another budget), and open trajectories at most
MEMORY_IDS = int(os.environ.get("RECON_PREFIX_MEMORY_IDS") or 16_000_000)
MEMORY_NODES = 256


def arrow_schema():
    import pyarrow as pa

    ints = {"turn", "first_diff", "first_diff_byte", "prompt_tokens", "sampled_tokens", "next_prompt_tokens"}
    return pa.schema([(c, pa.int64() if c in ints else pa.string()) for c in COLUMNS])


@dataclass(eq=False, slots=True)
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
    #: the record's own ``turn`` (None: counted on from its parent's)
    given: int | None = None
    #: where the record came in (trajectories still open at the end are ended in this order)
    order: int = 0
    children: int = 0
    turns: int = 1
    whole: bool = True
    spans: tuple = ()
    causes: tuple = ()
    ids: tuple = ()
    sources: tuple = ()

    def __reduce__(self):
        """Pickled flat, the ids as raw bytes (a spilled node is written and read at memory speed)."""
        values = [getattr(self, name) for name in _FIELDS]
        values[_SEQ] = None if self.seq is None else (self.seq.tobytes(), self.seq.dtype.str)
        return _node, (tuple(values),)


def _node(values: tuple) -> "_Node":
    node = _Node(*values)
    if node.seq is not None:
        node.seq = np.frombuffer(node.seq[0], dtype=node.seq[1])
    return node


_FIELDS = [f for f in _Node.__dataclass_fields__]
_SEQ = _FIELDS.index("seq")


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
    memory_nodes: int = MEMORY_NODES
    #: keep each path's turns (ids, prompt sources, sampled spans): what a trajectory row needs
    paths: bool = False
    counts: Counter = field(default_factory=Counter)

    def __post_init__(self):
        self._store = NodeStore(self.memory_nodes, self.memory_ids)

    @property
    def spilled(self) -> int:
        """How many generations' ids went to the scratch file."""
        return self._store.spilled

    # -- generations in ---------------------------------------------------------------------------------
    def add_all(self, infos) -> None:
        for info in infos:
            if info is not None:
                self.add(info)

    def add(self, info: TurnInfo) -> None:
        self.counts["generations"] += 1
        found = None
        if info.link == "explicit":
            key = ("c", info.dataset, info.key)
            parent = self._store.get(key)
            found = info.pre
            if found is not None and parent is not None and not unordered(parent.given, info.turn):
                return self._advance(key, parent, info)
            if parent is not None and found is None and unordered(parent.given, info.turn):
                found = {"status": "unchecked", "note": f"turn {info.turn} is not above the previous record's "
                                                        f"({parent.turn}): a new trajectory starts here"}
            turn = info.turn if info.turn is not None else (parent.turn + 1 if parent is not None else 0)
            conversation = info.key
        else:
            key = ("h", info.dataset, info.key)
            parent = next((n for n in (self._store.get(("h", info.dataset, k)) for k in info.parents) if n is not None),
                          None)
            turn = parent.turn + 1 if parent is not None else 0
            conversation = parent.conversation if parent is not None else info.id
        seq = np.concatenate([info.prompt, info.output]) if info.prompt is not None and info.output is not None else None
        node = _Node(info.dataset, info.id, conversation, turn, info.p_len or 0, info.o_len, info.known, seq, info.turn,
                     self.counts["generations"])
        span = (node.p_len, node.p_len + node.o_len)
        why = () if info.known else ("no_prompt",)
        why += () if info.keep else ("turn_not_kept",)
        restart = parent is not None and info.link == "explicit" and unordered(parent.given, info.turn)
        if parent is not None:
            result = self._row(parent, info, found if found is not None else self._check(parent, info), turn)
        if parent is None or restart:
            node.whole, node.spans, node.causes = not why, (span,), why
            self.counts["unordered"] += restart
        else:
            parent.children += 1
            kept = result["status"] == "kept"
            if result["status"] == "broken":
                why = (result["cause"],) + why
            elif not kept and "no_prompt" not in why:
                why = ("no_prompt",) + why
            node.turns, node.whole = parent.turns + 1, parent.whole and kept and not why
            node.causes = parent.causes + tuple(c for c in why if c not in parent.causes) if why else parent.causes
            if self.paths:
                node.spans = parent.spans + (span,) if node.whole else ()
                node.ids, node.sources = parent.ids, parent.sources
        if self.paths:
            node.ids += ((info.dataset, info.id),)
            node.sources += (info.prompt_source,)
        old = parent if parent is not None and info.link == "explicit" else self._store.get(key)
        if old is not None and old.children == 0:
            self._end(old)
        self._store.put(key, node)

    def _advance(self, key: tuple, node: _Node, info: TurnInfo) -> None:
        """A turn checked in the worker against the conversation's previous record (``node``): the
        same as :meth:`add` makes of it, with ``node`` made the new turn in place (the common case,
        kept cheap: a trajectory's turns listed together)."""
        turn = info.turn if info.turn is not None else node.turn + 1
        result = self._row(node, info, info.pre, turn)
        why = () if info.known else ("no_prompt",)
        why += () if info.keep else ("turn_not_kept",)
        status = result["status"]
        if status == "broken":
            why = (result["cause"],) + why
        elif status != "kept" and "no_prompt" not in why:
            why = ("no_prompt",) + why
        whole = node.whole and status == "kept" and not why
        if self.paths:
            node.spans = node.spans + ((info.p_len or 0, (info.p_len or 0) + info.o_len),) if whole else ()
            node.ids += ((info.dataset, info.id),)
            node.sources += (info.prompt_source,)
        if why:
            node.causes = node.causes + tuple(c for c in why if c not in node.causes)
        seq = np.concatenate([info.prompt, info.output]) if info.prompt is not None and info.output is not None else None
        self._store.resize(key, node, seq)
        node.id, node.turn, node.given, node.order = info.id, turn, info.turn, self.counts["generations"]
        node.p_len, node.o_len, node.known, node.seq = info.p_len or 0, info.o_len, info.known, seq
        node.turns, node.whole = node.turns + 1, whole

    def _check(self, parent: _Node, info: TurnInfo) -> dict:
        """The boundary from the parent's ids (from an earlier chunk) and the child's prompt."""
        seq = parent.seq if parent.known else None
        if seq is None or info.prompt is None:
            return {"status": "unchecked", "note": "no prompt or sampled ids for turn " + ("k" if seq is None else "k+1")}
        nxt = info.prompt
        if len(nxt) >= len(seq) and np.array_equal(nxt[: len(seq)], seq):
            return {"status": "kept"}
        return classify(self.bound, seq, parent.p_len, nxt)

    def _row(self, parent: _Node, info: TurnInfo, found: dict, turn: int) -> dict:
        """Count a boundary (and hand its row to ``on_row``); returns what was found."""
        c, status = self.counts, found["status"]
        c["status:" + status] += 1
        c["link:" + info.link] += 1
        if status == "broken":
            c["cause:" + found["cause"]] += 1
            c["region:" + found["region"]] += 1
            c[f"region_cause:{found['region']}/{found['cause']}"] += 1
        if self.on_row is not None:
            row = dict.fromkeys(COLUMNS)
            row.update(dataset=info.dataset, conversation=parent.conversation, turn=turn,
                       parent_id=parent.id, id=info.id, link=info.link,
                       prompt_tokens=parent.p_len if parent.known else None,
                       sampled_tokens=parent.o_len if parent.known else None, next_prompt_tokens=info.p_len, **found)
            self.on_row(row)
        return found

    # -- trajectories out ---------------------------------------------------------------------------------
    def _end(self, node: _Node) -> None:
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
                trajectory.seq = node.seq
            self.on_trajectory(trajectory)

    def finish(self) -> dict:
        """End every open trajectory and return the summary (:meth:`summary`)."""
        for node in self._store.drain():
            if node.children == 0:
                self._end(node)
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
                "unchecked": c["status:unchecked"], "unordered": c["unordered"], "by_link": part("link:"),
                "trajectories": c["trajectories"], "whole": c["whole"], "cut": c["cut"],
                "cut_by_cause": part("cut_cause:")}
