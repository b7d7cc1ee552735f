"""The audit at scale: input streamed in chunks, rows written as they come, a summary in constant
memory, optionally spread over a Dask cluster.

The per-chunk work is :func:`recon.audit.audit_rows`: one batched decode through the tokenizer's
native core, one batched encode through its word cache (:mod:`recon.wordcache`), mismatches
located for the whole chunk at once. Chunks go to one worker process per core (or a Dask
cluster); each sends back a tally and, when rows are kept, an Arrow table. Memory holds a few
chunks in flight, whatever the file size.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .audit import arrow_schema, audit_rows
from .errors import ReconError
from .export import Policy, TableWriter, check_policy, export_rows
from .export import arrow_schema as export_schema
from .io import RecordError, bad_record_count
from .profiles import BoundProfile, ParseOptions, load_profile
from .records import Record, iter_records
from .stats import Tally

#: Records per chunk: big enough that batch calls dominate, small enough that a worker's
#: working set (~10 KB a record while audited) stays a few tens of MB.
DEFAULT_CHUNK = 2_000


def iter_chunks(paths: Iterable[str | Path], size: int, *, vocab_size: int | None, errors: list[RecordError]) -> Iterator[list[Record]]:
    """Records in chunks of ``size``, streamed; bad records are appended to ``errors``."""
    def good() -> Iterator[Record]:
        for path in paths:
            for item in iter_records(path, vocab_size=vocab_size):
                if isinstance(item, RecordError):
                    errors.append(item)
                else:
                    yield item
    stream = good()
    while True:
        chunk = list(islice(stream, size))
        if not chunk:
            return
        yield chunk
        del chunk  # one chunk of records alive at a time, not two


@lru_cache(maxsize=4)
def _bound(tokenizer: str, family: str | None, profile: str) -> BoundProfile:
    """One tokenizer and profile per process: a Dask worker loads them once."""
    from .loading import load_tokenizer

    return load_profile(profile).bind(load_tokenizer(tokenizer, family=family))


def audit_chunk(tokenizer: str, family: str | None, profile: str, method: str, mode: str,
                options: ParseOptions | None, records: Sequence[Record], keep_ids: bool = False) -> list[dict]:
    """Audit one chunk in whatever process runs this (the driver, or a worker)."""
    return audit_rows(records, _bound(tokenizer, family, profile), method, mode=mode, options=options, keep_ids=keep_ids)


def audit_chunk_counted(args: tuple, output: str | None, records: Sequence[Record]):
    """One chunk's :class:`Tally`, a table, and its size: what a worker sends back (a few hundred
    bytes, or columnar rows that unpickle ~100x faster than dicts). ``output``: None (no table),
    ``"rows"`` (the audit rows), or an export policy (the export rows, :mod:`recon.export`)."""
    import pyarrow as pa

    exporting = output not in (None, "rows")
    rows = audit_chunk(*args, records, keep_ids=exporting)
    if output is None:
        table = None
    elif exporting:
        table = pa.Table.from_pylist(export_rows(records, rows, output), schema=export_schema())
    else:
        table = pa.Table.from_pylist(rows, schema=arrow_schema())
    return Tally().add(rows), table, len(rows)


@dataclass
class AuditRun:
    summary: dict
    errors: list[RecordError] = field(default_factory=list)
    #: where the rows went: the audit rows, or the export
    rows_path: Path | None = None
    #: with an export: how many rows have ``keep`` set
    kept: int | None = None


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


def audit_files(paths: Sequence[str | Path], *, tokenizer: str, profile: str, family: str | None = None,
                chunk_size: int = DEFAULT_CHUNK, **kw) -> AuditRun:
    """Audit every record of ``paths``, streamed in chunks of ``chunk_size``; bad records are
    reported in the run's ``errors`` and the rest go on. Keywords as for :func:`audit_stream`."""
    bound = _bound(tokenizer, family, profile)  # fail fast on a bad spec or profile, before any work
    errors: list[RecordError] = []
    chunks = iter_chunks(paths, chunk_size, vocab_size=bound.tok.vocab_size, errors=errors)
    run = audit_stream(chunks, tokenizer=tokenizer, profile=profile, family=family, **kw)
    run.errors = errors
    if not run.summary["samples"]:
        first = f"; first: {errors[0]}" if errors else ""
        raise ReconError(f"no usable records in {', '.join(map(str, paths))} ({bad_record_count(errors)} bad{first})")
    return run


def audit_stream(
    chunks: Iterable[Sequence[Record]],
    *,
    tokenizer: str,
    profile: str,
    family: str | None = None,
    method: str = "auto",
    mode: str = "auto",
    options: ParseOptions | None = None,
    rows_path: str | Path | None = None,
    export_path: str | Path | None = None,
    policy: "str | Policy" = "exact-only",
    dask: str | None = None,
    client=None,
    workers: int | None = None,
    progress: bool | None = None,
) -> AuditRun:
    """Audit chunks of records; write the audit rows to ``rows_path`` (Parquet), or the
    training-ready export under ``policy`` (a name, or a :class:`~recon.export.Policy` with its
    setting, e.g. ``recover``'s least confidence) to ``export_path`` (Parquet or JSONL), in input order.

    Chunks go to ``workers`` processes on this machine (default: one per core; 1 = this process).
    ``dask``: ``"local"`` (a LocalCluster on this machine) or a scheduler address; or pass a
    ``client``. Results are identical whichever runs them.
    """
    import pyarrow.compute as pc
    from tqdm.auto import tqdm

    if rows_path is not None and export_path is not None:
        raise ReconError("write audit rows or an export, not both in one run")
    if export_path is not None:
        check_policy(policy)
    _bound(tokenizer, family, profile)  # loaded here, so forked workers start with it
    tally, kept = Tally(), 0
    writer, output = None, None
    if rows_path is not None:
        writer, output = TableWriter(rows_path, arrow_schema()), "rows"
    elif export_path is not None:
        writer, output = TableWriter(export_path, export_schema()), policy
    bar = tqdm(desc="audit", unit="sample", disable=None if progress is None else not progress)
    own_client = client is None and dask is not None
    if own_client:
        client = _dask_client(dask)
    args = (tokenizer, family, profile, method, mode, options)
    try:
        for counted, table, n in _chunks_audited(iter(chunks), args, output, client, workers):
            tally.merge(counted)
            if writer is not None:
                writer.write(table)
                if export_path is not None:
                    kept += pc.sum(table["keep"]).as_py() or 0
            bar.update(n)
            del table
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        if own_client:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
    return AuditRun(tally.summary(), [], writer.path if writer is not None else None,
                    kept if export_path is not None else None)


def _chunks_audited(chunks: Iterator[list[Record]], args: tuple, output: str | None, client, workers: int | None):
    """(tally, rows table or None, count) per chunk, in input order: in this process, in a pool of
    worker processes, or on a Dask cluster, with a bounded number of chunks in flight."""
    from functools import partial

    work = partial(audit_chunk_counted, args, output)
    if client is not None:
        limit = 2 * max(len(client.scheduler_info().get("workers", {})), 1)
        yield from _bounded(chunks, lambda chunk: client.submit(work, chunk, pure=False), lambda f: f.result(), limit)
        return
    workers = default_workers() if workers is None else workers
    if workers > 1:
        first = next(chunks, None)
        second = next(chunks, None) if first is not None else None
        if second is not None:  # two chunks or more: worth starting processes
            pending = [first, second]
            del first, second
            with _pool(workers) as pool:
                yield from _bounded(_prepend(pending, chunks), lambda chunk: pool.apply_async(work, (chunk,)),
                                    lambda r: r.get(), 2 * workers)
            return
        chunks = iter([first] if first is not None else [])
        del first
    for chunk in chunks:
        result = work(chunk)
        del chunk  # before the next chunk is read: one chunk alive at a time
        yield result


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
        gc.collect()
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
