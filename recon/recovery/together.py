"""Several searches at once, their scorer calls run as one: one forward pass for all of them.

Why: a forward pass of SmolLM2-135M on the CPU costs about 55 ms before it runs a single
position (its 540 MB of float32 weights are streamed through once), plus 3.3 ms a position
(``benchmarks/scorer_cost.py``). A search at t=1.3 makes about 80 calls of a few dozen new
positions each, so over a third of its time is that fixed cost. Searches of different records
run in threads here; each call waits until every search has one waiting, and then all of them
run as one call to the local scorer (its prefix tree runs their new positions in one pass: one
weight stream for many searches).

Deterministic: the calls are gathered in rounds (every search running contributes one call, a
search between two records holds its place until it has the next one's first call), and the
round's calls are run in record order, so which positions share a pass depends only on the
records and ``together``, never on thread timing.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Sequence


class Stopped(BaseException):
    """Raised in a search whose run was stopped (its results are no longer read). A
    BaseException, so that a search's own error handling does not take it for the record's."""


class _Call:
    __slots__ = ("order", "sequences", "temperature", "alternatives", "kwargs", "result", "error", "done")

    def __init__(self, order, sequences, temperature, alternatives, kwargs):
        self.order, self.sequences, self.temperature = order, sequences, temperature
        self.alternatives, self.kwargs = alternatives, kwargs
        self.result, self.error, self.done = None, None, False


class SharedScorer:
    """A scorer the threads of :func:`run_together` share: each thread's call waits for a round
    of one call per thread still working, run as one call to ``scorer`` (a
    :class:`~recon.recovery.scorers.LocalScorer`, which takes many sequences and per-sequence
    alternatives in one call)."""

    def __init__(self, scorer, workers: int):
        self.scorer = scorer
        for name in ("top_k", "tempered", "truncates", "batches_alternatives", "batch"):
            if hasattr(scorer, name):
                setattr(self, name, getattr(scorer, name))
        self._cond = threading.Condition()
        self._working = workers  # threads that will call again (a thread between records counts)
        self._waiting: list[_Call] = []
        self._local = threading.local()
        self._stopped = False

    def set_order(self, order: int) -> None:
        """The record the calling thread searches now (its calls run in this order in a round)."""
        self._local.order = order

    def __call__(self, sequences, temperature=1.0, alternatives=None, **kwargs):
        call = _Call(self._local.order, sequences, temperature, alternatives, kwargs)
        with self._cond:
            if self._stopped:
                raise Stopped
            self._waiting.append(call)
            if len(self._waiting) >= self._working:
                self._run_round()
            while not call.done and not self._stopped:
                self._cond.wait()
            if not call.done:
                raise Stopped
        if call.error is not None:
            raise call.error
        return call.result

    def stop(self) -> None:
        """Every search waiting, or calling from now on, raises :class:`Stopped`."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def leave(self) -> None:
        """The calling thread has no more records: rounds no longer wait for it."""
        with self._cond:
            self._working -= 1
            if self._waiting and len(self._waiting) >= self._working and not self._stopped:
                self._run_round()

    def _run_round(self) -> None:
        """Run every waiting call (the lock held: every other working thread waits on it)."""
        calls, self._waiting = sorted(self._waiting, key=lambda c: c.order), []
        groups: dict = {}  # calls that one scorer call can take together
        for call in calls:
            key = (call.temperature, tuple(sorted(call.kwargs.items())))
            groups.setdefault(key, []).append(call)
        for group in groups.values():
            seqs, alts = [], []
            for call in group:
                seqs += call.sequences
                alts += _per_sequence(call.alternatives, len(call.sequences))
            try:
                results = self.scorer(seqs, group[0].temperature, alts, **group[0].kwargs)
            except Exception as exc:  # noqa: BLE001 - each call raises it in its own search
                for call in group:
                    call.error = exc
            else:
                at = 0
                for call in group:
                    call.result = results[at : at + len(call.sequences)]
                    at += len(call.sequences)
            for call in group:
                call.done = True
        self._cond.notify_all()


def _per_sequence(alternatives, n: int) -> list[dict]:
    """A call's alternatives as one dict per sequence (the scorer protocol's single dict applies
    to a single sequence)."""
    if isinstance(alternatives, list):
        return alternatives
    return [alternatives or {}] if n == 1 else [{} for _ in range(n)]


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def run_together(jobs: Sequence, work: Callable[[int, object, SharedScorer], object], scorer, workers: int) -> Iterator:
    """``work(k, jobs[k], shared)`` for every job, ``workers`` at a time in threads sharing one
    :class:`SharedScorer`; the results in job order, each as soon as it and those before it are
    done. ``work`` must not raise (a search's failure is its record's result). When the reader
    stops early (closes the iterator, or is interrupted), the searches still running are stopped
    (:class:`Stopped`) and the threads joined."""
    workers = min(workers, len(jobs))
    shared = SharedScorer(scorer, workers)
    lock = threading.Lock()
    nxt = iter(range(len(jobs)))
    results: dict[int, object] = {}
    ready = threading.Condition()

    def worker() -> None:
        try:
            while not shared.stopped:
                with lock:
                    k = next(nxt, None)
                if k is None:
                    return
                shared.set_order(k)
                try:
                    out = work(k, jobs[k], shared)
                except BaseException as exc:  # noqa: BLE001 - a bug: raised where the results are read
                    out = _Failed(exc)
                with ready:
                    results[k] = out
                    ready.notify_all()
        finally:
            shared.leave()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        for k in range(len(jobs)):
            with ready:
                while k not in results:
                    ready.wait()
                out = results.pop(k)
            if isinstance(out, _Failed):
                raise out.error
            yield out
    finally:  # all read, or the reader stopped (closed, interrupted, raised): no thread goes on
        shared.stop()
        for t in threads:
            t.join()
