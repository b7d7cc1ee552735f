"""Runs of Han characters confirmed on their ids by adjacent pairs, not by encoding their text.

Why: in CJK text a pre-token is a whole clause of Han characters that never repeats, so the
token-space check (:mod:`recon.tokenizers.fast.canonical`) found no stretch it had seen and
encoded nearly every text again, and the audit cost more than the tokenizer's own round trip.
Here each maximal run of tokens made only of whole Han characters (``H``: U+4E00..U+9FA5, the
CJK Unified Ideographs of Unicode 1.1, letters ``Lo`` of script Han in every Unicode version and
every engine) is checked by its adjacent token pairs, each pair tested once per process and
remembered, and the rest of the text by the usual check on its *skeleton*: the ids with every
such run replaced by one placeholder token of one Han character. Skeletons repeat (``，h。``),
so they are looked up, not encoded.

Exact, for pre-tokenizers that use Han characters only inside a ``+``-repeated class of letters, so it never cuts inside a run of them, and a run of
any length of any of them is cut around exactly as one character is; the tokenizers say which:
cl100k's, Qwen3.5/3.6's and Kimi's tiktoken patterns, GPT-2's regex after ``Digits`` (SmolLM2),
DeepSeek-V4's three Isolated splits; any other keeps the usual check):

1. *The skeleton*. The text of the skeleton is the text with each run of ``H`` characters the
   ids' runs spell replaced by one ``H`` character; its pre-token boundaries are the text's,
   with each run mapped to that character. If the skeleton's ids are its text's encoding, no
   token crosses a pre-token boundary of the text, and every pre-token of the text without a
   run in it is encoded as in the skeleton.
2. *The pairs* (Berglund et al., Vieira et al., ICML 2025: for BPE, ids are the encoding of
   their bytes iff every adjacent pair is). BPE merges, at each step, the adjacent pair of lowest
   priority (leftmost on ties), the priority a function of the two parts alone (tiktoken: the
   rank of their bytes joined; ``tokenizers``: the merge's rank). If for every adjacent pair
   (a, b) of a sequence the BPE of a's bytes then b's is exactly [a, b], the BPE of the whole
   sequence's bytes is the sequence: until a merge crosses a token edge, the merges inside
   each token are its own run's, and their order between two neighbours is the one their pair
   run takes; the first crossing merge would be taken in that pair's run at the same state.
   The converse holds too, so the pairs of a pre-token of the skeleton with no placeholder in
   it are all such pairs. So a pre-token with a run in it is its own encoding when the pairs
   inside the runs and at their edges are (the others are the skeleton's).
3. *Whole pre-tokens that are a token*. tiktoken (and ``tokenizers`` with ``ignore_merges``)
   gives a pre-token that is a token that token, whatever the merges make of it. Where that is
   not what BPE makes of the token's bytes (an *unreachable* token: 33 with a Han character in
   Qwen's vocabulary, none in cl100k's), the ids BPE makes of them start with a pair that is
   treated as failing here, so ids holding it take the usual way.

Each pair is tested by the BPE alone on its two tokens' bytes (the tokenizer's own:
``_encode_single_piece`` for tiktoken, the model without pre-tokenizer for ``tokenizers``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from recon.kernel import KeySet

#: The first and last code point of H.
FIRST_H, LAST_H = 0x4E00, 0x9FA5


def pure_han(token_bytes: Sequence[bytes], skip: frozenset[int] = frozenset()) -> np.ndarray:
    """Per id: whether the token's bytes are one or more whole characters of H, UTF-8 (ids in
    ``skip``, added tokens, never)."""
    lengths = np.fromiter(map(len, token_bytes), np.int64, len(token_bytes))
    data = np.frombuffer(b"".join(token_bytes) + b"\0\0\0", np.uint8).astype(np.int64)
    b0, b1, b2 = data[:-3], data[1:-2], data[2:-1]
    code = ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F)
    start = ((b0 & 0xF0) == 0xE0) & ((b1 & 0xC0) == 0x80) & ((b2 & 0xC0) == 0x80) & (code >= FIRST_H) & (code <= LAST_H)
    # per token: every third byte from its first starts a character of H, and its length is a multiple of 3
    counts = np.zeros(len(start) + 3, np.int64)  # counts[p + 3]: starts at p, p - 3, p - 6... (one phase)
    for phase in range(3):
        counts[3 + phase :: 3][: len(start[phase::3])] = np.cumsum(start[phase::3])
    begins = np.cumsum(lengths) - lengths
    ends = begins + lengths  # one past the last byte; the last character starts at ends - 3
    ok = (lengths > 0) & (lengths % 3 == 0)
    last = np.where(ok, ends - 3, 0)
    inside = counts[last + 3] - counts[np.where(ok, begins, 0)]  # starts at begins, begins + 3, ..., last
    table = ok & (inside == lengths // 3)
    if skip:
        table[[i for i in skip if 0 <= i < len(table)]] = False
    return table


class PairCheck:
    """Whether adjacent pairs of tokens are their own BPE, remembered per process.

    ``pure(data)``: the BPE alone of each byte string in ``data`` (lists of ids); ``placeholder``:
    a token of one H character; ``unreachable``: the first pairs of the BPE of the tokens with an
    H character that BPE doesn't make of their own bytes (a callable, run on first use), which
    fail here (see the module, 3)."""

    def __init__(self, token_bytes: Sequence[bytes], added: frozenset[int], placeholder: int, bits: int,
                 pure: Callable[[list[bytes]], list[list[int]]],
                 unreachable: Callable[[], list[tuple[int, int]] | None] | None = None, max_pairs: int = 1 << 20):
        self._token_bytes = token_bytes
        self._added = added
        self.placeholder = placeholder
        self._bits = bits
        self._pure = pure
        self._unreachable = unreachable
        self._han: np.ndarray | None = None
        self._unreachable_pairs: np.ndarray | None = None
        self._good, self._bad = KeySet(), KeySet()
        self.tested = 0  #: pairs tested so far
        #: pairs remembered at most (8 bytes a slot, at most 4/5 full: ~10 MB each way); past
        #: that only the good ones the last batch used
        self.max_pairs = max_pairs
        #: None where the unreachable tokens can't be told apart: then no pair passes
        self.usable = True

    @property
    def han(self) -> np.ndarray:
        """Per id: whether the token is whole H characters (built on first use)."""
        if self._han is None:
            self._han = pure_han(self._token_bytes, self._added)
        return self._han

    def _keys(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a + 1).astype(np.uint64) | ((b + 1).astype(np.uint64) << np.uint64(self._bits))

    def ok(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per pair (a[k], b[k]): whether the BPE of a's bytes then b's is exactly [a, b] (and the
        pair starts no unreachable token's BPE)."""
        if self._unreachable is not None:  # first use: those pairs fail from now on
            bad = self._unreachable()
            self._unreachable = None
            if bad is None:
                self.usable = False
            elif bad:
                pairs = np.array(bad, dtype=np.int64).reshape(-1, 2)
                self._unreachable_pairs = self._keys(pairs[:, 0], pairs[:, 1])
                self._bad.add(self._unreachable_pairs)
        if not self.usable:
            return np.zeros(len(a), dtype=bool)
        keys = self._keys(a, b)
        good = np.frombuffer(self._good.find(keys), dtype=bool).copy()
        unknown = ~good & ~np.frombuffer(self._bad.find(keys), dtype=bool)
        if unknown.any():
            new, first = np.unique(keys[unknown], return_index=True)
            at = np.flatnonzero(unknown)[first]
            table = self._token_bytes
            pairs = list(zip(a[at].tolist(), b[at].tolist()))
            encoded = self._pure([table[x] + table[y] for x, y in pairs])
            passed = np.fromiter((ids == [x, y] for ids, (x, y) in zip(encoded, pairs)), bool, len(pairs))
            self.tested += len(pairs)
            self._good.add(new[passed])
            self._bad.add(new[~passed])
            good[unknown] = np.frombuffer(self._good.find(keys[unknown]), dtype=bool)
            if len(self._good) > self.max_pairs or len(self._bad) > self.max_pairs:
                kept = KeySet()
                kept.add(keys[good])
                self._good = kept if len(kept) <= self.max_pairs // 2 else KeySet()
                self._bad = KeySet()
                if self._unreachable_pairs is not None:
                    self._bad.add(self._unreachable_pairs)
        return good


def unreachable_pairs(token_bytes: Sequence[bytes], added: frozenset[int],
                      pure: Callable[[list[bytes]], list[list[int]]]) -> list[tuple[int, int]]:
    """The first two ids of the BPE of each token holding an H character whose BPE is not the
    token itself (ids outside the vocabulary's table aside)."""
    lengths = np.fromiter(map(len, token_bytes), np.int64, len(token_bytes))
    data = np.frombuffer(b"".join(token_bytes), np.uint8)
    lead = ((data >= 0xE4) & (data <= 0xE9)).astype(np.int64)  # (every H character's first byte is one of these)
    begins = np.cumsum(lengths) - lengths
    has = np.zeros(len(token_bytes), bool)
    nonempty = lengths > 0
    has[nonempty] = np.add.reduceat(lead, begins[nonempty]) > 0 if len(data) else False
    # (reduceat over non-empty tokens only: each sums its own bytes, the next token's start ends it)
    candidates = [i for i in np.flatnonzero(has).tolist() if i not in added]
    out = []
    for i, ids in zip(candidates, pure([token_bytes[i] for i in candidates])):
        if ids != [i] and len(ids) >= 2:
            out.append((ids[0], ids[1]))
    return out
