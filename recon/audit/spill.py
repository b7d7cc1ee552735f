"""The prefix audit's open trajectories, by key: the most recently used in memory, the rest in a
temporary folder (deleted when the run ends): each written once to a flat file, found through a
SQLite index (key, arrival, where).

A conversation can't say it is over (its next turn may come at the end of the file), so every
conversation's last generation is kept until the run ends. In memory that would grow with the
file; here memory holds at most ``max_nodes`` of them and ``max_ids`` ids, and what is past that
waits on disk, read back (and taken off the disk) when its conversation goes on. When a file lists
each trajectory's turns together, what is on disk is never read again until the end.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sqlite3
import tempfile
from collections import OrderedDict
from typing import Any, Iterator

#: spilled nodes written to the file at a time
BATCH = 256


def _key(key: tuple) -> str:
    return repr(key)


class NodeStore:
    """``get`` / ``put`` by key; :meth:`drain` gives every node, in the order of ``node.order``."""

    def __init__(self, max_nodes: int, max_ids: int):
        self.max_nodes, self.max_ids = max_nodes, max_ids
        self._hot: OrderedDict = OrderedDict()
        self._ids = 0
        self._pending: dict[str, tuple[int, bytes]] = {}
        self._db: sqlite3.Connection | None = None
        self._dir: str | None = None
        #: how many nodes went to disk
        self.spilled = 0

    @staticmethod
    def _size(node: Any) -> int:
        return 0 if node.seq is None else len(node.seq)

    def get(self, key: tuple):
        node = self._hot.get(key)
        if node is not None:
            self._hot.move_to_end(key)
            return node
        name = _key(key)
        found = self._pending.pop(name, None)
        data = found[1] if found is not None else None
        if data is None and self._db is not None:
            row = self._db.execute("SELECT at, n FROM nodes WHERE k = ?", (name,)).fetchone()
            if row is not None:
                data = self._read(*row)
                self._db.execute("DELETE FROM nodes WHERE k = ?", (name,))
        if data is None:
            return None
        node = pickle.loads(data)
        self._hot[key] = node
        self._ids += self._size(node)
        return node

    def put(self, key: tuple, node: Any) -> None:
        old = self._hot.pop(key, None)
        if old is not None:
            self._ids -= self._size(old)
        self._hot[key] = node
        self._ids += self._size(node)
        while len(self._hot) > 1 and (len(self._hot) > self.max_nodes or self._ids > self.max_ids):
            out_key, out = self._hot.popitem(last=False)
            self._ids -= self._size(out)
            self._pending[_key(out_key)] = (out.order, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
            self.spilled += 1
        if len(self._pending) >= BATCH:
            self._flush()

    def resize(self, key: tuple, node: Any, seq) -> None:
        """``node`` (in memory, under ``key``: just got) is to hold ``seq`` now."""
        self._ids += (0 if seq is None else len(seq)) - self._size(node)

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._db is None:
            self._dir = tempfile.mkdtemp(prefix="recon-turns-")
            self._db = sqlite3.connect(os.path.join(self._dir, "nodes.sqlite"), isolation_level=None)
            self._db.execute("PRAGMA journal_mode = OFF")
            self._db.execute("PRAGMA synchronous = OFF")
            self._db.execute("CREATE TABLE nodes (k TEXT PRIMARY KEY, o INTEGER, at INTEGER, n INTEGER)")
            self._blobs = open(os.path.join(self._dir, "nodes.bin"), "w+b")
        self._blobs.seek(0, os.SEEK_END)
        at, rows = self._blobs.tell(), []
        for k, (order, v) in self._pending.items():  # the nodes in one file, where each is in the index
            rows.append((k, order, at, len(v)))
            at += len(v)
        self._blobs.write(b"".join(v for _, v in self._pending.values()))
        self._db.executemany("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?)", rows)
        self._pending.clear()

    def _read(self, at: int, n: int) -> bytes:
        self._blobs.seek(at)
        return self._blobs.read(n)

    def drain(self) -> Iterator[Any]:
        """Every node, in ``order``; the store is empty after, and its file gone."""
        try:
            if self._db is None:
                nodes = sorted([*self._hot.values(), *(pickle.loads(v) for _, v in self._pending.values())],
                               key=lambda n: n.order)
                self._hot.clear()
                self._pending.clear()
                yield from nodes
                return
            for key, node in self._hot.items():
                self._pending[_key(key)] = (node.order, pickle.dumps(node, protocol=pickle.HIGHEST_PROTOCOL))
            self._hot.clear()
            self._flush()
            self._db.execute("CREATE INDEX by_order ON nodes (o)")
            for at, n in self._db.execute("SELECT at, n FROM nodes ORDER BY o"):
                yield pickle.loads(self._read(at, n))
        finally:
            self.close()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._blobs.close()
            self._db = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
