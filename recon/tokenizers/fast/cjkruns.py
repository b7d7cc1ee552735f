"""Runs of CJK tokens (Han, kana, Hangul) confirmed on their ids by adjacent pairs, not by
encoding their text.

Why: in CJK text a pre-token is a whole clause that never repeats, so the token-space check
(:mod:`recon.tokenizers.fast.canonical`) found no stretch it had seen and encoded nearly every
text again, and the audit cost more than the tokenizer's own round trip. Here each maximal run
of tokens made only of whole characters of one *group* (a set of letters the tokenizer's
pre-tokenizer treats alike, below) is checked by its adjacent token pairs, each pair tested once
per process and remembered, many in one native call, and the rest of the text by the usual
check on its *skeleton*: the ids with every such run replaced by one placeholder token of one
character of its group. Skeletons repeat (``，h。``), so they are looked up, not encoded.

The groups are code points that are letters (``\\p{L}``) in every Unicode version and engine:
``H`` (U+4E00..U+9FA5, the CJK Unified Ideographs of Unicode 1.1, script Han), kana
(U+3041..U+3096, U+30A1..U+30FA, U+30FC: hiragana, katakana and the prolonged sound mark) and
Hangul syllables (U+AC00..U+D7A3). Each tokenizer says which of them go together:

- cl100k's, Qwen3.5/3.6's and GPT-2's patterns (SmolLM2's, after ``Digits``) use letters only
  in ``+``-repeated classes of ``\\p{L}`` (with ``\\p{M}``) and in negated classes of them: all
  three are one group;
- Kimi's uses ``[\\p{Han}]+`` apart from the other letters: ``H`` one group, kana and Hangul
  (in both of its letter classes alike) another;
- DeepSeek-V4's isolates ``[一-龥\\u3040-ゟ゠-ヿ]+`` first: ``H`` and kana one group, Hangul (a
  letter of its third split) another.

Exact, for those pre-tokenizers (any other keeps the usual check):

1. *The skeleton*. A pattern that uses a group's characters only inside a ``+``-repeated class
   that holds all of them (and in classes that hold all or none of them) cuts around a run of
   them of any length exactly as around one, and never inside it. The text of the skeleton is
   the text with each run the ids spell replaced by one character of its group; its pre-token
   boundaries are the text's, with each run mapped to that character. If the skeleton's ids are
   its text's encoding, no token crosses a pre-token boundary of the text, and every pre-token
   of the text without a run in it is encoded as in the skeleton.
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
   inside the runs and at their edges are (the others are the skeleton's). A run token with no
   pair to test takes the usual way, but for 3.
3. *Whole pre-tokens that are a token*. tiktoken (and ``tokenizers`` with ``ignore_merges``,
   which is refused) gives a pre-token that is a token that token, whatever the merges make of
   it. Where that is not what BPE makes of the token's bytes (an *unreachable* token holding a
   CJK character: 33 in Qwen's vocabulary), every adjacent pair of the ids BPE makes of them is
   treated as failing here, so ids holding them take the usual way. And for tiktoken a run of
   one token between two certain cuts (4) is a pre-token that is a token: its own encoding.
4. *Certain cuts at a run's edges* need no pair: an added token, the sample's ends, a space that
   opens a run (its group's pattern always starts the run's pre-token with it), and the edges
   of an *isolated* run (:data:`ISOLATED`: Kimi's ``[\\p{Han}]+`` is the only alternative that
   takes Han and takes nothing else) where the character beyond lies outside the class
   (ASCII, another group's, CJK punctuation: none is ``\\p{Han}``; ``々`` or ``㐀`` are, and the run
   goes on through them, so their edge is tested).
5. *The skeleton in pieces*. The pattern reads a text's end differently from more text only
   after whitespace (``\\s+(?!\\S)``, ``\\s++$``); so at a certain cut after a character that is no
   whitespace, the text before and the text after pre-tokenize as they would alone, and the
   skeleton is checked in pieces cut there (pieces repeat more than whole skeletons). A run
   with certain cuts on both sides is a whole pre-token, settled by 2 and 3 alone: it drops out
   of the skeleton; where one of its pairs fails, its encoding is its text's alone (encoded
   again), spliced into the sample's ids.

Pairs are tested by the BPE alone on their two tokens' bytes: ``tokenizers``: the model without
pre-tokenizer, every new pair of a batch as one pre-tokenized input; tiktoken: by its own BPE,
run by recon in C on the ranks (:mod:`recon.tokenizers.fast.rankpairs`; with its whole-piece
look-up, which only makes more pairs fail), or where the kernel isn't compiled through the core:
pairs of one group glued with an added token into one text (the core encodes the text between
two added tokens alone, and a pair of one group is one pre-token of it), the others one
``_encode_single_piece`` each.

It is one module because the five steps above are one argument for exactness, and each piece of
code here is one of its steps (the groups, the pair check, the skeleton and its pieces): apart,
the code would stand away from the reasoning that makes it exact.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np

from recon.kernel import KeySet
from recon.tokenizers.fast.cjkids import id_tables, layout

#: The code points of each kind of letter (all three bytes long in UTF-8).
H = ((0x4E00, 0x9FA5),)
KANA = ((0x3041, 0x3096), (0x30A1, 0x30FA), (0x30FC, 0x30FC))
HANGUL = ((0xAC00, 0xD7A3),)
#: Per pre-tokenizer: the groups, each a tuple of kinds (see the module's docstring).
ONE_GROUP = ((H + KANA + HANGUL),)
KIMI_GROUPS = (H, KANA + HANGUL)
DEEPSEEK_V4_GROUPS = (H + KANA, HANGUL)
#: Per group of each: whether a space before a run always starts the run's pre-token with it
#: (the letters' pattern takes one character before them, a space among them; Kimi's Han and
#: DeepSeek-V4's CJK split isolate the run alone).
SPACED = {ONE_GROUP: (True,), KIMI_GROUPS: (False, True), DEEPSEEK_V4_GROUPS: (False, True)}
#: Per group of each: None, or the group's runs are *isolated*: the pattern makes every run of
#: the group, with no character of the class that takes it around, one pre-token of its own
#: (Kimi's ``[\\p{Han}]+``, the only alternative that takes Han; DeepSeek-V4's CJK split), and
#: then the characters besides ASCII and the other groups' known to lie outside that class
#: (see :func:`skeletons`).
COMMON_PUNCTUATION = "，。、！？：；（）「」『』【】《》〈〉“”‘’…—・"  # (script Common: none is Han)
ISOLATED = {ONE_GROUP: (None,), KIMI_GROUPS: (COMMON_PUNCTUATION, None), DEEPSEEK_V4_GROUPS: (None, None)}
#: one character of each kind that is a token of its own in the vocabularies recon knows
PLACEHOLDERS = {H: "一中人大的", KANA: "のにはをるいした", HANGUL: "이의다는가에하"}


def group_table(token_bytes: Sequence[bytes], groups: Sequence[tuple[tuple[int, int], ...]],
                skip: frozenset[int] = frozenset()) -> np.ndarray:
    """Per id: 1 + the index of the group whose characters the token's bytes are (one or more
    whole ones, UTF-8), else 0 (ids in ``skip``, added tokens, always 0)."""
    n = len(token_bytes)
    vocab = layout(token_bytes)
    lengths = vocab.lengths
    code, three = vocab.codes()
    of = np.zeros(1 << 16, np.int8)  # the group of each code point of the BMP
    for g, ranges in enumerate(groups, 1):
        for lo, hi in ranges:
            of[lo : hi + 1] = g
    char_group = np.where(three, of[code & 0xFFFF], 0)
    begins = vocab.begins
    ends = begins + lengths
    ok = (lengths > 0) & (lengths % 3 == 0)
    last = np.where(ok, ends - 3, 0)
    first = np.where(ok, begins, 0)
    table = np.zeros(n, np.int8)
    for g in range(1, len(groups) + 1):
        start = char_group == g
        # per token: every third byte from its first starts a character of g
        counts = np.zeros(len(start) + 3, np.int64)  # counts[p + 3]: starts at p, p - 3, p - 6... (one phase)
        for phase in range(3):
            counts[3 + phase :: 3][: len(start[phase::3])] = np.cumsum(start[phase::3])
        inside = counts[last + 3] - counts[first]  # starts at begins, begins + 3, ..., last
        table[ok & (inside == lengths // 3)] = g
    if skip:
        table[[i for i in skip if 0 <= i < n]] = 0
    return table


class PairCheck:
    """Whether adjacent pairs of tokens are their own BPE, remembered per process.

    ``groups``: the pre-tokenizer's groups; ``test(a, b, same)``: per pair (arrays of ids;
    ``same``: both of one group), whether the BPE alone of a's bytes then b's is exactly [a, b];
    ``placeholders``: per group, a token of one of its characters that is its own encoding;
    ``unreachable``: the pairs of the BPE of the tokens holding a CJK character that BPE doesn't
    make of their own bytes (a callable, run by :meth:`prepare`), which fail here (see the module, 3)."""

    def __init__(self, token_bytes: Sequence[bytes], added: frozenset[int], groups, placeholders: Sequence[int],
                 bits: int, test: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                 unreachable: Callable[[], list[tuple[int, int]] | None] | None = None, max_pairs: int = 1 << 20,
                 spaced: Sequence[bool] = (), space: int | None = None, table: np.ndarray | None = None,
                 isolated: Sequence[str | None] = (), whole_piece: bool = False, by_id: bool = False):
        self._token_bytes = token_bytes
        self._added = added
        self._groups = groups
        #: per group index (1-based; 0 unused): whether a space before a run of it always starts
        #: the run's pre-token (a ``[^\r\n\p{L}\p{N}]?``-style prefix the pattern takes with the
        #: letters, and no alternative takes a space before a letter otherwise); ``space``: the
        #: token of a space alone
        self.spaced = np.array([False, *spaced], dtype=bool) if space is not None else np.zeros(len(groups) + 1, bool)
        self.space = space
        #: per group index: its runs are isolated (:data:`ISOLATED`); ``_outside[g, c]``: code
        #: point c (ASCII, another group's, or one listed) lies outside the class isolating g's runs
        self.isolated = np.array([False, *(x is not None for x in isolated)], dtype=bool)
        self._outside_chars = [None, *isolated]
        #: a pre-token that is one token is that token, whatever the merges make of its bytes
        #: (tiktoken's whole-piece look-up): then a run token alone between two certain cuts is
        #: its own encoding with no pair to test
        self.whole_piece = whole_piece
        #: runs read off per-id tables (:mod:`recon.tokenizers.fast.cjkids`) where the vocabulary
        #: holds more than :data:`FEW` CJK tokens, else from the batch's bytes
        self.by_id = by_id
        #: per group index (1 + its place in ``groups``): its placeholder (index 0: unused)
        self.placeholders = np.array([0, *placeholders], dtype=np.int64)
        self._bits = bits
        self._test = test
        self._unreachable = unreachable
        self._table: np.ndarray | None = table
        self._unreachable_pairs: np.ndarray | None = None
        self._good, self._bad = KeySet(), KeySet()
        self.tested = 0  #: pairs tested so far
        #: pairs remembered at most (8 bytes a slot, at most 4/5 full: ~10 MB each way); past
        #: that only the good ones the last batch used
        self.max_pairs = max_pairs
        #: False where the unreachable tokens can't be told apart: then no pair passes
        self.usable = True

    def _vocabulary(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every token's bytes laid end to end, each token's first byte there, and its length."""
        if self.__dict__.get("_vocab") is None:
            vocab = layout(self._token_bytes)
            self._vocab = (vocab.data, vocab.begins, vocab.lengths)
        return self._vocab

    def groups_of(self, flat: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per token of ``flat`` (samples from ``starts``): the group (1-based) whose characters
        every one of its bytes belongs to, in the sample's text, else 0 (an added token always
        0); whether it is a space then its group's characters (see :attr:`spaced`); whether its
        first byte starts a character (or is such a space), and whether its last ends one; where
        a group's runs are isolated, the code point of its first and last character (ASCII or
        three bytes long, else -1; None, None otherwise). A token
        may hold part of a character (byte-level vocabularies split rare ones): its group is
        then read off the whole character, which its neighbours complete."""
        if self.by_id:
            group, opened, first_code, last_code = self._id_tables()
            whole = np.ones(len(flat), dtype=bool)  # (a run token is whole characters)
            return group[flat], opened[flat], whole, whole, first_code[flat], last_code[flat]
        return self._groups_by_bytes(flat, starts)

    def _groups_by_bytes(self, flat: np.ndarray, starts: np.ndarray):
        """:meth:`groups_of`, read from the samples' bytes."""
        data, first, lengths = self._vocabulary()
        size = lengths[flat]
        ends = np.cumsum(size)
        begin = ends - size
        total = int(ends[-1]) if len(ends) else 0
        # the sample's bytes: each token's, end to end
        at = np.repeat(first[flat] - begin, size) + np.arange(total)
        text = data[at].astype(np.int64) if total else np.zeros(0, np.int64)
        padded = np.concatenate((text, [0, 0]))
        b0, b1, b2 = padded[:-2], padded[1:-1], padded[2:]
        lead = ((b0 & 0xF0) == 0xE0) & ((b1 & 0xC0) == 0x80) & ((b2 & 0xC0) == 0x80)
        # (a sample's bytes are its text's UTF-8, and samples lie end to end: no character spans two)
        code = ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F)
        of = self._code_groups()
        group = np.where(lead, of[code & 0xFFFF], 0)
        where = np.zeros(total + 2, np.int8)  # per byte: the group of the character it is part of
        where[:total] = group
        where[1 : total + 1] |= group  # (a lead's two continuation bytes)
        where[2 : total + 2] |= group
        where = where[:total]
        # a token of a space then characters of a group that lets a space open its runs: the
        # space counts as its run's (the skeleton keeps it, as a token of its own)
        some = size > 0
        spaced = np.zeros(len(flat), dtype=bool)
        if self.spaced.any() and total:
            first_byte = np.zeros(len(flat), np.int64)
            first_byte[some] = text[begin[some]]
            candidates = np.flatnonzero((first_byte == 0x20) & (size > 1))
            if len(candidates):
                g = where[begin[candidates] + 1]
                candidates = candidates[(g > 0) & lead[begin[candidates] + 1] & self.spaced[g]]
                where = where.copy()
                where[begin[candidates]] = where[begin[candidates] + 1]
                spaced[candidates] = True
        out = np.zeros(len(flat), np.int8)
        if some.any():
            low = np.minimum.reduceat(where, begin[some]) if total else np.zeros(0, np.int8)
            high = np.maximum.reduceat(where, begin[some]) if total else np.zeros(0, np.int8)
            out[some] = np.where(low == high, low, 0)
        out[self._added_mask()[flat]] = 0
        starts_char = np.zeros(len(flat), dtype=bool)
        ends_char = np.zeros(len(flat), dtype=bool)
        starts_char[some] = lead[begin[some]]
        starts_char[spaced] = True
        spaced &= out > 0
        last = ends[some] - 1
        ends_char[some] = (last >= 2) & lead[np.maximum(last - 2, 0)]
        if not self.isolated.any():
            return out, spaced, starts_char, ends_char, None, None
        # each token's first and last character's code point where it is ASCII or three bytes
        # long (-1 otherwise: never outside)
        codes = np.where(lead, code, np.where(text < 0x80, text, -1)) if total else np.zeros(0, np.int64)
        first_code = np.full(len(flat), -1, np.int64)
        last_code = np.full(len(flat), -1, np.int64)
        first_code[some] = codes[begin[some]]
        ascii_last = np.zeros(len(flat), dtype=bool)
        ascii_last[some] = text[last] < 0x80
        last_code[ascii_last] = text[ends[ascii_last] - 1]
        three = ends_char & ~ascii_last & (size >= 3)
        last_code[three] = code[ends[three] - 3]
        return out, spaced, starts_char, ends_char, first_code, last_code

    def _code_groups(self) -> np.ndarray:
        """The group of each code point of the BMP (0: none)."""
        if self.__dict__.get("_of") is None:
            of = np.zeros(1 << 16, np.int8)
            for g, ranges in enumerate(self._groups, 1):
                for lo, hi in ranges:
                    of[lo : hi + 1] = g
            self._of = of
        return self._of

    def _id_tables(self) -> tuple[np.ndarray, ...]:
        """:func:`recon.tokenizers.fast.cjkids.id_tables` of this vocabulary (built on first use)."""
        if self.__dict__.get("_ids") is None:
            self._ids = id_tables(self._token_bytes, self.table, self._code_groups(), self.spaced, self._added_mask())
        return self._ids

    def solid(self) -> np.ndarray:
        """Per code point of the BMP: a character no pattern reads as whitespace (ASCII but
        space and control characters, the groups' letters, CJK punctuation)."""
        if self.__dict__.get("_solid") is None:
            table = self._code_groups() > 0
            table[0x21:0x7F] = True
            table[[ord(c) for c in COMMON_PUNCTUATION]] = True
            self._solid = table
        return self._solid

    def outside(self) -> np.ndarray:
        """Per group index and code point of the BMP: whether the character lies outside the
        class that isolates the group's runs (ASCII, another group's, or one listed)."""
        if self.__dict__.get("_outside") is None:
            of = self._code_groups()
            table = np.zeros((len(self._groups) + 1, 1 << 16), dtype=bool)
            for g, chars in enumerate(self._outside_chars):
                if chars is None:
                    continue
                table[g, :0x80] = True
                table[g] |= (of > 0) & (of != g)
                table[g, [ord(c) for c in chars]] = True
            self._outside = table
        return self._outside

    def _added_mask(self) -> np.ndarray:
        if self.__dict__.get("_added_np") is None:
            mask = np.zeros(len(self._token_bytes), dtype=bool)
            mask[[i for i in self._added if 0 <= i < len(mask)]] = True
            self._added_np = mask
        return self._added_np

    @property
    def table(self) -> np.ndarray:
        """Per id: its group (1-based), 0 for none (built on first use)."""
        if self._table is None:
            self._table = group_table(self._token_bytes, self._groups, self._added)
        return self._table

    def prepare(self) -> None:
        """Build the tables now (a process that forks workers calls this first)."""
        self.table
        self._vocabulary()
        self._code_groups()
        self._added_mask()
        self.outside()
        self.solid()
        if self.by_id:
            self._id_tables()
        if self._unreachable is not None:
            bad = self._unreachable()
            self._unreachable = None
            if bad is None:
                self.usable = False
            elif bad:
                pairs = np.array(bad, dtype=np.int64).reshape(-1, 2)
                self._unreachable_pairs = self._keys(pairs[:, 0], pairs[:, 1])
                self._bad.add(self._unreachable_pairs)

    def _keys(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a + 1).astype(np.uint64) | ((b + 1).astype(np.uint64) << np.uint64(self._bits))

    def ok(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per pair (a[k], b[k]): whether the BPE of a's bytes then b's is exactly [a, b] (and the
        pair is no unreachable token's)."""
        self.prepare()
        if not self.usable:
            return np.zeros(len(a), dtype=bool)
        keys = self._keys(a, b)
        good = np.frombuffer(self._good.find(keys), dtype=bool).copy()
        unknown = ~good & ~np.frombuffer(self._bad.find(keys), dtype=bool)
        if unknown.any():
            new, first = np.unique(keys[unknown], return_index=True)
            at = np.flatnonzero(unknown)[first]
            x, y = a[at], b[at]
            gx, gy = self.table[x], self.table[y]
            passed = np.asarray(self._test(x, y, (gx == gy) & (gx > 0)), dtype=bool)
            self.tested += len(at)
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


#: Group tokens a vocabulary may hold for the pair check to be on by default (see :func:`pairs_pay`).
FEW = 4096


def pairs_pay(table: Callable[[], np.ndarray], batched: bool, cheap: bool = False) -> bool:
    """Whether the pair check is used (``RECON_CJK_PAIRS``: ``1`` always, ``0`` never): by default
    where it is ``cheap`` (the tokenizer says: tiktoken's BPE run by recon in C on the ranks,
    :mod:`recon.tokenizers.fast.rankpairs`, where the pattern isolates a group's runs), or where
    the vocabulary holds at most :data:`FEW` tokens of whole CJK characters (``table()``:
    :func:`group_table`'s, built only then) and the core tests pairs many to a call (``batched``:
    ``tokenizers``' model alone). Then CJK text is mostly byte pieces, whose pairs repeat within
    a chunk or two, and the core's own encode of CJK is slow (SmolLM2: 2.0x faster checks on the
    catalogs). Elsewhere a cold run's pairs cost what encoding the text costs (DeepSeek-V4's
    through its model; Qwen's and cl100k's in C, where the usual check's stretches are
    pre-tokens already): measured, no gain (docs/benchmarks.md), so those keep the usual check."""
    forced = os.environ.get("RECON_CJK_PAIRS")
    if forced in ("0", "1"):
        return forced == "1"
    return cheap or (batched and int((table() > 0).sum()) <= FEW)


def placeholders(groups, token_bytes: Sequence[bytes], encode_piece: Callable[[list[bytes]], list[list[int]]],
                 spaced: Sequence[bool] = (), table: np.ndarray | None = None) -> list[int] | None:
    """Per group, a token of one of its characters that is its own BPE (``encode_piece``: the BPE
    alone of some bytes), or None where a group has none. Where one can, a character no other
    token holds: BPE never merges it with a neighbour, so a skeleton's pre-token around it
    encodes as its neighbours do (and skeletons repeat more); for a group a space may open
    (``spaced``), one BPE keeps apart from a space before it. ``table``: :func:`group_table`'s."""
    space = encode_piece([b" "])[0]
    table = group_table(token_bytes, groups) if table is None else table
    vocab = layout(token_bytes)
    lengths = vocab.lengths
    code, lead = vocab.codes()
    held = np.bincount(code[lead], minlength=1 << 16)  # how often each character stands in the vocabulary
    starts = vocab.begins
    out = []
    for g, group in enumerate(groups, 1):
        chars = [c for kind in (H, KANA, HANGUL) if set(kind) <= set(group) for c in PLACEHOLDERS[kind]]
        lone = np.flatnonzero((table == g) & (lengths == 3))
        lone = lone[held[code[starts[lone]]] == 1][::-1]  # characters no other token holds
        found = first = None
        for char in [*(token_bytes[i].decode() for i in lone[:64].tolist()), *chars]:
            ids = encode_piece([char.encode()])[0]
            if len(ids) != 1:
                continue
            first = ids[0] if first is None else first
            if not (spaced and spaced[g - 1]) or encode_piece([b" " + char.encode()])[0] == space + ids:
                found = ids[0]
                break
        found = first if found is None else found  # (a run a space opens then takes the usual way)
        if found is None:
            return None
        out.append(found)
    return out


def unreachable_pairs(token_bytes: Sequence[bytes], added: frozenset[int],
                      pure: Callable[[list[bytes]], list[list[int]]]) -> list[tuple[int, int]]:
    """Every adjacent pair of the BPE of each token holding a CJK character (a lead byte
    0xE3..0xED) whose BPE is not the token itself (ids outside the vocabulary's table aside)."""
    vocab = layout(token_bytes)
    lengths, data = vocab.lengths, vocab.data
    lead = ((data >= 0xE3) & (data <= 0xED)).astype(np.int64)
    begins = np.cumsum(lengths) - lengths
    has = np.zeros(len(token_bytes), bool)
    nonempty = lengths > 0
    has[nonempty] = np.add.reduceat(lead, begins[nonempty]) > 0 if len(data) else False
    # (reduceat over non-empty tokens only: each sums its own bytes, the next token's start ends it)
    candidates = [i for i in np.flatnonzero(has).tolist() if i not in added]
    out = []
    for i, ids in zip(candidates, pure([token_bytes[i] for i in candidates])):
        if ids != [i] and len(ids) >= 2:
            out += zip(ids, ids[1:])
    return out


def skeletons(pairs: PairCheck, flat: np.ndarray, starts: np.ndarray, counts: np.ndarray, extracted: np.ndarray,
              added: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple] | None:
    """The samples (``flat`` from ``starts``, ``counts`` ids each) whose runs' pairs all pass, whose
    added tokens are where their ids hold them (``extracted``) and whose runs are whole
    characters (``take``); their skeletons' ids, end to end, cut into pieces each checked alone:
    where each piece starts in them, and whose sample it is (``added``: per id, an added token);
    and the dropped runs of taken samples with a pair that fails (where each starts in ``flat``,
    its length), whole pre-tokens whose encoding is their text's alone: the sample's encoding is
    its ids with each encoded again. A taken sample with no piece is confirmed by its pairs alone.
    None where no sample has a run."""
    group, spaced, starts_char, ends_char, first_code, last_code = pairs.groups_of(flat, starts)
    run = group > 0
    if not run.any():
        return None
    sample = np.repeat(np.arange(len(counts)), counts)
    same = sample[1:] == sample[:-1]
    after = np.zeros(len(flat), dtype=bool)  # a run token right after another of its group, same sample
    after[1:] = run[1:] & ~spaced[1:] & (group[1:] == group[:-1]) & same
    opens = run & ~after
    closes = np.zeros(len(flat), dtype=bool)  # a run's last token
    closes[:-1] = run[:-1] & ~after[1:]
    closes[-1] = run[-1]
    a, b = flat[:-1], flat[1:]
    # certain cuts at a run's edges: an added token, the sample's ends, a space that opens a run
    # (its group's pattern always cuts before it), and an isolated run's edge where the
    # character next to it lies outside the class that isolates it
    cut_after = np.ones(len(flat), dtype=bool)  # after each token (the sample's last: its end)
    cut_after[:-1] = ~same | added[a] | added[b] | spaced[1:]
    if first_code is not None and pairs.isolated.any():
        outside = pairs.outside()
        iso = pairs.isolated[group]
        right = np.zeros(len(flat) - 1, dtype=bool)  # a run closes, the next character outside its class
        at = np.flatnonzero(closes[:-1] & iso[:-1] & (first_code[1:] >= 0))
        right[at] = outside[group[at], first_code[at + 1]]
        left = np.zeros(len(flat) - 1, dtype=bool)  # a run opens, the character before outside its class
        at = np.flatnonzero(opens[1:] & iso[1:] & (last_code[:-1] >= 0))
        left[at] = outside[group[at + 1], last_code[at]]
        cut_after[:-1] |= same & (right | left)
    cut_before = np.ones(len(flat), dtype=bool)
    cut_before[1:] = cut_after[:-1]
    # the skeleton is cut into pieces at certain cuts after a character that is no whitespace
    # (only whitespace is read differently at the end of a text: the patterns' lookahead), each
    # piece checked as a text of its own; a run with certain cuts on both sides is a whole
    # pre-token, confirmed by its pairs, and drops out where a piece ends before it
    split = np.zeros(len(flat), dtype=bool)
    drop = np.zeros(len(flat), dtype=bool)
    run_of = np.cumsum(opens) - 1  # per run token: its run
    if last_code is not None:
        solid = (pairs.solid()[np.maximum(last_code, 0)] & (last_code >= 0)) | added[flat] | (run & ends_char)
        split[1:] = cut_before[1:] & solid[:-1]
        split[starts] = True
        full = split[opens] & cut_after[closes]
        drop = run & full[run_of]
    split[starts] = True
    # the pairs inside each run and at its edges, but where the edge is a certain cut
    need = np.flatnonzero(same & (run[:-1] | run[1:]) & ~cut_after[:-1])
    failed = np.zeros(len(counts), dtype=bool)
    tested = np.zeros(len(flat), dtype=bool)  # a run token in a tested pair
    redo = np.zeros(0, np.int64)  # dropped runs with a pair that fails: encoded again, alone
    if len(need):
        ok = pairs.ok(a[need], b[need])
        bad = need[~ok]
        inside = drop[bad] & drop[bad + 1] & (run_of[bad] == run_of[bad + 1])
        failed[sample[bad[~inside]]] = True
        redo = np.unique(run_of[bad[inside]])
        tested[need] = tested[need + 1] = True
    if pairs.whole_piece:  # a run of one token between two certain cuts is a pre-token that is a token
        tested |= opens & closes & cut_before & cut_after
    failed[sample[run & ~tested]] = True  # a run token no pair vouches for
    # a run is whole characters (its tokens may split one between them, not at its edges)
    failed[sample[(opens & ~starts_char) | (closes & ~ends_char)]] = True
    take = (np.add.reduceat(opens, starts) > 0) & ~failed & extracted
    takes = np.repeat(take, counts)
    redo_at = np.flatnonzero(opens)[redo]
    redo_at = redo_at[take[sample[redo_at]]]
    redo_size = np.flatnonzero(closes)[run_of[redo_at]] + 1 - redo_at
    # the rest: each run one placeholder token of its group (after a space token where a space
    # opens it)
    keep = ~drop & (~run | opens) & takes
    emit = keep.astype(np.int64) + (keep & opens & spaced)
    skeleton = np.repeat(np.where(opens, pairs.placeholders[group], flat), emit)
    at = np.cumsum(emit) - emit  # where each token's ids start in the skeleton
    doubled = np.flatnonzero(emit == 2)
    if len(doubled):
        skeleton[at[doubled]] = pairs.space
    kept = np.flatnonzero(keep)
    split[kept[np.diff(np.concatenate(([-1], sample[kept]))) != 0]] = True  # (each sample's first: after a dropped run, a cut)
    pieces = np.flatnonzero(keep & split)
    return take, skeleton, at[pieces], sample[pieces], (redo_at, redo_size)
