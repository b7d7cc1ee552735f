"""The audit at scale: input streamed in chunks, rows written as they come, a summary in constant
memory, optionally spread over a Dask cluster.

The per-chunk work is :func:`recon.audit.audit_records`: one batched decode and one batched
encode through the tokenizer's native core for the whole chunk, Python only for the comparison
and for explaining mismatches. Memory holds one chunk (per worker), whatever the file size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .audit import arrow_schema, audit_rows
from .errors import ReconError
from .io import RecordError
from .profiles import BoundProfile, ParseOptions, load_profile
from .records import Record, iter_records
from .stats import Tally

DEFAULT_CHUNK = 10_000


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
                options: ParseOptions | None, records: Sequence[Record]) -> list[dict]:
    """Audit one chunk in whatever process runs this (the driver, or a Dask worker)."""
    return audit_rows(records, _bound(tokenizer, family, profile), method, mode=mode, options=options)


@dataclass
class AuditRun:
    summary: dict
    errors: list[RecordError] = field(default_factory=list)
    rows_path: Path | None = None


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


def audit_files(
    paths: Sequence[str | Path],
    *,
    tokenizer: str,
    profile: str,
    family: str | None = None,
    method: str = "auto",
    mode: str = "auto",
    options: ParseOptions | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    rows_path: str | Path | None = None,
    dask: str | None = None,
    client=None,
    progress: bool | None = None,
) -> AuditRun:
    """Audit every record of ``paths`` chunk by chunk; write rows to ``rows_path`` (Parquet) if given.

    ``dask``: ``"local"`` (a LocalCluster on this machine) or a scheduler address; or pass a
    ``client``. Results are identical to the in-process run, in input order.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm

    bound = _bound(tokenizer, family, profile)  # fail fast on a bad spec or profile, before any work
    errors: list[RecordError] = []
    chunks = iter_chunks(paths, chunk_size, vocab_size=bound.tok.vocab_size, errors=errors)
    tally = Tally()
    writer = None
    schema = arrow_schema()
    if rows_path is not None:
        rows_path = Path(rows_path)
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        writer = pq.ParquetWriter(rows_path, schema)
    bar = tqdm(desc="audit", unit="sample", disable=None if progress is None else not progress)
    own_client = client is None and dask is not None
    if own_client:
        client = _dask_client(dask)
    try:
        for rows in _chunks_audited(chunks, client, (tokenizer, family, profile, method, mode, options)):
            tally.add(rows)
            if writer is not None:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            bar.update(len(rows))
            del rows
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        if own_client:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
    if not tally.by_dataset:
        raise ReconError(f"no usable records in {', '.join(map(str, paths))} ({len(errors)} bad)")
    return AuditRun(tally.summary(), errors, rows_path)


def _chunks_audited(chunks: Iterator[list[Record]], client, args: tuple) -> Iterator[list[dict]]:
    """Audited chunks in input order: here, or on the cluster with a bounded number in flight."""
    if client is None:
        for chunk in chunks:
            rows = audit_chunk(*args, chunk)
            del chunk
            yield rows
            del rows
        return
    from collections import deque

    in_flight: deque = deque()
    limit = 2 * max(len(client.scheduler_info().get("workers", {})), 1)
    for chunk in chunks:
        in_flight.append(client.submit(audit_chunk, *args, chunk, pure=False))
        if len(in_flight) >= limit:
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()
