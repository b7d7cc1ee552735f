"""The audit at scale: input streamed in chunks, rows written as they come, a summary in constant
memory, optionally spread over a Dask cluster.

The per-chunk work is :func:`recon.audit.audit_rows`: one batched decode through the tokenizer's
native core, one batched encode through its word cache (:mod:`recon.tokenizers.fast.wordcache`), mismatches
located for the whole chunk at once. Chunks go to one worker process per core (or a Dask
cluster); each sends back a tally and, when rows are kept, an Arrow table. Memory holds a few
chunks in flight, whatever the file size.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from recon.audit.compare import arrow_schema, audit_rows
from recon.audit.prefix_run import PrefixRun
from recon.audit.profiles import BoundProfile, ParseOptions, load_profile
from recon.audit.tally import Tally
from recon.audit.workers import _bounded, _dask_client, _pool, _prepend, _progress_bar, default_workers
from recon.errors import ReconError
from recon.prompts.audit import counts as prompt_counts
from recon.prompts.audit import prompts_audited
from recon.audit.turns import chunk_turns
from recon.prompts.render import PromptMaker
from recon.prompts.template import ChatTemplate
from recon.samples.export import Policy, TableWriter, TrainerLines, check_policy, export_rows, trainer_lines, trainer_rows
from recon.samples.export import arrow_schema as export_schema
from recon.samples.io import RecordError, bad_record_count, read_spans
from recon.samples.records import Record, SeenIds, duplicate_error, iter_raw, parse_raw

#: Records per chunk: big enough that batch calls dominate, small enough that a worker's
#: working set (~10 KB a record while audited) stays a few tens of MB. (2,000 audited as fast,
#: but the heap a worker keeps after many chunks grew ~40 MB past what the first few needed.)
DEFAULT_CHUNK = 1_000


@dataclass
class RawChunk:
    """Input not parsed yet: (path, line, raw bytes / Parquet row / RecordError) items, parsed and
    validated by whichever process audits them (:func:`parse_raw`). The reading process only
    moves bytes: parsing ids into Python ints, and shipping them between processes, cost more
    than the audit of a cold sample."""

    items: list[tuple[str, int, object]]
    vocab_size: int | None

    def parse(self) -> tuple[list[Record], list[RecordError]]:
        records, errors = [], []
        for path, line, item in read_spans(self.items):
            got = parse_raw(path, line, item, vocab_size=self.vocab_size)
            if isinstance(got, Record):
                records.append(got)
            elif got:
                errors += got
        return records, errors


def iter_raw_chunks(paths: Iterable[str | Path], size: int, *, vocab_size: int | None,
                    spans: bool = False) -> Iterator[RawChunk]:
    """The files' lines in chunks of ``size``, unparsed, streamed (``spans``: a plain file's lines
    as where they are, for a worker on this machine to read)."""
    stream = ((str(path), line, item) for path in paths for line, item in iter_raw(path, spans=spans))
    while True:
        items = list(islice(stream, size))
        if not items:
            return
        yield RawChunk(items, vocab_size)
        del items


#: how batch encodes run: ``fast`` (the exact fast paths, checked against the native encoder) or
#: ``native`` (every text through the tokenizer's own encoder)
ENCODERS = ("fast", "native")


@lru_cache(maxsize=4)
def _bound(tokenizer: str, family: str | None, profile: str, encoder: str = "fast") -> BoundProfile:
    """One tokenizer and profile per process: a Dask worker loads them once."""
    from recon.tokenizers.load import load_tokenizer

    if encoder not in ENCODERS:
        raise ReconError(f"encoder {encoder!r}: expected one of {', '.join(ENCODERS)}")
    tok = load_tokenizer(tokenizer, family=family)
    tok.fast_paths = encoder == "fast"
    return load_profile(profile).bind(tok.prepare())  # before workers fork


@dataclass(frozen=True)
class Prompts:
    """How a run finds each record's prompt: the chat template its requests are rendered with
    (None: only the engine's ``prompt_ids`` count), and whether the prompt audit runs. Hashable
    and picklable: it travels to the workers with the rest of a chunk's settings."""

    template: ChatTemplate | None = None
    audit: bool = True


@lru_cache(maxsize=4)
def _maker(tokenizer: str, family: str | None, profile: str, encoder: str, template: ChatTemplate | None) -> PromptMaker:
    return PromptMaker(_bound(tokenizer, family, profile, encoder).tok, template)


def audit_chunk(tokenizer: str, family: str | None, profile: str, method: str, mode: str,
                options: ParseOptions | None, encoder: str, prompts_setup: Prompts | None, records: Sequence[Record],
                keep_ids: bool = False, prompts: list | None = None) -> list[dict]:
    """Audit one chunk in whatever process runs this (the driver, or a worker); ``prompts``: each
    record's prompt ids, which decide where its sampled ids begin (see :func:`audit_rows`)."""
    bound = _bound(tokenizer, family, profile, encoder)
    return audit_rows(records, bound, method, mode=mode, options=options, keep_ids=keep_ids, prompts=prompts)


@dataclass
class ChunkResult:
    """What a worker sends back for one chunk: a few bytes a record, or columnar rows that
    unpickle ~100x faster than dicts."""

    #: (dataset, status, cause) of each record audited, in order
    counts: list[tuple[str, str, str | None]]
    #: the chunk's rows (audit rows or export rows), or None
    table: object
    #: the problems of the chunk's bad records (a raw chunk's)
    errors: list[RecordError]
    #: (path, line, dataset, id, 64-bit key) of each record audited, for the reader to find
    #: duplicate ids (a raw chunk's)
    keys: list[tuple[str, int, str, str, int]] | None = None
    #: (prompt source, status, cause, region) of each record, when prompts are audited
    prompt_counts: list[tuple[str, str, str | None, str | None]] | None = None
    #: each record's place in a multi-turn trajectory (:class:`recon.audit.turns.TurnInfo`), when any has one
    turns: list | None = None


@contextmanager
def _no_cycle_collection():
    """The cyclic garbage collector paused: a chunk allocates millions of lists (ids, cache
    entries) and makes no cycles worth collecting, and the collector would walk the whole word
    cache again and again (~10% of a cold chunk's time). Reference counting still frees
    everything; the collector's state is restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def audit_chunk_counted(args: tuple, output: str | None, chunk: "Sequence[Record] | RawChunk") -> ChunkResult:
    """Audit one chunk (parsing it first if raw). ``output``: None (no table), ``"rows"`` (the
    audit rows), or an export policy (the export rows, :mod:`recon.samples.export`)."""
    with _no_cycle_collection():
        return _audit_chunk_counted(args, output, chunk)


def _audit_chunk_counted(args: tuple, output: str | None, chunk: "Sequence[Record] | RawChunk") -> ChunkResult:
    errors: list[RecordError] = []
    keys = None
    if isinstance(chunk, RawChunk):
        records, errors = chunk.parse()
        keys = [(*r.origin, r.dataset, r.id, SeenIds.key(r.dataset, r.id)) for r in records]
    else:
        records = chunk
    exporting = output not in (None, "rows")
    setup: Prompts | None = args[7]
    prompts, prompt_rows = None, None
    if setup is not None and records:
        tokenizer, family, profile, _, _, _, encoder, _ = args
        prompts, prompt_rows = prompts_audited(_maker(tokenizer, family, profile, encoder, setup.template), records,
                                               audit=setup.audit)
    linked = any(r.conversation is not None or r.messages for r in records)
    need_recon = linked and any(r.output_ids is None for r in records)
    rows = audit_chunk(*args, records, keep_ids=exporting or need_recon,
                       prompts=None if prompts is None else [p.ids for p in prompts]) if records else []
    table, exported = None, None
    if exporting:
        exported = export_rows(records, rows, output)
    if output is not None:
        import pyarrow as pa

        if exporting:
            if _policy_format(output) == "table":
                table = pa.Table.from_pylist(exported, schema=export_schema())
            else:
                made = trainer_rows(records, exported, prompts or [None] * len(records), output)
                table = (trainer_lines(made) if output.lines
                         else pa.Table.from_pylist(made, schema=export_schema(_policy_format(output))))
        else:
            if prompt_rows is not None:
                for row, extra in zip(rows, prompt_rows):
                    row.update(extra)
            table = pa.Table.from_pylist(rows, schema=arrow_schema(prompts=prompt_rows is not None))
    counts = [(r["dataset"], r["status"], r["cause"]) for r in rows]
    return ChunkResult(counts, table, errors, keys,
                       None if prompt_rows is None else [prompt_counts(r) for r in prompt_rows],
                       chunk_turns(records, rows, prompts, exported, _bound(*args[:3], args[6])) if linked else None)


def _policy_format(policy: "str | Policy") -> str:
    return policy.format if isinstance(policy, Policy) else "table"


@dataclass
class AuditRun:
    summary: dict
    errors: list[RecordError] = field(default_factory=list)
    #: where the rows went: the audit rows, or the export
    rows_path: Path | None = None
    #: with an export: how many rows have ``keep`` set
    kept: int | None = None


def audit_files(paths: Sequence[str | Path], *, tokenizer: str, profile: str, family: str | None = None,
                chunk_size: int = DEFAULT_CHUNK, **kw) -> AuditRun:
    """Audit every record of ``paths``, streamed in chunks of ``chunk_size``; bad records are
    reported in the run's ``errors`` and the rest go on. Keywords as for :func:`audit_stream`."""
    bound = _bound(tokenizer, family, profile, kw.get("encoder", "fast"))  # fail fast on a bad spec or profile
    workers = kw.get("workers")
    local = kw.get("dask") is None and kw.get("client") is None and (workers is None or workers > 1)
    # workers on this machine read their own lines (a Dask worker may not see the files: it gets the bytes)
    chunks = iter_raw_chunks(paths, chunk_size, vocab_size=bound.tok.vocab_size, spans=local)
    run = audit_stream(chunks, tokenizer=tokenizer, profile=profile, family=family, **kw)
    errors = run.errors
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
    encoder: str = "fast",
    prompts: Prompts | None = None,
) -> AuditRun:
    """Audit chunks of records (or :class:`RawChunk` s, parsed where they are audited, their bad
    records in the run's ``errors``, duplicate ids too); write the audit rows to ``rows_path`` (Parquet), or the
    training-ready export under ``policy`` (a name, or a :class:`~recon.samples.export.Policy` with its
    setting, e.g. ``recover``'s least confidence) to ``export_path`` (Parquet or JSONL), in input order.

    Chunks go to ``workers`` processes on this machine (default: one per core; 1 = this process).
    ``dask``: ``"local"`` (a LocalCluster on this machine) or a scheduler address; or pass a
    ``client``. Results are identical whichever runs them, and whichever ``encoder``
    (:data:`ENCODERS`) encodes.

    ``prompts`` (:class:`Prompts`): find each record's prompt (the engine's ids, else its request
    rendered with the template), let it decide where the sampled ids begin, and audit the engine's
    prompt against the render; the rows gain the prompt-audit columns and the summary a
    ``prompts`` part. An export in a trainer format (``policy.format``) needs it.
    """
    if rows_path is not None and export_path is not None:
        raise ReconError("write audit rows or an export, not both in one run")
    if export_path is not None:
        check_policy(policy)
    _bound(tokenizer, family, profile, encoder)  # loaded here, so forked workers start with it
    if prompts is not None:
        _maker(tokenizer, family, profile, encoder, prompts.template)
    tally, kept = Tally(), 0
    writer, output = None, None
    prefix = PrefixRun(_bound(tokenizer, family, profile, encoder),
                       boundaries_path=None if rows_path is None else Path(rows_path).with_name("boundaries.parquet"),
                       policy=policy if export_path is not None and isinstance(policy, Policy) else None,
                       export_path=export_path)
    if rows_path is not None:
        writer, output = TableWriter(rows_path, arrow_schema(prompts=prompts is not None and prompts.audit)), "rows"
    elif export_path is not None:
        schema = export_schema(_policy_format(policy))
        if _policy_format(policy) != "table":
            if prompts is None:
                raise ReconError(f"an export in {_policy_format(policy)}'s format needs prompts (Prompts)")
            schema = schema.remove(schema.get_field_index("drop")).remove(schema.get_field_index("keep"))
        writer, output = TableWriter(prefix.generations_path(export_path), schema), policy
        if _policy_format(policy) != "table" and writer.path.suffix != ".parquet":
            output = replace(policy, lines=True)
    drops: dict[str, int] = {}
    bar = _progress_bar(progress)
    own_client = client is None and dask is not None
    if own_client:
        client = _dask_client(dask)
    args = (tokenizer, family, profile, method, mode, options, encoder, prompts)
    errors: list[RecordError] = []
    seen: dict[str, SeenIds] = {}
    try:
        for result in _chunks_audited(iter(chunks), args, output, client, workers):
            counts, table, prompted = _drop_duplicates(result, seen, errors)
            prefix.add(result.turns)
            tally.add_counts(counts)
            if prompted is not None:
                tally.add_prompt_counts(prompted)
            if isinstance(table, TrainerLines):  # a JSONL trainer export: lines made in the workers
                kept += sum(line is not None for line in table.lines)
                for why in table.drops:
                    if why is not None:
                        drops[why] = drops.get(why, 0) + 1
                writer.write(table)
            elif writer is not None:
                if export_path is not None:
                    import pyarrow.compute as pc

                    kept += pc.sum(table["keep"]).as_py() or 0
                    if "drop" in table.column_names:  # a trainer's rows: only the kept ones are written
                        for why in table["drop"].to_pylist():
                            if why is not None:
                                drops[why] = drops.get(why, 0) + 1
                        table = table.filter(table["keep"]).drop_columns(["keep", "drop"])
                writer.write(table)
            bar.update(len(counts))
            del table, result
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        if own_client:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
    summary = tally.summary()
    if prompts is not None and prompts.audit:
        summary["prompts"] = tally.prompt_summary()
    conversations = prefix.finish()
    if prefix.conversations.counts["generations"]:
        summary["conversations"] = conversations
    if export_path is not None and _policy_format(policy) != "table":
        summary["export"] = {"format": _policy_format(policy), "rows": kept, "dropped": dict(sorted(drops.items()))}
        if prefix.policy is not None:
            generations, whole = prefix.write_export()
            summary["export"].update(rows=generations + whole, kept_generations=kept, generation_rows=generations,
                                     trajectory_rows=whole,
                                     trajectories={"whole": conversations["whole"], "cut": conversations["cut"],
                                                   "by_cause": conversations["cut_by_cause"]})
            kept = generations + whole
    path = Path(export_path) if prefix.policy is not None else (writer.path if writer is not None else None)
    return AuditRun(summary, errors, path, kept if export_path is not None else None)


def _drop_duplicates(result: ChunkResult, seen: dict[str, SeenIds], errors: list[RecordError]):
    """A chunk's counts and table without the records whose (dataset, id) an earlier line of the
    same file had; those, and the chunk's bad records, go to ``errors`` in line order."""
    found = list(result.errors)
    counts, table, prompted = result.counts, result.table, result.prompt_counts
    if result.keys is not None:
        keep = []
        for path in dict.fromkeys(key[0] for key in result.keys):  # a chunk may span files: each has its own ids
            if path not in seen:
                seen[path] = SeenIds()
            ids = seen[path]
            mine = [k for k, key in enumerate(result.keys) if key[0] == path]
            keep += zip(mine, ids.add_keys([result.keys[k][4] for k in mine]))
        keep = [ok for _, ok in sorted(keep)]
        if not all(keep):
            found += [duplicate_error(path, line, dataset, rid)
                      for (path, line, dataset, rid, _), ok in zip(result.keys, keep) if not ok]
            counts = [c for c, ok in zip(counts, keep) if ok]
            if result.turns is not None:
                result.turns = result.turns.filter(keep)
            if prompted is not None:
                prompted = [c for c, ok in zip(prompted, keep) if ok]
            if table is not None:
                import pyarrow as pa

                table = table.filter(pa.array(keep))
    order = {path: k for k, path in enumerate(dict.fromkeys(e.path for e in found))}
    errors += sorted(found, key=lambda e: (order[e.path], e.line))
    return counts, table, prompted


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

