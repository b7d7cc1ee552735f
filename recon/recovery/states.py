"""The text as states a prefix of ids can be in, and which ordinary tokens step between them.

**States.** A prefix of ids has consumed the text up to a character boundary ``c`` (byte offset
in the canonical bytes) with ``pend`` bytes held by the UTF-8 decoder (a token may end inside a
character). Two prefixes in the same state spell the same text so far and differ only in how they
cut it. Where the text holds U+FFFD the bytes are lost: there the candidates at a state are every
token the decoder accepts (a sample cut inside an emoji ends in the lead bytes the model chose).

A :class:`Text` is built once per record; the search (:mod:`recon.recovery.search`) walks it.
"""

from __future__ import annotations

import codecs
from typing import Sequence

from recon.errors import ReconError
from recon.tokenizers.tokenizer import Tokenizer

FFFD = "\ufffd".encode()


class Segmenter:
    """Which ordinary tokens spell a given stretch of bytes (special tokens never stand in for text)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        fixed = {t.id for t in tok.added_tokens}
        self.token_bytes = tok.token_bytes
        self.ordinary = {data: i for data, i in tok.bytes_to_id.items() if i not in fixed}
        self.fixed = frozenset(fixed)
        self.max_len = max(map(len, self.ordinary))
        #: tokens holding a byte >= 0x80: what may spell bytes the text lost (U+FFFD)
        self.wild = [i for data, i in self.ordinary.items() if any(b >= 0x80 for b in data)]
        #: of those, the ones that are not whole UTF-8: all that can follow no held bytes into a U+FFFD
        self.broken = [i for i in self.wild if not _valid(self.token_bytes[i])]
        self.wild_radius = max((len(self.token_bytes[i]) for i in self.broken), default=4)

    def prefixes(self, data: bytes, lo: int, hi: int) -> list[int]:
        """Ordinary tokens whose bytes are a prefix of ``data[lo:hi]``."""
        found = []
        for length in range(1, min(self.max_len, hi - lo) + 1):
            tid = self.ordinary.get(data[lo : lo + length])
            if tid is not None:
                found.append(tid)
        return found

    def fewest(self, data: bytes) -> list[int]:
        """The segmentation of ``data`` into the fewest ordinary tokens (longest first on ties)."""
        n = len(data)
        best: list[tuple[int, int] | None] = [None] * (n + 1)  # (tokens, length of last) to reach i
        best[0] = (0, 0)
        for i in range(n):
            if best[i] is None:
                continue
            for length in range(min(self.max_len, n - i), 0, -1):
                if data[i : i + length] in self.ordinary:
                    cand = (best[i][0] + 1, length)
                    if best[i + length] is None or cand[0] < best[i + length][0]:
                        best[i + length] = cand
        if best[n] is None:
            raise ReconError(f"no segmentation of {data!r} into ordinary tokens")
        out, i = [], n
        while i:
            length = best[i][1]
            out.append(self.ordinary[data[i - length : i]])
            i -= length
        return out[::-1]


def _valid(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _decode(pend: bytes, data: bytes, final: bool = False) -> tuple[str, bytes]:
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    dec.setstate((pend, 0))
    out = dec.decode(data, final)
    return out, dec.getstate()[0]


class Text:
    """The target: the canonical ids' bytes, cut into text segments and fixed (special) tokens."""

    def __init__(self, seg: Segmenter, canonical: Sequence[int]):
        tb = seg.token_bytes
        self.seg, self.data = seg, b"".join(tb[i] for i in canonical)
        n = len(self.data)
        self.fixed_at: dict[int, int] = {}  # byte offset -> the fixed token starting there
        pos = 0
        for i in canonical:
            if i in seg.fixed:
                self.fixed_at[pos] = i
            pos += len(tb[i])
        ends = sorted(self.fixed_at) + [n]
        self.seg_end, j = [n] * (n + 1), 0  # byte offset -> end of its text segment (the next fixed token)
        for p in range(n + 1):
            while ends[j] < p:
                j += 1
            self.seg_end[p] = ends[j]
        self.starts = [0] * (n + 1)  # byte offset -> start of the character holding it
        for p in range(1, n + 1):
            self.starts[p] = self.starts[p - 1] if p < n and (self.data[p] & 0xC0) == 0x80 else p
        self.lost = [p for p in range(n - 2) if self.data[p : p + 3] == FFFD]
        #: from here on no U+FFFD is within a token's reach: how many ids spell the rest is certain
        self.certain_from = min(n, max(self.lost) + 3 + seg.wild_radius + 4) if self.lost else 0
        self.anchors = self._anchors(canonical)
        self._moves: dict[tuple[int, bytes], dict[int, tuple[int, bytes]]] = {}

    def _anchors(self, canonical) -> list[int]:
        """Byte offsets every candidate has a token boundary at: no ordinary token covers them."""
        data, n, seg = self.data, len(self.data), self.seg
        covered = bytearray(n + 1)
        for s in range(n):
            if s in self.fixed_at:
                continue
            hi = min(self.seg_end[s], s + seg.max_len)
            for length in range(2, hi - s + 1):
                if data[s : s + length] in seg.ordinary:
                    covered[s + 1 : s + length] = b"\x01" * (length - 1)
        for w in self.lost:
            r = seg.wild_radius
            covered[max(w - r, 0) : min(w + 3 + r, n)] = b"\x01" * (min(w + 3 + r, n) - max(w - r, 0))
        return [p for p in range(n + 1) if not covered[p] and self.starts[p] == p]

    def fewest_to_end(self) -> list[int]:
        """Per byte offset, the fewest tokens that spell the rest of the text; 0 before
        :attr:`certain_from` (where U+FFFD stands for lost bytes any bytes may stand, and no count is certain)."""
        data, n, seg = self.data, len(self.data), self.seg
        fewest = [n + 1] * (n + 1)
        fewest[n] = 0
        for p in range(n - 1, -1, -1):
            fixed = self.fixed_at.get(p)
            if fixed is not None:
                fewest[p] = 1 + fewest[p + len(seg.token_bytes[fixed])]
                continue
            for length in range(1, min(seg.max_len, self.seg_end[p] - p) + 1):
                if data[p : p + length] in seg.ordinary:
                    fewest[p] = min(fewest[p], 1 + fewest[p + length])
        fewest[: self.certain_from] = [0] * self.certain_from
        return fewest

    def canonical_rest(self, draft_at: dict[int, int]) -> list[int]:
        """Per byte offset, how many ids spell the rest of the text as the canonical ids do: theirs
        from each of their boundaries, plus the fewest ordinary tokens from inside one of them to its end."""
        n, seg = len(self.data), self.seg
        k_end = draft_at[n]
        rest, nxt = [0] * (n + 1), n
        for p in range(n, -1, -1):
            if p in draft_at:
                rest[p], nxt = k_end - draft_at[p], p
                continue
            try:
                rest[p] = len(seg.fewest(self.data[p:nxt])) + rest[nxt]
            except ReconError:  # inside a special token: no state is there
                rest[p] = rest[nxt] + 1
        return rest

    def state(self, p: int) -> tuple[int, bytes]:
        """The state at byte offset ``p`` of the canonical bytes."""
        c = self.starts[p] if p < len(self.data) else p
        return c, self.data[c:p]

    def step(self, state: tuple[int, bytes], tid: int) -> tuple[int, bytes] | None:
        """The state after token ``tid``, or None if the text does not allow it there."""
        c, pend = state
        seg, data = self.seg, self.data
        fixed = self.fixed_at.get(c)
        if fixed is not None and not pend:
            return (c + len(seg.token_bytes[tid]), b"") if tid == fixed else None
        if tid in seg.fixed:  # after held bytes flushed as U+FFFD at the end of the segment
            fin = self.finished(state)
            ok = fin is not None and self.fixed_at.get(fin[0]) == tid
            return (fin[0] + len(seg.token_bytes[tid]), b"") if ok else None
        tb = seg.token_bytes[tid]
        end = self.seg_end[c]
        if data.startswith(pend, c):  # a literal prefix of the text
            p = c + len(pend)
            if p + len(tb) <= end and data.startswith(tb, p):
                return self.state(p + len(tb))
            if not self.lost:
                return None
        out, rest = _decode(pend, tb)
        emitted = out.encode()
        if c + len(emitted) > end or not data.startswith(emitted, c):
            return None
        c2 = c + len(emitted)
        if rest and not (data.startswith(rest, c2) or data.startswith(FFFD, c2)):
            return None
        return c2, rest

    def finished(self, state: tuple[int, bytes]) -> tuple[int, bytes] | None:
        """Where held bytes end the segment (flushed as U+FFFD, as the decoder does at the end)."""
        c, pend = state
        if not pend or data_flush(pend) != self.data[c : self.seg_end[c]]:
            return None
        return self.seg_end[c], b""

    def spells(self, ids) -> bool:
        """Whether ``ids``, decoded as a server decodes them, are the text: a check on any
        sequence built from pieces rather than walked state by state."""
        state: tuple[int, bytes] | None = (0, b"")
        for t in ids:
            state = self.step(state, t)
            if state is None:
                return False
        end = (len(self.data), b"")
        return state == end or self.finished(state) == end

    def candidates(self, state: tuple[int, bytes]) -> list[int]:
        """Every token the text allows after ``state``."""
        return list(self.moves(state))

    def moves(self, state: tuple[int, bytes]) -> dict[int, tuple[int, bytes]]:
        """Every token the text allows after ``state``, with the state after it. Kept per state:
        near U+FFFD it is every token the decoder accepts there, thousands of steps to find."""
        got = self._moves.get(state)
        if got is None:
            got = {}
            for t in self._find_candidates(state):
                nxt = self.step(state, t)
                if nxt is not None:
                    got[t] = nxt
            self._moves[state] = got
        return got

    def _find_candidates(self, state: tuple[int, bytes]) -> list[int]:
        c, pend = state
        seg, data = self.seg, self.data
        fixed = self.fixed_at.get(c)
        if fixed is not None and not pend:
            return [fixed]
        found: list[int] = []
        if data.startswith(pend, c):
            found = seg.prefixes(data, c + len(pend), self.seg_end[c])
        elif data.startswith(FFFD, c):
            found = seg.prefixes(data, c + 3, self.seg_end[c])
        if any(c - seg.wild_radius - len(pend) <= w <= c + len(pend) + seg.wild_radius for w in self.lost):
            have = set(found)
            # with no bytes held, a whole-UTF-8 token spells only its literal self (among ``found``)
            found += [t for t in (seg.wild if pend else seg.broken) if t not in have]
        fin = self.finished(state)
        if fin is not None and fin[0] in self.fixed_at:
            found.append(self.fixed_at[fin[0]])
        return found

    def next_anchor(self, c: int) -> int:
        import bisect

        return self.anchors[min(bisect.bisect_right(self.anchors, c), len(self.anchors) - 1)]


def common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def data_flush(pend: bytes) -> bytes:
    return _decode(pend, b"", final=True)[0].encode()
