"""Audits: ground-truth ids against reconstructions, every mismatch located and explained.

The mode follows from the record:

* *roundtrip* — only ``output_ids``: parse them to the API view a server would return,
  reconstruct, compare;
* *paired* — ``output_ids`` and ``response``: reconstruct from the response, compare;
* *reconstruct-only* — only ``response``: no verdict (status ``unverified``), flags only.

Each stretch where the ids differ gets a region and a cause (:mod:`recon.audit.classify`); a
sample's ``region`` and ``cause`` are its first divergence's, ``causes`` keeps them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from recon.audit.classify import CAUSES, WINDOW, _resegmented_batch, classify
from recon.audit.profiles import REGIONS, BoundProfile, ParseOptions
from recon.audit.reconstruct import METHODS, Reconstruction, reconstruct_batch
from recon.samples.records import Record, Response

if TYPE_CHECKING:
    import pandas as pd

STATUSES = ("exact", "mismatch", "error", "unverified")

COLUMNS = [
    "id", "dataset", "mode", "method", "status", "cause", "causes", "region", "first_diff", "rel_pos", "len_truth",
    "len_recon", "truth_piece", "recon_piece", "truth_id", "recon_id", "truth_window", "recon_window",
    "truth_pieces", "recon_pieces", "context_truth", "context_recon", "last_id", "flags", "error",
]


def mode_of(record: Record, mode: str = "auto") -> str:
    if mode != "auto":
        return mode
    if record.output_ids is not None and record.response is not None:
        return "paired"
    return "roundtrip" if record.output_ids is not None else "reconstruct-only"


def _pieces(tok, ids: Sequence[int]) -> list[str]:
    return tok.pieces_of(ids)


def _context(tok, ids: Sequence[int], at: int) -> str:
    return tok.ids_bytes(ids[max(0, at - 24) : at + 24]).decode("utf-8", "replace")


def _flags(bound: BoundProfile, view: Response | None) -> list[str]:
    """What makes a reconstruct-only record suspicious, though it can't be verified."""
    if view is None:
        return []
    flags = []
    texts = [t for t in (view.content, view.reasoning_content) if t]
    if any("\ufffd" in t for t in texts):
        flags.append("replacement_char")
    if any(s in t for t in texts for s in bound.tok.added_by_content):
        flags.append("special_text_in_content")
    if view.content and view.content != view.content.strip():
        flags.append("edge_whitespace")
    if view.finish_reason == "length":
        flags.append("truncated")
    if view.logprobs is None:
        flags.append("no_logprobs")
    return flags


_EMPTY_ROW = dict.fromkeys(COLUMNS)


def _row(record: Record, mode: str, method: str, status: str, **kw) -> dict:
    row = _EMPTY_ROW.copy()
    row.update(id=record.id, dataset=record.dataset, mode=mode, method=method, status=status, causes=[], flags=[])
    row.update(kw)
    return row


def compare(bound: BoundProfile, record: Record, mode: str, view: Response | None, rec: Reconstruction,
            resegmented: list[tuple[int, int, int, int]] | None = None, same: bool | None = None) -> dict:
    """One audit row for a record and its reconstruction (``resegmented``: see :func:`classify`;
    ``same``: whether the reconstruction's ids are the record's, when the caller compared them)."""
    tok = bound.tok
    truth = record.output_ids
    if rec.error is not None or rec.ids is None:
        return _row(record, mode, rec.method, "error", error=rec.error or "no reconstruction",
                    len_truth=len(truth) if truth else None, flags=_flags(bound, view))
    if mode == "reconstruct-only" or truth is None:
        return _row(record, mode, rec.method, "unverified", len_recon=len(rec.ids), flags=_flags(bound, view))
    base = dict(len_truth=len(truth), len_recon=len(rec.ids), last_id=truth[-1] if truth else None)
    if same if same is not None else rec.ids == truth:
        return _row(record, mode, rec.method, "exact", **base)
    found = classify(bound, truth, rec.ids, resegmented)
    first = found[0]
    k = first.i1
    t_at = truth[first.i1] if first.i1 < len(truth) else None
    r_at = rec.ids[first.j1] if first.j1 < len(rec.ids) else None
    return _row(
        record, mode, rec.method, "mismatch", cause=first.cause, causes=[d.cause for d in found], region=first.region,
        first_diff=k, rel_pos=k / len(truth) if truth else None,
        truth_id=t_at, recon_id=r_at,
        truth_piece=tok.piece(t_at) if t_at is not None else "(end)",
        recon_piece=tok.piece(r_at) if r_at is not None else "(end)",
        truth_window=list(truth[max(0, k - WINDOW) : k + WINDOW]),
        recon_window=list(rec.ids[max(0, first.j1 - WINDOW) : first.j1 + WINDOW]),
        truth_pieces=_pieces(tok, truth[max(0, k - WINDOW) : k + WINDOW]),
        recon_pieces=_pieces(tok, rec.ids[max(0, first.j1 - WINDOW) : first.j1 + WINDOW]),
        context_truth=_context(tok, truth, k), context_recon=_context(tok, rec.ids, first.j1), **base,
    )


SCHEMA_TYPES = {
    "first_diff": "int64", "rel_pos": "float64", "len_truth": "int64", "len_recon": "int64", "truth_id": "int64",
    "recon_id": "int64", "last_id": "int64", "causes": "list<string>", "truth_window": "list<int64>",
    "recon_window": "list<int64>", "truth_pieces": "list<string>", "recon_pieces": "list<string>", "flags": "list<string>",
}


def arrow_schema(prompts: bool = False):
    """The audit rows' Arrow schema (so chunks written one after another agree on types); with
    ``prompts``, the prompt audit's columns too (:mod:`recon.prompts.audit`)."""
    import pyarrow as pa

    from recon.prompts.audit import COLUMNS as PROMPT_COLUMNS
    from recon.prompts.audit import SCHEMA_TYPES as PROMPT_TYPES

    kinds = {"int64": pa.int64(), "float64": pa.float64(), "list<string>": pa.list_(pa.string()),
             "list<int64>": pa.list_(pa.int64())}
    types = {**SCHEMA_TYPES, **PROMPT_TYPES}
    columns = COLUMNS + (PROMPT_COLUMNS if prompts else [])
    return pa.schema([(c, kinds[types[c]] if c in types else pa.string()) for c in columns])


def audit_records(
    records: Sequence[Record],
    bound: BoundProfile,
    method: str = "auto",
    *,
    mode: str = "auto",
    options: ParseOptions | None = None,
    keep_ids: bool = False,
    prompts: Sequence[list[int] | None] | None = None,
) -> pd.DataFrame:
    """One row per record (see ``COLUMNS``); a record that fails is an ``error`` row, the rest go on.
    ``keep_ids`` adds a ``recon_ids`` column with each full reconstruction; ``prompts``: as for
    :func:`audit_rows` (``[r.prompt_ids for r in records]`` lets the engine's prompts decide)."""
    import pandas as pd

    rows = audit_rows(records, bound, method, mode=mode, options=options, keep_ids=keep_ids, prompts=prompts)
    return pd.DataFrame(rows, columns=COLUMNS + (["recon_ids"] if keep_ids else []))


def audit_rows(
    records: Sequence[Record],
    bound: BoundProfile,
    method: str = "auto",
    *,
    mode: str = "auto",
    options: ParseOptions | None = None,
    keep_ids: bool = False,
    prompts: Sequence[list[int] | None] | None = None,
) -> list[dict]:
    """:func:`audit_records` as plain dicts (what the streaming engine writes and Dask ships).

    ``prompts``, one per record (ids or None): where the profile has a ``reasoning_tag``, each
    record's prompt decides whether its sampled ids begin with the tag
    (:meth:`~recon.audit.profiles.Profile.after_prompt`); records are audited in groups of the
    same grammar and their rows come back in input order."""
    if prompts is not None and bound.profile.reasoning_tag:
        groups: dict[int, tuple[BoundProfile, list[int]]] = {}
        for k, prompt in enumerate(prompts):
            variant = bound.after_prompt_ids(prompt)
            groups.setdefault(id(variant), (variant, []))[1].append(k)
        if len(groups) > 1 or next(iter(groups.values()), (bound,))[0] is not bound:
            out: list[dict | None] = [None] * len(records)
            for variant, members in groups.values():
                part = audit_rows([records[k] for k in members], variant, method, mode=mode, options=options,
                                  keep_ids=keep_ids)
                for k, row in zip(members, part):
                    out[k] = row
            return out
    tok = bound.tok
    gaps, size = tok.gap_ids, tok.vocab_size
    rows: list[dict | None] = [None] * len(records)
    views: list[Response | None] = []
    slots: list[int] = []
    modes = [mode_of(r, mode) for r in records]
    to_parse: list[int] = []  # positions in views of roundtrip records, decoded in one batch
    for k, (record, m) in enumerate(zip(records, modes)):
        try:
            ids = record.output_ids
            checked = record.ids_below is not None and record.ids_below <= size
            if ids and ((not checked and (max(ids) >= size or min(ids) < 0)) or (gaps and not gaps.isdisjoint(ids))):
                p, bad = next((p, i) for p, i in enumerate(ids) if i >= size or i < 0 or i in gaps)
                raise ValueError(f"output_ids[{p}] = {bad} is not a token of {tok.name}")
            if m == "roundtrip":
                if ids is None:
                    raise ValueError("mode 'roundtrip' needs output_ids, and the record has none")
                to_parse.append(len(views))
                view = None
            elif record.response is not None:
                view = record.response
            else:
                raise ValueError(f"mode {m!r} needs a response, and the record has none")
            views.append(view)
            slots.append(k)
        except Exception as e:  # noqa: BLE001 - any failure on one record is reported on that record
            rows[k] = _row(record, m, method, "error", error=f"{type(e).__name__}: {e}")
    # a roundtrip record's text is its ids decoded: the reconstruction is told so, and where the
    # rendered view is that text again, its ids may be confirmed on the ids (recon.tokenizers.fast.canonical)
    decoded: list[str | None] = [None] * len(views)
    if to_parse:
        texts = bound.server_texts([records[slots[v]].output_ids for v in to_parse], options)
        same_text = options is None or not options.skip_special_tokens  # else the ids were filtered first
        for v, text in zip(to_parse, texts):
            views[v] = bound.parse_text(text, options)
            if same_text:
                decoded[v] = text
    results = (reconstruct_batch(views, bound, method, guesses=[records[k].output_ids for k in slots], decoded=decoded)
               if views else [])
    recon_ids: list = [None] * len(records)
    # mismatches that only re-segment the same bytes are located for the whole batch at once
    same = [rec.ids is not None and rec.ids == records[k].output_ids for k, rec in zip(slots, results)]
    differ = [v for v, (k, rec) in enumerate(zip(slots, results)) if not same[v] and rec.ids is not None and rec.error is None
              and modes[k] != "reconstruct-only" and records[k].output_ids is not None]
    stretches: list = [None] * len(results)
    if differ:
        for v, found in zip(differ, _resegmented_batch(tok, [(records[slots[v]].output_ids, results[v].ids) for v in differ])):
            stretches[v] = found
    for k, view, rec, found, agree in zip(slots, views, results, stretches, same):
        recon_ids[k] = rec.ids
        try:
            rows[k] = compare(bound, records[k], modes[k], view, rec, found, agree)
        except Exception as e:  # noqa: BLE001
            rows[k] = _row(records[k], modes[k], rec.method, "error", error=f"{type(e).__name__}: {e}")
    if keep_ids:
        for row, ids in zip(rows, recon_ids):
            row["recon_ids"] = ids
    return rows


def describe(row, tok) -> str:
    """One line in the seed's words: where a sample differs, and what each side has there."""
    import pandas as pd

    if row["status"] != "mismatch":
        return f"sample {row['id']}: {row['status']}" + (f" ({row['error']})" if pd.notna(row["error"]) else "")
    def text(i):
        return "(end)" if i is None or pd.isna(i) else repr(tok.id_to_bytes(int(i)).decode("utf-8", "replace")) + f" ({int(i)})"
    return (f"sample {row['id']} differs at position {int(row['first_diff'])} of {int(row['len_truth'])}: "
            f"original {text(row['truth_id'])}, reconstruction {text(row['recon_id'])} [{row['cause']}]")


def drilldown(row, tok) -> pd.DataFrame:
    """The ids and token texts around a sample's first divergence, ground truth beside reconstruction."""
    import pandas as pd

    k = int(row["first_diff"])
    t_ids, r_ids = list(row["truth_window"]), list(row["recon_window"])
    start = max(0, k - WINDOW)
    rows = []
    for n in range(max(len(t_ids), len(r_ids))):
        t = t_ids[n] if n < len(t_ids) else None
        r = r_ids[n] if n < len(r_ids) else None
        rows.append(dict(position=start + n, truth_id=t,
                         truth_text=None if t is None else tok.id_to_bytes(t).decode("utf-8", "replace"),
                         recon_id=r, recon_text=None if r is None else tok.id_to_bytes(r).decode("utf-8", "replace"),
                         differs=t != r))
    return pd.DataFrame(rows)


def audit_methods(records: Sequence[Record], bound: BoundProfile, methods: Iterable[str] = ("concat", "segments", "logprobs"),
                  *, mode: str = "auto", options: ParseOptions | None = None) -> pd.DataFrame:
    """The same records audited with each method, stacked (compare with :func:`recon.audit.stats.method_comparison`)."""
    import pandas as pd

    frames = [audit_records(records, bound, m, mode=mode, options=options).assign(method_asked=m) for m in methods]
    return pd.concat(frames, ignore_index=True)


__all__ = ["CAUSES", "COLUMNS", "METHODS", "REGIONS", "STATUSES", "audit_records", "audit_rows", "audit_methods", "classify", "compare",
           "describe", "drilldown", "mode_of"]
