"""Where two id sequences diverge, and why: each stretch where the ids differ gets a region
and a cause.

The region (reasoning, content, tool call, end: :meth:`recon.audit.profiles.BoundProfile.regions`
on each side's bytes) is decided first, because the same difference means different things in
different places: a space missing inside a tool call is the call's re-serialization, at the edge
of the content an API's trim. Where both sides spell the same bytes, stretches are found by a
linear walk over token boundaries; only past the first differing byte does ``difflib`` align the
ids. :mod:`recon.audit.compare` turns the divergences into audit rows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import accumulate, chain, compress, count
from operator import ne
from typing import TYPE_CHECKING, AbstractSet, Sequence

from recon.audit.profiles import REGIONS, BoundProfile

if TYPE_CHECKING:
    pass

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
REPLACEMENT = "\ufffd".encode()
WINDOW = 8

@dataclass
class Divergence:
    """One stretch where the ids differ: truth[i1:i2] vs recon[j1:j2]."""

    i1: int
    i2: int
    j1: int
    j2: int
    cause: str
    #: where it lies: the first of :data:`recon.audit.profiles.REGIONS` its differing bytes touch on either side
    region: str | None = None


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
    changed = np.searchsorted(pair_bytes, np.flatnonzero(t_bytes != r_bytes), side="right")  # (repeats are harmless)
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
