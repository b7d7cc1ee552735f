"""Duplicate ids across a stream of any length, in flat memory."""

from __future__ import annotations

import hashlib


class SeenIds:
    """Which (dataset, id) keys a stream has had, in ~8 bytes a key: 64-bit hashes in a sorted
    NumPy array, with a small set for the newest. Memory stays flat on files of millions of
    records, where a dict of string keys would grow by hundreds of MB. (Two different ids share a
    64-bit hash with odds of about 1 in 10^7 per million records; such a pair is reported as a
    duplicate.)"""

    FLUSH = 65_536

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self._sorted = np.empty(0, dtype=np.int64)
        self._recent: set[int] = set()

    @staticmethod
    def key(dataset: str, rid: str) -> int:
        """The 64-bit key of a record's (dataset, id); the audit's workers compute these."""
        digest = hashlib.blake2b(f"{dataset}\x00{rid}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little", signed=True)

    def add(self, dataset: str, rid: str) -> bool:
        """Record the key; False if it was there already."""
        return self.add_keys([self.key(dataset, rid)])[0]

    def add_keys(self, keys: list[int]) -> list[bool]:
        """Record many keys (from :meth:`key`), in order; False for each one seen before (earlier
        in ``keys`` too). One array look-up for the whole list."""
        np = self._np
        arr = self._sorted
        at = np.searchsorted(arr, np.array(keys, dtype=np.int64)) if len(arr) else None
        old = (arr[np.minimum(at, len(arr) - 1)] == keys).tolist() if at is not None else [False] * len(keys)
        out = []
        recent = self._recent
        for key, before in zip(keys, old):
            fresh = not before and key not in recent
            if fresh:
                recent.add(key)
            out.append(fresh)
        if len(recent) >= self.FLUSH:
            self._sorted = self._merged(arr, recent)
            recent.clear()
        return out

    def _merged(self, arr, recent: set[int]):
        """``arr`` with ``recent`` merged in, allocating only the result (``union1d`` makes three copies)."""
        np = self._np
        new = np.sort(np.fromiter(recent, dtype=np.int64, count=len(recent)))
        out = np.empty(len(arr) + len(new), dtype=np.int64)
        at = np.searchsorted(arr, new) + np.arange(len(new))
        old = np.ones(len(out), dtype=bool)
        old[at] = False
        out[at] = new
        out[old] = arr
        return out
