"""Where an audit's chunks run: in this process, in a pool of worker processes on this machine, or
on a Dask cluster, with a bounded number in flight; and the progress bar that counts them.

Kept apart from :mod:`recon.audit.engine` (what a chunk's audit is) because none of it knows what
a chunk holds: the recovery's distributed runs use the same pieces.
"""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from recon.errors import ReconError


def _dask_client(address: str):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ReconError("--dask needs dask[distributed]: pip install 'dask[distributed]'") from None
    if address == "local":
        cluster = LocalCluster(n_workers=os.cpu_count() or 2, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        return Client(cluster)
    try:
        return Client(address, timeout="30s")
    except OSError as e:
        raise ReconError(f"cannot reach the Dask scheduler at {address} ({e})") from None


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(progress: bool | None):
    """tqdm's bar, or nothing where none would show (``progress=None``: a terminal or a notebook
    shows one): a command whose output goes to a file or a pipe doesn't import tqdm at all."""
    if progress is False or (progress is None and not sys.stderr.isatty() and "ipykernel" not in sys.modules):
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(desc="audit", unit="sample", disable=None if progress is None else not progress)


def _prepend(items: list, rest: Iterator) -> Iterator:
    """``items`` then ``rest``, dropping each item as it goes (so it can be freed once used)."""
    while items:
        yield items.pop(0)
    yield from rest


def _bounded(chunks: Iterator, submit, result, limit: int):
    """Results of ``submit(chunk)`` in order, at most ``limit`` chunks submitted and not yet taken."""
    from collections import deque

    in_flight: deque = deque()
    for chunk in chunks:
        in_flight.append(submit(chunk))
        del chunk
        if len(in_flight) >= limit:
            yield result(in_flight.popleft())
    while in_flight:
        yield result(in_flight.popleft())


def default_workers() -> int:
    """Worker processes for a local audit: the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def _pool(workers: int):
    """A pool of worker processes. Forked where the platform allows, so workers start with the
    tokenizer this process loaded (``_bound`` is cached) instead of loading it again."""
    import multiprocessing as mp

    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    if method == "fork":
        # objects the parent already has (the tokenizer's tables, the vocabulary) move out of the
        # collector's reach, so no collection in a child writes to their pages and copies them
        # (no collection first: it would walk them all once more, for the little garbage start-up leaves)
        gc.freeze()
    try:
        with mp.get_context(method).Pool(workers, initializer=_worker_init) as pool:
            yield pool
    finally:
        if method == "fork":
            gc.unfreeze()  # a long-lived caller (a notebook kernel) collects as before


def _worker_init() -> None:
    # a forked child must not reuse the parent's tokenizer thread pool; saying so up front also
    # keeps `tokenizers` from printing its fork warning. Workers are the parallelism here.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
