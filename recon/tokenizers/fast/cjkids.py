"""Per-id tables of CJK runs, for vocabularies that hold tens of thousands of CJK tokens.

Why: :meth:`recon.tokenizers.fast.cjkruns.PairCheck.groups_of` finds each token's group by
laying a batch's bytes end to end and reading every character (so that byte pieces of a rare
character join the run around them), a dozen NumPy passes over every byte of a chunk: on CJK
text the largest part of the pair check's time. In Qwen's, Kimi's or cl100k's vocabulary nearly
every CJK character of real text is inside a token of whole characters, so a run is read off
per-id tables here, one look-up per token. A byte piece then is no run token: it stays in the
skeleton as it is, which is exact too (a run of whole-character tokens starts and ends at
character edges, so every character of the text is in a run or in the skeleton whole;
:mod:`recon.tokenizers.fast.cjkruns`, 1 and 2). Where the vocabulary holds few CJK tokens
(SmolLM2's 90), CJK text is mostly byte pieces and the byte-level reading stays.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

class Layout:
    """A vocabulary's bytes laid end to end (``raw``, and as uint8 ``data``), each token's
    ``begins`` there and its ``lengths``; ``codes()``: per byte, the code point of the three-byte
    UTF-8 character that starts there and whether one does. Built once per vocabulary and
    shared by the tables of the pair check (each built its own: ~40 ms a process for Qwen's)."""

    def __init__(self, token_bytes: Sequence[bytes]):
        self.lengths = np.fromiter(map(len, token_bytes), np.int64, len(token_bytes))
        self.raw = b"".join(token_bytes)
        self.data = np.frombuffer(self.raw, np.uint8)
        self.begins = np.cumsum(self.lengths) - self.lengths
        self._codes: tuple[np.ndarray, np.ndarray] | None = None

    def codes(self) -> tuple[np.ndarray, np.ndarray]:
        if self._codes is None:
            self._codes = char_codes(self.data)
        return self._codes


_LAYOUTS: dict[int, tuple[Sequence[bytes], int, Layout]] = {}


def layout(token_bytes: Sequence[bytes]) -> Layout:
    """The :class:`Layout` of ``token_bytes`` (remembered for the same list, while its length is
    the same: a tokenizer's table is built once and never changes)."""
    held = _LAYOUTS.get(id(token_bytes))
    if held is None or held[0] is not token_bytes or held[1] != len(token_bytes):
        held = _LAYOUTS[id(token_bytes)] = (token_bytes, len(token_bytes), Layout(token_bytes))
    return held[2]


def char_codes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per byte of ``data`` (uint8): the code point of the three-byte UTF-8 character that
    starts there (0 where none does), and whether one does."""
    padded = np.concatenate((data, np.zeros(3, np.uint8)))
    b0, b1, b2 = padded[:-3], padded[1:-2], padded[2:-1]
    three = ((b0 & 0xF0) == 0xE0) & ((b1 & 0xC0) == 0x80) & ((b2 & 0xC0) == 0x80)
    at = np.flatnonzero(three)
    code = np.zeros(len(data), np.int32)
    code[at] = ((b0[at].astype(np.int32) & 0x0F) << 12) | ((b1[at].astype(np.int32) & 0x3F) << 6) | (b2[at] & 0x3F)
    return code, three


def id_tables(token_bytes: Sequence[bytes], groups_table: np.ndarray, code_groups: np.ndarray,
              spaced: np.ndarray, added: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per id: its run group (``groups_table``'s: whole characters of one group; or, for a group
    a space may open (``spaced``, per group index), a space then whole characters of it), whether
    it is such a space-opened token, and the code point of its first and last character where
    that is ASCII or three bytes long (else -1). ``code_groups``: the group of each code point of
    the BMP; ``added``: per id, an added token (group 0)."""
    n = len(token_bytes)
    vocab = layout(token_bytes)
    lengths, data, begins = vocab.lengths, vocab.data, vocab.begins
    code, three = vocab.codes()
    ends = begins + lengths
    some = lengths > 0
    first_code = np.full(n, -1, np.int64)
    last_code = np.full(n, -1, np.int64)
    if len(data):
        at = begins[some]
        first_code[some] = np.where(data[at] < 0x80, data[at], np.where(three[at], code[at], -1))
        last = ends[some] - 1
        lead = np.maximum(ends[some] - 3, 0)
        last_code[some] = np.where(data[last] < 0x80, data[last],
                                   np.where((lengths[some] >= 3) & three[lead], code[lead], -1))
    group = groups_table.astype(np.int8).copy()
    # a space then whole characters of one group a space opens: the rest's group, read per
    # character (every third byte from the second is a lead of that group, lengths 1 + 3k)
    opened = np.zeros(n, dtype=bool)
    if spaced.any() and len(data):
        can = np.flatnonzero(some & (lengths >= 4) & ((lengths - 1) % 3 == 0))
        can = can[data[begins[can]] == 0x20]
        char_group = np.where(three, code_groups[code & 0xFFFF], 0)
        g = char_group[begins[can] + 1]
        can, g = can[(g > 0) & spaced[g]], g[(g > 0) & spaced[g]]
        # every character of the rest in group g: its leads at begins + 1 + 3j
        width = int(lengths[can].max() - 1) // 3 if len(can) else 0
        whole = np.ones(len(can), dtype=bool)
        for j in range(width):
            inside = 1 + 3 * j < lengths[can]
            where = np.minimum(begins[can] + 1 + 3 * j, len(data) - 1)
            whole &= ~inside | (char_group[where] == g)
        group[can[whole]] = g[whole]
        opened[can[whole]] = True
    group[added] = 0
    opened[added] = False
    return group, opened, first_code, last_code
