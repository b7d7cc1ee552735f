"""Audits: ground-truth ids against reconstructions, every mismatch located and explained.

The mode follows from the record:

* *roundtrip* — only ``output_ids``: parse them to the API view a server would return,
  reconstruct, compare;
* *paired* — ``output_ids`` and ``response``: reconstruct from the response, compare;
* *reconstruct-only* — only ``response``: no verdict (status ``unverified``), flags only.

Each stretch where the ids differ gets a region and a cause; a sample's ``region`` and ``cause``
are its first divergence's, ``causes`` keeps them all. The region (reasoning, content, tool call,
end: :meth:`recon.profiles.BoundProfile.regions` on each side's bytes) is decided first, because
the same difference means different things in different places: a space missing inside a tool
call is the call's re-serialization, at the edge of the content an API's trim. Where both sides
spell the same bytes, stretches are found by a linear walk over token boundaries; only past the
first differing byte does ``difflib`` align the ids.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import accumulate, chain, compress, count
from operator import ne
from typing import TYPE_CHECKING, AbstractSet, Iterable, Sequence

from .profiles import REGIONS, BoundProfile, ParseOptions
from .reconstruct import METHODS, Reconstruction, reconstruct_batch
from .records import Record, Response

if TYPE_CHECKING:
    import pandas as pd

CAUSES = (
    "non_canonical_bpe",       # same bytes, different segmentation
    "invalid_utf8",            # ids that don't decode to valid UTF-8 (cut inside a character)
    "special_text_collision",  # content holds a special token's text, which re-encodes as the special id
    "special_token_mismatch",  # a special id differs, is missing or extra
    "whitespace_trim",         # the API view lost or gained whitespace at a boundary
    "tool_call_format",        # bytes differ inside the calls section: JSON re-spaced, ids renumbered, ...
    "missing_end_token",       # truncated: no end token on one side
    "other",
)
STATUSES = ("exact", "mismatch", "error", "unverified")
REPLACEMENT = "\ufffd".encode()
WINDOW = 8

COLUMNS = [
    "id", "dataset", "mode", "method", "status", "cause", "causes", "region", "first_diff", "rel_pos", "len_truth",
    "len_recon", "truth_piece", "recon_piece", "truth_id", "recon_id", "truth_window", "recon_window",
    "truth_pieces", "recon_pieces", "context_truth", "context_recon", "last_id", "flags", "error",
]


@dataclass
class Divergence:
    """One stretch where the ids differ: truth[i1:i2] vs recon[j1:j2]."""

    i1: int
    i2: int
    j1: int
    j2: int
    cause: str
    #: where it lies: the first of :data:`recon.profiles.REGIONS` its differing bytes touch on either side
    region: str | None = None


def mode_of(record: Record, mode: str = "auto") -> str:
    if mode != "auto":
        return mode
    if record.output_ids is not None and record.response is not None:
        return "paired"
    return "roundtrip" if record.output_ids is not None else "reconstruct-only"


def _is_whitespace_only_change(a: bytes, b: bytes) -> bool:
    if a == b:
        return False
    return b"".join(a.split()) == b"".join(b.split())


def _offsets(tok, ids: Sequence[int]) -> list[int]:
    """Byte offset of every token boundary: ``ids[k]`` spans ``[offsets[k], offsets[k + 1])``."""
    return [0, *accumulate(map(tok.token_lengths.__getitem__, ids))]


def _spans(bound: BoundProfile, ids: Sequence[int], data: bytes | None = None) -> list[tuple[str, int, int]]:
    """Regions of one side's bytes (``data``, when already joined). A special token that ends the
    sample without being the grammar's end (``<|endoftext|>`` where ``<|im_end|>`` belongs) is
    the sample's end too."""
    spans = bound.regions(data) if data is not None else bound.regions_of_ids(ids)
    last = ids[-1] if ids else None
    if (last is not None and last in bound.tok.special_ids and last != bound.end_id
            and last not in bound.special_ids.values() and spans and spans[-1][0] != "end"):
        size = spans[-1][2]
        cut = size - bound.tok.token_lengths[last]
        spans = [(r, a, min(b, cut)) for r, a, b in spans if a < cut] + [("end", cut, size)]
    return spans


def _touched(spans: list[tuple[str, int, int]], lo: int, hi: int) -> set[str]:
    return {r for r, a, b in spans if a < hi and lo < b}


def _differing(a: bytes, b: bytes) -> tuple[int, int, int, int]:
    """The byte ranges of ``a`` and ``b`` (a1, a2, b1, b2) that differ, shared start and end set
    aside. Bytes gained or lost in a run (``"\\n\\n"`` vs ``"\\n"``) could be any of the run's,
    so the whole run counts. Same bytes: everything (a re-segmentation differs in its cuts)."""
    m = min(len(a), len(b))
    p = _common_prefix(a, b)
    s = _common_prefix(a[::-1], b[::-1])
    lo, tail = min(p, m - s), min(s, m - p)
    return lo, len(a) - tail, lo, len(b) - tail


def _first_region(touched: set[str]) -> str | None:
    return next((r for r in REGIONS if r in touched), None)


def _region_at(spans: list[tuple[str, int, int]], at: int) -> str | None:
    """The region byte ``at`` lies in (spans run in order from 0, a few of them)."""
    for region, _, end in spans:
        if at < end:
            return region
    return None


MERGE_SPAN = 8


def _cause(bound: BoundProfile, truth, recon, i1: int, i2: int, j1: int, j2: int, added: frozenset,
           regions: AbstractSet[str] = frozenset(), same_bytes: bool = False) -> str:
    """The cause of truth[i1:i2] vs recon[j1:j2]; ``regions``: the regions their differing bytes
    touch (see the table in docs/audit.md)."""
    tok, end = bound.tok, bound.end_id
    t_ids, r_ids = truth[i1:i2], recon[j1:j2]
    if same_bytes:  # a re-segmented stretch: only which side holds an added token matters
        t_special, r_special = not added.isdisjoint(t_ids), not added.isdisjoint(r_ids)
        if r_special and not t_special:
            return "special_text_collision"
        return "special_token_mismatch" if t_special else "non_canonical_bpe"
    t_bytes, r_bytes = tok.ids_bytes(t_ids), tok.ids_bytes(r_ids)
    t_special = [i for i in t_ids if i in added]
    r_special = [i for i in r_ids if i in added]
    at_end = i2 == len(truth) and j2 == len(recon)
    if at_end and end is not None and (t_ids == [end] and not r_ids or r_ids == [end] and not t_ids):
        return "missing_end_token"
    if r_special and not t_special and t_bytes == r_bytes:
        return "special_text_collision"
    if t_bytes == r_bytes:  # same bytes, cut differently, in any region (the region column says where)
        return "special_token_mismatch" if t_special or r_special else "non_canonical_bpe"
    if "tool_call" in regions:
        if regions & {"reasoning", "content"} and _is_whitespace_only_change(t_bytes, r_bytes):
            return "whitespace_trim"  # the content's edge, next to the calls: an API's trim
        if t_special != r_special and _plain(tok, t_ids, added) == _plain(tok, r_ids, added):
            return "special_token_mismatch"  # the calls' text agrees; only a special id differs
        return "tool_call_format"
    if t_special or r_special:
        return "special_token_mismatch"
    if REPLACEMENT in r_bytes and REPLACEMENT not in t_bytes:
        return "invalid_utf8"
    if _is_whitespace_only_change(t_bytes, r_bytes):
        return "whitespace_trim"
    return "other"


def _plain(tok, ids: Sequence[int], added: frozenset) -> bytes:
    """The bytes of ``ids`` without the added tokens'."""
    return tok.ids_bytes([i for i in ids if i not in added])


def _resegmented(tok, truth: Sequence[int], recon: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Stretches where two id lists over the same bytes are cut differently.

    A token boundary (byte offset) that only one side has lies inside such a stretch; the stretch
    runs between the nearest boundaries both sides share. Only those odd boundaries are visited."""
    size = tok.token_lengths.__getitem__
    t_ends = list(accumulate(map(size, truth)))
    r_ends = list(accumulate(map(size, recon)))
    t_set, r_set = set(t_ends), set(r_ends)
    shared = sorted(t_set & r_set)
    out: list[tuple[int, int, int, int]] = []
    last_hi = -1
    for b in sorted(t_set ^ r_set):
        if b <= last_hi:
            continue
        k = bisect_left(shared, b)
        lo = shared[k - 1] if k else 0
        hi = shared[k]  # the total length is shared, so there is always one after
        out.append((bisect_right(t_ends, lo), bisect_right(t_ends, hi), bisect_right(r_ends, lo), bisect_right(r_ends, hi)))
        last_hi = hi
    return out


def _shared_ends(a: Sequence[int], b: Sequence[int]) -> tuple[int, int]:
    """How many ids ``a`` and ``b`` share at the start, and then at the end (the two never overlap),
    found at C speed: ``map`` compares until the first difference."""
    short = min(len(a), len(b))
    head = next(compress(count(), map(ne, a, b)), short)
    tail = next(compress(count(), map(ne, reversed(a), reversed(b))), short)
    return head, min(tail, short - head)


def _resegmented_batch(tok, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[tuple[int, int, int, int]] | None]:
    """:func:`_resegmented` for many (truth, recon) pairs at once, or None for a pair whose bytes differ.

    Ids both sides share at the start and the end spell the same bytes and cut them alike, so
    only what lies between is analysed (a re-segmentation is a few tokens of a long sample), and
    the stretches found there are shifted back. Pairs hold ids of the vocabulary: no token spells
    nothing, so the shared ends can't hide an empty one."""
    ends = [_shared_ends(t, r) for t, r in pairs]
    middles = [(t[head : len(t) - tail], r[head : len(r) - tail]) for (t, r), (head, tail) in zip(pairs, ends)]
    found = _resegmented_middles(tok, middles)
    return [None if stretches is None else [(i1 + head, i2 + head, j1 + head, j2 + head) for i1, i2, j1, j2 in stretches]
            for stretches, (head, _) in zip(found, ends)]


def _resegmented_middles(tok, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[tuple[int, int, int, int]] | None]:
    """:func:`_resegmented_batch` on the pairs whole.

    The pairs are laid end to end, so every pair's byte offsets are one increasing array per side
    and the boundaries both sides share come from one ``numpy.intersect1d``. Between two shared
    boundaries each side holds one token (the same one, or the sides differ there) or several (a
    re-segmented stretch). The bytes themselves are compared position by position, vectorized too."""
    import numpy as np

    out: list[list[tuple[int, int, int, int]] | None] = [None] * len(pairs)
    lengths = tok.length_array
    t_count = np.fromiter(map(len, (t for t, _ in pairs)), np.int64, len(pairs))
    r_count = np.fromiter(map(len, (r for _, r in pairs)), np.int64, len(pairs))
    t_flat = np.fromiter(chain.from_iterable(t for t, _ in pairs), np.int64, int(t_count.sum()))
    r_flat = np.fromiter(chain.from_iterable(r for _, r in pairs), np.int64, int(r_count.sum()))
    t_len, r_len = lengths[t_flat], lengths[r_flat]
    t_start = np.concatenate(([0], np.cumsum(t_count)))
    r_start = np.concatenate(([0], np.cumsum(r_count)))
    t_cum = np.concatenate(([0], np.cumsum(t_len)))
    r_cum = np.concatenate(([0], np.cumsum(r_len)))
    t_empty = np.concatenate(([0], np.cumsum(t_len == 0)))
    r_empty = np.concatenate(([0], np.cumsum(r_len == 0)))
    # a pair can be a pure re-segmentation when both sides spell as many bytes and no token is empty
    fits = ((t_cum[t_start[1:]] - t_cum[t_start[:-1]]) == (r_cum[r_start[1:]] - r_cum[r_start[:-1]])) \
        & (t_count > 0) & (r_count > 0) \
        & (t_empty[t_start[1:]] == t_empty[t_start[:-1]]) & (r_empty[r_start[1:]] == r_empty[r_start[:-1]])
    t_kept = fits[np.repeat(np.arange(len(pairs)), t_count)]  # per token: is its pair kept?
    r_kept = fits[np.repeat(np.arange(len(pairs)), r_count)]
    t_ids, r_ids = t_flat[t_kept], r_flat[r_kept]
    # laid end to end, kept pairs start and end at the same byte offsets on both sides
    t_bytes, r_bytes = _flat_bytes(tok, t_ids), _flat_bytes(tok, r_ids)
    keep = np.flatnonzero(fits)
    pair_bytes = np.cumsum((t_cum[t_start[1:]] - t_cum[t_start[:-1]])[keep])
    changed = np.unique(np.searchsorted(pair_bytes, np.flatnonzero(t_bytes != r_bytes), side="right"))
    fits[keep[changed]] = False  # same length, other bytes: not a re-segmentation
    t_pair, r_pair = np.repeat(keep, t_count[keep]), np.repeat(keep, r_count[keep])
    t_end, r_end = np.cumsum(t_len[t_kept]), np.cumsum(r_len[r_kept])
    _, ti, ri = np.intersect1d(t_end, r_end, assume_unique=True, return_indices=True)
    t_prev = np.concatenate(([-1], ti[:-1]))
    r_prev = np.concatenate(([-1], ri[:-1]))
    one_each = ((ti - t_prev) == 1) & ((ri - r_prev) == 1)
    odd = np.flatnonzero(~one_each | (t_ids[ti] != r_ids[ri]))  # stretches (two ids, same bytes: one too)
    pair_of = t_pair[ti[odd]]
    first_t = np.searchsorted(t_pair, pair_of)  # where each pair's tokens begin in the kept arrays
    first_r = np.searchsorted(r_pair, pair_of)
    i1, i2 = (t_prev[odd] + 1 - first_t).tolist(), (ti[odd] + 1 - first_t).tolist()
    j1, j2 = (r_prev[odd] + 1 - first_r).tolist(), (ri[odd] + 1 - first_r).tolist()
    for k in np.flatnonzero(fits).tolist():
        out[k] = []
    for p, a, b, c, d in zip(pair_of.tolist(), i1, i2, j1, j2):
        if out[p] is not None:
            out[p].append((a, b, c, d))
    return out


def _flat_bytes(tok, ids):
    """The bytes of ``ids`` end to end, as a numpy uint8 array."""
    import numpy as np

    table, offsets = tok.byte_table
    lens = tok.length_array[ids]
    ends = np.cumsum(lens)
    index = np.repeat(offsets[ids] - (ends - lens), lens) + np.arange(int(ends[-1]) if len(ends) else 0)
    return table[index]


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings (binary search over slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared_cut(tok, truth: Sequence[int], recon: Sequence[int], limit: int) -> tuple[int, int]:
    """Token counts (truth, recon) at the last byte offset <= ``limit`` where both have a boundary."""
    size = tok.token_lengths.__getitem__
    t_ends = list(accumulate(map(size, truth)))
    r_ends = list(accumulate(map(size, recon)))
    shared = set(t_ends[: bisect_right(t_ends, limit)]).intersection(r_ends[: bisect_right(r_ends, limit)])
    if not shared:
        return 0, 0
    at = max(shared)
    return bisect_right(t_ends, at), bisect_right(r_ends, at)


def classify(bound: BoundProfile, truth: Sequence[int], recon: Sequence[int],
             resegmented: list[tuple[int, int, int, int]] | None = None) -> list[Divergence]:
    """Every stretch where ``recon`` differs from ``truth``, with its region and cause, in order.

    ``resegmented``: the stretches, when the caller already knows both sides spell the same bytes
    (from :func:`_resegmented_batch`)."""
    tok = bound.tok
    added = tok.added_ids
    if resegmented is not None:  # same bytes on both sides: the truth's regions are the reconstruction's,
        t_spans = _spans(bound, truth)  # and a stretch's first region is the one its first byte lies in
        out, at, done = [], 0, 0
        size = tok.token_lengths.__getitem__
        for i1, i2, j1, j2 in resegmented:
            at += sum(map(size, truth[done:i1]))
            done = i1
            out.append(Divergence(i1, i2, j1, j2, _cause(bound, truth, recon, i1, i2, j1, j2, added, same_bytes=True),
                                  _region_at(t_spans, at)))
        return out
    t_bytes = tok.ids_bytes(truth)
    t_spans, t_off = _spans(bound, truth, t_bytes), _offsets(tok, truth)
    r_bytes = tok.ids_bytes(recon)
    r_spans, r_off = _spans(bound, recon, r_bytes), _offsets(tok, recon)

    def divergence(i1: int, i2: int, j1: int, j2: int, same_bytes: bool = False) -> Divergence:
        ta, tb, ra, rb = _differing(t_bytes[t_off[i1] : t_off[i2]], r_bytes[r_off[j1] : r_off[j2]])
        touched = (_touched(t_spans, t_off[i1] + ta, t_off[i1] + tb)
                   | _touched(r_spans, r_off[j1] + ra, r_off[j1] + rb))
        return Divergence(i1, i2, j1, j2, _cause(bound, truth, recon, i1, i2, j1, j2, added, touched, same_bytes),
                          _first_region(touched))

    if t_bytes == r_bytes:
        return [divergence(*s, same_bytes=True) for s in _resegmented(tok, truth, recon)]
    # the bytes differ from some offset on: re-segmented stretches before the last token boundary
    # both sides share there are found by the byte walk, the rest by alignment
    cut_t, cut_r = _shared_cut(tok, truth, recon, _common_prefix(t_bytes, r_bytes))
    out = [divergence(*s, same_bytes=True) for s in _resegmented(tok, truth[:cut_t], recon[:cut_r])]
    ops = [(tag, i1 + cut_t, i2 + cut_t, j1 + cut_r, j2 + cut_r)
           for tag, i1, i2, j1, j2 in SequenceMatcher(None, truth[cut_t:], recon[cut_r:], autojunk=False).get_opcodes()]
    a = 0
    while a < len(ops):
        tag, i1, i2, j1, j2 = ops[a]
        if tag == "equal":
            a += 1
            continue
        # the matcher may pair up a shared token inside a re-segmented stretch ('u','u','h' vs 'u','uh'):
        # grow the stretch over the next few opcodes while that makes both sides the same bytes
        for b in range(a, min(a + MERGE_SPAN, len(ops))):
            _, _, bi2, _, bj2 = ops[b]
            if ops[b][0] != "equal" and tok.ids_bytes(truth[i1:bi2]) == tok.ids_bytes(recon[j1:bj2]):
                if added.isdisjoint(truth[i1:bi2]) and added.isdisjoint(recon[j1:bj2]):
                    i2, j2, a = bi2, bj2, b
                break
        out.append(divergence(i1, i2, j1, j2))
        a += 1
    return out


def _pieces(tok, ids: Sequence[int]) -> list[str]:
    return list(map(tok.pieces.__getitem__, ids))


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
        truth_piece=tok.pieces[t_at] if t_at is not None else "(end)",
        recon_piece=tok.pieces[r_at] if r_at is not None else "(end)",
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


def arrow_schema():
    """The audit rows' Arrow schema (so chunks written one after another agree on types)."""
    import pyarrow as pa

    kinds = {"int64": pa.int64(), "float64": pa.float64(), "list<string>": pa.list_(pa.string()),
             "list<int64>": pa.list_(pa.int64())}
    return pa.schema([(c, kinds[SCHEMA_TYPES[c]] if c in SCHEMA_TYPES else pa.string()) for c in COLUMNS])


def audit_records(
    records: Sequence[Record],
    bound: BoundProfile,
    method: str = "auto",
    *,
    mode: str = "auto",
    options: ParseOptions | None = None,
    keep_ids: bool = False,
) -> pd.DataFrame:
    """One row per record (see ``COLUMNS``); a record that fails is an ``error`` row, the rest go on.
    ``keep_ids`` adds a ``recon_ids`` column with each full reconstruction."""
    import pandas as pd

    rows = audit_rows(records, bound, method, mode=mode, options=options, keep_ids=keep_ids)
    return pd.DataFrame(rows, columns=COLUMNS + (["recon_ids"] if keep_ids else []))


def audit_rows(
    records: Sequence[Record],
    bound: BoundProfile,
    method: str = "auto",
    *,
    mode: str = "auto",
    options: ParseOptions | None = None,
    keep_ids: bool = False,
) -> list[dict]:
    """:func:`audit_records` as plain dicts (what the streaming engine writes and Dask ships)."""
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
    # rendered view is that text again, its ids may be confirmed on the ids (recon.canonical)
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
    """The same records audited with each method, stacked (compare with :func:`recon.stats.method_comparison`)."""
    import pandas as pd

    frames = [audit_records(records, bound, m, mode=mode, options=options).assign(method_asked=m) for m in methods]
    return pd.concat(frames, ignore_index=True)


__all__ = ["CAUSES", "COLUMNS", "METHODS", "REGIONS", "STATUSES", "audit_records", "audit_rows", "audit_methods", "classify", "compare",
           "describe", "drilldown", "mode_of"]
