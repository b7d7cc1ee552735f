"""Duplicate ids across a stream of any length, in flat memory."""

from __future__ import annotations

import hashlib


class SeenIds:
    """Which (dataset, id) keys a stream has had, in ~8 bytes a key: 64-bit hashes in sorted
    NumPy runs, with a small set for the newest. Memory stays flat on files of millions of
    records, where a dict of string keys would grow by hundreds of MB. (Two different ids share a
    64-bit hash with odds of about 1 in 10^7 per million records; such a pair is reported as a
    duplicate.)

    Why runs, not one sorted array: merging the newest keys into one array of every key copies
    that array (twice its size while it happens, ~16 MB on a million records); here the newest
    keys merge into the last run only while it stays within :attr:`RUN` keys (2 MB), so a merge
    never copies more than that, and a look-up is one binary search per run (four on a million
    records)."""

    FLUSH = 16_384  #: newest keys kept in a set (Python ints, ~70 bytes each) before they are sorted into a run
    RUN = 1 << 18  #: keys a run grows to by merging (2 MB); past that a new run starts

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self._runs: list = []  # sorted int64 arrays of keys, none shared, the newest last
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
        in ``keys`` too). One binary search per run for the whole list."""
        np = self._np
        wanted = np.array(keys, dtype=np.int64)
        seen = np.zeros(len(keys), dtype=bool)
        for run in self._runs:
            seen |= run[np.minimum(np.searchsorted(run, wanted), len(run) - 1)] == wanted
        out = []
        recent = self._recent
        for key, before in zip(keys, seen.tolist()):
            fresh = not before and key not in recent
            if fresh:
                recent.add(key)
            out.append(fresh)
        if len(recent) >= self.FLUSH:
            self._flush()
        return out

    def sorted_keys(self):
        """Every key recorded, sorted (an array; for checks, not the hot path)."""
        np = self._np
        every = [*self._runs, np.fromiter(self._recent, dtype=np.int64, count=len(self._recent))]
        return np.sort(np.concatenate(every))

    def _flush(self) -> None:
        """The newest keys sorted, and merged into the last run if that stays within :attr:`RUN`
        keys (else they start a run of their own)."""
        np = self._np
        new = np.sort(np.fromiter(self._recent, dtype=np.int64, count=len(self._recent)))
        self._recent.clear()
        runs = self._runs
        if runs and len(runs[-1]) + len(new) <= self.RUN:
            new = np.sort(np.concatenate((runs.pop(), new)), kind="stable")  # (two sorted runs: one linear merge)
        runs.append(new)
