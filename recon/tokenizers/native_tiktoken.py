"""The ``tiktoken`` core behind :class:`~recon.tokenizers.tokenizer.Tokenizer`, with its family's
normalization (Qwen's NFC) and input slicing (Kimi's loader cuts long inputs and long runs).

Why a module of its own: the wrapper reproduces the original loaders' behaviour and offers the
exact fast paths of :mod:`recon.tokenizers.fast` (boundary rules derived from the family's
pattern, stretches learned through the core's own encode); beside the HF wrapper in
:mod:`recon.tokenizers.native` the two made one module longer than one sitting.
"""

from __future__ import annotations

import os
import re
import unicodedata
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from recon.tokenizers.bytelevel import bytes_to_piece, piece_to_bytes
from recon.tokenizers.families import CL100K, FAMILIES, KIMI, QWEN3_5, TiktokenFamily
from recon.tokenizers.fast.derive import derived_boundaries
from recon.tokenizers.fast.pretokenize import Boundaries, for_tiktoken
from recon.tokenizers.fast.glue import SpecialGlue
from recon.tokenizers.fast.equivalents import EQUIVALENTS
from recon.kernel import COMPILED
from recon.tokenizers.fast.rankpairs import rank_pairs
from recon.tokenizers.fast.cjkids import layout
from recon.tokenizers.fast.cjkruns import FEW, ISOLATED, KIMI_GROUPS, ONE_GROUP, SPACED, PairCheck, group_table, pairs_pay, placeholders, unreachable_pairs
from recon.tokenizers.fast.wordcache import WordCache, prefixes_of_others
from recon.tokenizers.ranks import tokens_by_rank
from recon.tokenizers.tokenizer import Tokenizer

# ---------------------------------------------------------------------------------------------
# Kimi's (and Llama 3's) loader: tiktoken panics on huge inputs, so text is cut into slices.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


@lru_cache(maxsize=4)
def _long_run(max_run: int) -> re.Pattern:
    return re.compile(r"\s{%d,}|\S{%d,}" % (max_run + 1, max_run + 1))


def split_long_runs(text: str, max_run: int = MAX_RUN_CHARS) -> list[str]:
    r"""Cut ``text`` so no piece holds more than ``max_run`` consecutive (non-)whitespace chars.

    Port of ``_split_whitespaces_or_nonwhitespaces`` from Kimi's loader. Python's ``\s`` is
    ``str.isspace``, so the regex test is exact and skips the character loop for normal text.
    """
    if len(text) <= max_run or not _long_run(max_run).search(text):
        return [text]
    pieces, start, run = [], 0, 0
    in_space = text[0].isspace()
    for i, ch in enumerate(text):
        now_space = ch.isspace()
        if in_space ^ now_space:
            run, in_space = 1, now_space
        else:
            run += 1
            if run > max_run:
                pieces.append(text[start:i])
                start, run = i, 1
    pieces.append(text[start:])
    return pieces


class TiktokenTokenizer(Tokenizer):
    """A ``tiktoken.Encoding`` plus the family's normalization and input slicing."""

    def __init__(self, core, family: TiktokenFamily, ordinary: list[bytes] | None = None, **kw):
        """``ordinary``, where given, is the core's mergeable ranks as :func:`~recon.tokenizers.ranks.tokens_by_rank`
        lists them (the loader has it; built again otherwise), handed over: :attr:`token_bytes` becomes it."""
        super().__init__(**kw)
        self._core = core
        self.family = family
        self._ordinary = ordinary
        self._decoder: dict[int, bytes] | None = None

    @property
    def core(self):
        """The underlying ``tiktoken.Encoding``."""
        return self._core

    def _slices(self, text: str) -> list[str]:
        if self.family.nfc:
            text = unicodedata.normalize("NFC", text)
        if not self.family.cut_long_runs or len(text) <= MAX_RUN_CHARS:
            return [text]
        return [
            piece
            for i in range(0, len(text), MAX_ENCODE_CHARS)
            for piece in split_long_runs(text[i : i + MAX_ENCODE_CHARS])
        ]

    def _encode_one(self, text: str, allow_special: bool) -> list[int]:
        if allow_special:
            return self._core.encode(text, allowed_special="all")
        return self._core.encode(text, disallowed_special=())

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        slices = self._slices(text)
        if len(slices) == 1:
            return self._encode_one(slices[0], allow_special)
        return [i for s in slices for i in self._encode_one(s, allow_special)]

    def encode_batch(self, texts: Sequence[str], *, allow_special: bool = True,
                     guesses: Sequence[Sequence[int] | None] | None = None,
                     decoded: Sequence[str | None] | None = None) -> list[list[int]]:
        check = self.canonical_check() if guesses is not None and allow_special else None
        if check is None:
            return self._encode_plain(texts, allow_special)
        if self.family.cut_long_runs:  # a text the loader would slice: not checked on its ids
            guesses = [g if len(t) <= MAX_RUN_CHARS else None for t, g in zip(texts, guesses)]
        if self.family.nfc:  # the core encodes a text's NFC: a text not in NFC is not its ids' encoding
            guesses = [g if t.isascii() or unicodedata.is_normalized("NFC", t) else None for t, g in zip(texts, guesses)]
        out = check.encode(texts, guesses, decoded)
        rest = [k for k, ids in enumerate(out) if ids is None]
        for k, ids in zip(rest, self._encode_plain([texts[k] for k in rest], allow_special)):
            out[k] = ids
        return out  # type: ignore[return-value]

    def _decodes_bytes(self) -> bool:
        return True  # tiktoken's decode: the tokens' bytes joined, errors replaced

    def _glued_encoder(self):
        """The core's own encode, where it is exactly :meth:`encode` of the text: no added
        token's content in it (tiktoken's ordinary encode extracts none) and, for a family that
        normalizes, the text already in NFC. Stretches are shorter than the loader's slices."""
        cache = self.word_cache(True)  # its passes find every special's content (the core's specials)
        if cache is None:
            return None
        ordinary, nfc, holds = self._core.encode_ordinary, self.family.nfc, cache.holds_added

        def encode(text: str) -> list[int] | None:
            if holds(text) or (nfc and not unicodedata.is_normalized("NFC", text)):
                return None
            return ordinary(text)

        return encode

    def _special_glue(self) -> SpecialGlue | None:
        """tiktoken splits a text at its added tokens before its pattern sees it: the text
        between two is encoded as if alone (the core's encode of each stretch, as
        :meth:`_glued_encoder` vouches for it: stretches are shorter than the loader's slices,
        and for a family that normalizes only texts already in NFC go). The glue is the
        lowest-id added token that no other begins or is begun by, so where it stands it alone
        is extracted (the ungluing checks it is, at every place)."""
        specials = getattr(self._core, "_special_tokens", None)
        if self.word_cache(True) is None or not specials:
            return None
        tangled = set(prefixes_of_others(specials))
        tangled |= {b for a in tangled for b in specials if b != a and b.startswith(a)}
        table = self.token_bytes
        fit = sorted((i, text) for text, i in specials.items()
                     if text not in tangled and i < len(table) and table[i] == text.encode())
        if not fit:
            return None
        core = self._core
        return SpecialGlue(fit[0][1], fit[0][0], lambda text: core.encode(text, allowed_special="all"),
                           (lambda text: unicodedata.is_normalized("NFC", text)) if self.family.nfc else None)

    def _boundary_rules(self) -> Boundaries | None:
        """Derived from the pattern the core runs (:mod:`recon.tokenizers.fast.derive`)."""
        return derived_boundaries(self._core._pat_str) if self.word_cache(True) is not None else None

    def _equivalents(self) -> tuple[tuple[int, int, str], ...]:
        kind = {KIMI.pattern: "punctuation", QWEN3_5.pattern: "letters", CL100K.pattern: "letters"}.get(self.family.pattern)
        return EQUIVALENTS[kind] if kind is not None else ()

    def _cjk_pairs(self, bits: int) -> PairCheck | None:
        """Runs of CJK tokens confirmed by their pairs (:mod:`recon.tokenizers.fast.cjkruns`) for
        the families whose patterns use CJK letters only in runs of letters (all three: Kimi's
        keeps Han apart, and its Han runs are isolated); each pair by the core's BPE alone (which
        gives a piece that is a token that token, so a pair whose bytes are a token fails), run
        by recon in C on the ranks where the kernel is compiled
        (:mod:`recon.tokenizers.fast.rankpairs`), else through the core. Runs are read off
        per-id tables where the vocabulary holds many CJK tokens (Qwen's, Kimi's), from the
        batch's bytes where few (cl100k's: Chinese is mostly byte pieces there)."""
        piece = getattr(self._core, "_encode_single_piece", None)
        groups = {KIMI.pattern: KIMI_GROUPS, QWEN3_5.pattern: ONE_GROUP, CL100K.pattern: ONE_GROUP}.get(self.family.pattern)
        if piece is None or os.environ.get("RECON_CJK_PAIRS") == "0" or groups is None:
            return None
        table, added = self.token_bytes, self.added_ids
        pure = lambda data: [piece(d) for d in data]  # noqa: E731
        ranks = getattr(self._core, "_mergeable_ranks", None)
        # pairs tested in C on the ranks pay where the pattern isolates a group's runs (Kimi's
        # Han): the usual check learns whole lines there, the pairs a clause each; where CJK
        # letters take an ASCII letter's class (Qwen, cl100k) the usual check's stretches are
        # already pre-tokens, as cheap to encode as their pairs are to test (measured)
        in_c = COMPILED and ranks is not None
        if not pairs_pay(lambda: group_table(table, groups, added), False,
                         in_c and any(x is not None for x in ISOLATED[groups])):
            return None
        groups_table = group_table(table, groups, added)
        found = placeholders(groups, table, pure, SPACED[groups], groups_table)
        space = pure([b" "])[0]
        if found is None or len(space) != 1:
            return None
        test = rank_pairs(table, ranks.values()) if in_c else self._core_pair_test(table, piece)

        def unreachable() -> list[tuple[int, int]] | None:
            # the BPE alone of a token's bytes, without the core's look-up of a whole piece: the
            # bytes then 0xFF, a byte no longer token holds (so no merge takes it), cut off after
            lengths = self.length_array
            where = np.flatnonzero(layout(table).data == 0xFF)
            if (lengths[np.searchsorted(np.cumsum(lengths), where, side="right")] > 1).any():
                return None
            return _cached_pairs(table, self.length_array, lambda: unreachable_pairs(
                table, added, lambda data: [piece(d + b"\xff")[:-1] for d in data]))

        return PairCheck(table, added, groups, found, bits, test, unreachable, spaced=SPACED[groups], space=space[0],
                         table=groups_table, isolated=ISOLATED[groups], whole_piece=True,
                         by_id=int((groups_table > 0).sum()) > FEW)

    def _core_pair_test(self, table: list[bytes], piece):
        """The pair test through the core (where recon's C BPE is not built): pairs of one group
        glued with an added token, many to one encode (the text between two added tokens is
        encoded alone, and a pair of one group is one piece of it); the others one piece each."""
        glue = self._special_glue()

        def test(a, b, same) -> np.ndarray:
            ok = np.zeros(len(a), dtype=bool)
            rest = np.flatnonzero(~same) if glue is not None else np.arange(len(a))
            if glue is not None:
                together = np.flatnonzero(same)
                for part in np.array_split(together, max(1, len(together) // 20000)):
                    if len(part):
                        ok[part] = _glued_pairs(table, glue, a[part], b[part])
            xs, ys = a[rest].tolist(), b[rest].tolist()
            ok[rest] = [piece(table[x] + table[y]) == [x, y] for x, y in zip(xs, ys)]
            return ok

        return test

    def _encode_plain(self, texts: Sequence[str], allow_special: bool) -> list[list[int]]:
        """:meth:`encode` of each text, through the word cache where there is one."""
        slices = [self._slices(t) for t in texts]
        flat = [s for group in slices for s in group]
        cache = self.word_cache(allow_special)
        encoded = cache.encode_batch(flat) if cache is not None else self._encode_slices(flat, allow_special)
        if len(flat) == len(texts):
            return encoded
        out, k = [], 0
        for group in slices:
            ids: list[int] = []
            for _ in group:
                ids.extend(encoded[k])
                k += 1
            out.append(ids)
        return out

    def _encode_slices(self, slices: list[str], allow_special: bool) -> list[list[int]]:
        if len(slices) < 64:  # (the core's batch form starts a pool of threads at every call)
            return [self._encode_one(text, allow_special) for text in slices]
        if allow_special:
            return self._core.encode_batch(slices, allowed_special="all")
        return self._core.encode_batch(slices, disallowed_special=())

    def _make_word_cache(self, allow_special: bool) -> WordCache | None:
        specials = getattr(self._core, "_special_tokens", None)  # content -> id; tiktoken has no public map
        if self.family.pattern not in {f.pattern for f in FAMILIES.values()} or specials is None:
            return None
        specials = specials if allow_special else {}
        # tiktoken tries specials in no fixed order: a text where one is a prefix of another goes whole
        bail = prefixes_of_others(specials)
        piece = getattr(self._core, "_encode_single_piece", None)  # the BPE alone on one pre-token
        cut = for_tiktoken(self.family.pattern) if piece is not None else None
        return WordCache(lambda texts: self._encode_slices(texts, allow_special), self.token_lengths, [specials], bail,
                         cut=cut, encode_pieces=(lambda pieces: [piece(p.encode()) for p in pieces]) if cut else None)

    def decode(self, ids: Sequence[int]) -> str:
        return self._core.decode(list(ids), errors="replace")

    _joins_bytes = True  # tiktoken decodes the tokens' bytes joined, invalid UTF-8 replaced

    def _decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """tiktoken's decode is its tokens' bytes joined, invalid UTF-8 replaced: joined here from
        :attr:`token_bytes` (the core's batch decode starts a thread pool per call). A sequence
        with an id no token holds goes to the core, which says so as it always has."""
        return self._join_decode(batch, self.gap_ids,
                                 lambda rest: self._core.decode_batch(rest, errors="replace"))

    def _natively_decoded(self, texts: list[str | None]) -> list[int]:
        return []  # only ids no token holds go to the core, and those have no text

    @property
    def vocab_size(self) -> int:
        return self._core.n_vocab

    def id_to_bytes(self, token_id: int) -> bytes:
        return self._core.decode_single_token_bytes(token_id)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """As :attr:`Tokenizer.token_bytes`, from the ranks and specials the core was built from
        (asking it id by id costs a call each, ~0.5 s per process for 150k tokens)."""
        ranks, specials = getattr(self._core, "_mergeable_ranks", None), getattr(self._core, "_special_tokens", None)
        if ranks is None or specials is None:
            return super().token_bytes
        table, self._ordinary = self._ordinary if self._ordinary is not None else tokens_by_rank(ranks), None
        table += [b""] * (self.vocab_size - len(table))
        for text, i in specials.items():
            table[i] = text.encode("utf-8")
        return table

    @cached_property
    def pieces(self) -> list[str]:
        """As :attr:`Tokenizer.pieces` (:meth:`id_to_piece` of every id), from :attr:`token_bytes`."""
        by_content = self.added_by_content
        out = []
        for i, data in enumerate(self.token_bytes):
            added = by_content.get(data.decode("utf-8", "replace")) if data else None
            out.append(added.content if added is not None and added.id == i else bytes_to_piece(data) if data else f"<{i}>")
        return out

    def id_to_piece(self, token_id: int) -> str | None:
        try:
            data = self._core.decode_single_token_bytes(token_id)
        except KeyError:
            return None
        added = self.added_by_content.get(data.decode("utf-8", "replace"))
        if added is not None and added.id == token_id:
            return added.content
        return bytes_to_piece(data)

    def _pieces_batch(self, ids: list[int]) -> list[str]:
        """An ordinary token's piece is its bytes in the byte-level alphabet, one character a
        byte: the batch's bytes are translated in one call and cut back by their lengths (one
        call each cost ~3 µs, on cold data a few thousand a chunk); added tokens one by one."""
        table, added, size = self.token_bytes, self.added_ids, self.vocab_size
        plain = [k for k, i in enumerate(ids) if type(i) is int and 0 <= i < size and i not in added and table[i]]
        out: list[str | None] = [None] * len(ids)
        text = bytes_to_piece(b"".join(table[ids[k]] for k in plain))
        at = 0
        for k in plain:
            end = at + len(table[ids[k]])
            out[k] = text[at:end]
            at = end
        return [found if found is not None else self.piece(i) for i, found in zip(ids, out)]

    def piece_to_id(self, piece: str) -> int | None:
        added = self.added_by_content.get(piece)
        if added is not None:
            return added.id
        data = piece_to_bytes(piece)
        if data is None:
            return None
        try:
            return self._core.encode_single_token(data)
        except KeyError:
            return None


def _glued_pairs(table: list[bytes], glue: SpecialGlue, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair of tokens of one CJK group: whether the core encodes a's text then b's as
    exactly [a, b], every pair between two of the glue's added token in one text, one call."""
    text = glue.text.join(map(bytes.decode, map(bytes.__add__, map(table.__getitem__, a.tolist()),
                                                          map(table.__getitem__, b.tolist()))))
    ids = np.array(glue.encode(text), dtype=np.int64)
    n = len(a)
    at = np.flatnonzero(ids == glue.id)
    ok = np.zeros(n, dtype=bool)
    if len(at) != n - 1:  # (no pair's text holds the glue's: a pair is its tokens' text)
        return ok
    bounds = np.concatenate(([-1], at, [len(ids)]))
    first, sizes = bounds[:-1] + 1, np.diff(bounds) - 1
    two = sizes == 2
    ok[two] = (ids[first[two]] == a[two]) & (ids[first[two] + 1] == b[two])
    return ok


def _cached_pairs(table: list[bytes], lengths: np.ndarray, compute) -> list[tuple[int, int]]:
    """``compute()``, kept in recon's cache folder under a hash of the vocabulary's bytes (it
    runs the BPE on every CJK token, a few tenths of a second a process)."""
    import hashlib
    import json

    from recon.tokenizers.gguf import cache_dir

    key = hashlib.sha256(b"cjkruns-unreachable-v1\0")
    key.update(np.ascontiguousarray(lengths, np.int64).tobytes())
    key.update(b"".join(table))
    path = cache_dir() / "cjkruns" / (key.hexdigest()[:32] + ".json")
    try:
        return [tuple(p) for p in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        pass
    pairs = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(pairs))
        os.replace(scratch, path)
    except OSError:
        pass
    return pairs
