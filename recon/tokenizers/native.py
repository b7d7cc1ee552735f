"""The two native cores behind :class:`~recon.tokenizers.tokenizer.Tokenizer`: HF ``tokenizers``
and ``tiktoken``, and the guard every call into a Rust core that reads untrusted input goes through.

Each wrapper reproduces its original loader's behaviour (see :mod:`recon.tokenizers.tokenizer`)
and offers the exact fast paths of :mod:`recon.tokenizers.fast` where its pre-tokenizer allows.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import unicodedata
from contextlib import contextmanager
from functools import cached_property, lru_cache
from typing import Iterator, Sequence

from recon.tokenizers.bytelevel import bytes_to_piece, piece_to_bytes
from recon.tokenizers.families import FAMILIES, TiktokenFamily
from recon.tokenizers.fast.derive import derived_boundaries
from recon.tokenizers.fast.pretokenize import (
    Boundaries,
    boundary_rules,
    for_huggingface,
    for_tiktoken,
)
from recon.tokenizers.fast.wordcache import WordCache
from recon.tokenizers.tokenizer import Tokenizer


@contextmanager
def native_panics_quiet() -> Iterator[None]:
    """Run a call into a Rust core with file descriptor 2 set aside. A Rust panic prints its
    own message and backtrace straight to fd 2 (not through ``sys.stderr``) before pyo3 turns it
    into ``PanicException``; recon reports that exception in one line, so the raw output is
    dropped when the call fails, and written out unchanged when it succeeds."""
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to protect
        yield
        return
    with tempfile.TemporaryFile() as sink:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if ok:
                sink.seek(0)
                if data := sink.read():
                    os.write(2, data)


def native_failure(e: BaseException) -> bool:
    """True for an error raised inside a Rust core (tokenizers, tiktoken): a plain ``Exception``,
    or pyo3's ``PanicException``, which derives from ``BaseException`` so ``except Exception``
    misses it. Interrupts and exits are not failures to report."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"



# ---------------------------------------------------------------------------------------------
class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (from ``tokenizer.json`` or built from a GGUF vocabulary)."""

    def __init__(self, core, **kw):
        super().__init__(**kw)
        self._core = core
        self._plain_core = None  # a copy that encodes special-token text as plain text
        self._bare_core = None  # the BPE model alone (see _bpe_batch)
        decoder = core.decoder.__class__.__name__ if core.decoder is not None else ""
        self._byte_level = decoder == "ByteLevel"
        self._joins_bytes = self._byte_level  # the ByteLevel decoder maps each token back to its bytes
        self._sentencepiece = decoder in ("Sequence", "Metaspace", "ByteFallback")

    @property
    def core(self):
        """The underlying ``tokenizers.Tokenizer``."""
        return self._core

    def _encoder(self, allow_special: bool):
        if allow_special:
            return self._core
        if self._plain_core is None:
            from tokenizers import Tokenizer as Core

            plain = Core.from_str(self._core.to_str())
            plain.encode_special_tokens = True
            self._plain_core = plain
        return self._plain_core

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        return self._encoder(allow_special).encode(text, add_special_tokens=False).ids

    def _encode_batch(self, texts: Sequence[str], allow_special: bool) -> list[list[int]]:
        core = self._encoder(allow_special)
        batch = getattr(core, "encode_batch_fast", core.encode_batch)
        return [e.ids for e in batch(list(texts), add_special_tokens=False)]

    def _make_word_cache(self, allow_special: bool) -> WordCache | None:
        if not _word_cacheable(self._core):
            return None
        passes: list[dict[str, int]] = [{}, {}]  # non-normalized tokens first: the order tokenizers extracts them in
        bail = []  # texts holding these go to the native encoder whole
        for token_id, t in self._core.get_added_tokens_decoder().items():
            if (t.special and not allow_special) or t.lstrip or t.rstrip or t.single_word:
                bail.append(t.content)
            else:
                passes[t.normalized][t.content] = token_id
        cut = for_huggingface(self._core)
        return WordCache(lambda texts: self._encode_batch(texts, allow_special), self.token_lengths, passes, bail,
                         cut=cut, encode_pieces=self._bpe_batch if cut is not None else None)

    def _boundary_rules(self) -> Boundaries | None:
        return boundary_rules(self._core) if _word_cacheable(self._core) else None

    def _bpe_batch(self, pieces: list[str]) -> list[list[int]]:
        """The BPE model alone on each piece (no normalizer, pre-tokenizer or added tokens): what
        the native encoder runs on each pre-token. Pieces go in as pre-tokenized words, a
        thousand to an input, and come back apart by their word index: one input per piece
        would cost more in per-input overhead than in BPE."""
        if self._bare_core is None:
            from tokenizers import Tokenizer as Core
            from tokenizers import pre_tokenizers

            bare = Core(self._core.model)
            bare.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
            self._bare_core = bare
        groups = [pieces[i : i + 1000] for i in range(0, len(pieces), 1000)]
        out: list[list[int]] = []
        for group, encoding in zip(groups, self._bare_core.encode_batch(groups, is_pretokenized=True, add_special_tokens=False)):
            each: list[list[int]] = [[] for _ in group]
            for token_id, word in zip(encoding.ids, encoding.word_ids):
                each[word].append(token_id)
            out += each
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._core.decode(list(ids), skip_special_tokens=False)

    def _decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self._core.decode_batch([ids if type(ids) is list else list(ids) for ids in batch], skip_special_tokens=False)

    @cached_property
    def _vocab(self) -> dict[str, int]:
        return self._core.get_vocab(with_added_tokens=True)

    @cached_property
    def vocab_size(self) -> int:
        return max(self._vocab.values()) + 1

    def id_to_piece(self, token_id: int) -> str | None:
        return self._core.id_to_token(token_id)

    def piece_to_id(self, piece: str) -> int | None:
        return self._vocab.get(piece)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """As :attr:`Tokenizer.token_bytes`, from the vocabulary already loaded (asking the core
        id by id costs a native call each, at every start)."""
        piece_of: list[str | None] = [None] * self.vocab_size
        for piece, token_id in self._vocab.items():
            piece_of[token_id] = piece
        for token_id in [i for i, piece in enumerate(piece_of) if piece is None]:  # an id two texts share, or a gap
            piece_of[token_id] = self._core.id_to_token(token_id)
        return [b"" if piece is None else self._piece_bytes(i, piece) for i, piece in enumerate(piece_of)]

    def id_to_bytes(self, token_id: int) -> bytes:
        piece = self._core.id_to_token(token_id)
        if piece is None:
            raise KeyError(f"id {token_id} is not in the vocabulary of {self.name}")
        return self._piece_bytes(token_id, piece)

    def _piece_bytes(self, token_id: int, piece: str) -> bytes:
        added = self.added_by_content.get(piece)
        if added is not None and added.id == token_id:
            return piece.encode("utf-8")
        if self._byte_level:
            data = piece_to_bytes(piece)
            if data is not None:
                return data
        if self._sentencepiece:
            m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
            if m:
                return bytes([int(m.group(1), 16)])
            return piece.replace("\u2581", " ").encode("utf-8")
        return self._core.decode([token_id], skip_special_tokens=False).encode("utf-8")


def _word_cacheable(core) -> bool:
    """A byte-level BPE without normalizer whose pre-tokenizer is made of regex splits."""
    import json

    from tokenizers.models import BPE

    if not isinstance(core.model, BPE) or core.model.dropout:
        return False
    if core.normalizer is not None and json.loads(core.normalizer.__getstate__()).get("normalizers", None) != []:
        return False
    if core.pre_tokenizer is None:
        return False
    state = json.loads(core.pre_tokenizer.__getstate__())
    steps = state["pretokenizers"] if state["type"] == "Sequence" else [state]
    return all(
        step["type"] in ("Split", "Digits") or (step["type"] == "ByteLevel" and not step.get("add_prefix_space"))
        for step in steps
    )


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

    def __init__(self, core, family: TiktokenFamily, **kw):
        super().__init__(**kw)
        self._core = core
        self.family = family
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

    def _glued_encoder(self):
        """The core's own encode, where it is exactly :meth:`encode` of the text: no added
        token's content in it (tiktoken's ordinary encode extracts none) and, for a family that
        normalizes, the text already in NFC. Stretches are shorter than the loader's slices."""
        specials = getattr(self._core, "_special_tokens", None)
        if specials is None:
            return None
        find = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True)))).search if specials else None
        ordinary, nfc = self._core.encode_ordinary, self.family.nfc

        def encode(text: str) -> list[int] | None:
            if (find is not None and find(text)) or (nfc and not unicodedata.is_normalized("NFC", text)):
                return None
            return ordinary(text)

        return encode

    def _boundary_rules(self) -> Boundaries | None:
        """Derived from the pattern the core runs (:mod:`recon.tokenizers.fast.derive`)."""
        return derived_boundaries(self._core._pat_str) if self.word_cache(True) is not None else None

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
        if allow_special:
            return self._core.encode_batch(slices, allowed_special="all")
        return self._core.encode_batch(slices, disallowed_special=())

    def _make_word_cache(self, allow_special: bool) -> WordCache | None:
        specials = getattr(self._core, "_special_tokens", None)  # content -> id; tiktoken has no public map
        if self.family.pattern not in {f.pattern for f in FAMILIES.values()} or specials is None:
            return None
        specials = specials if allow_special else {}
        # tiktoken tries specials in no fixed order: a text where one is a prefix of another goes whole
        bail = [a for a in specials if any(b != a and b.startswith(a) for b in specials)]
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
        table, join, gaps = self.token_bytes, b"".join, self._gaps
        out: list[str | None] = []
        for ids in batch:
            try:  # (a negative id would index from the end: refused first)
                ok = min(ids, default=0) >= 0 and (not gaps or gaps.isdisjoint(ids))
                out.append(join(map(table.__getitem__, ids)).decode("utf-8", "replace") if ok else None)
            except (IndexError, TypeError):
                out.append(None)
        slow = [k for k, text in enumerate(out) if text is None]
        if slow:
            native = self._core.decode_batch([list(batch[k]) for k in slow], errors="replace")
            for k, text in zip(slow, native):
                out[k] = text
        return out  # type: ignore[return-value]

    @property
    def vocab_size(self) -> int:
        return self._core.n_vocab

    def id_to_bytes(self, token_id: int) -> bytes:
        return self._core.decode_single_token_bytes(token_id)

    def prepare(self) -> "TiktokenTokenizer":
        super().prepare()
        self._gaps
        return self

    @cached_property
    def _gaps(self) -> frozenset[int]:
        """Ids below the vocabulary size that no token holds."""
        return frozenset(i for i, data in enumerate(self.token_bytes) if not data)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """As :attr:`Tokenizer.token_bytes`, from the ranks and specials the core was built from
        (asking it id by id costs a call each, ~0.5 s per process for 150k tokens)."""
        ranks, specials = getattr(self._core, "_mergeable_ranks", None), getattr(self._core, "_special_tokens", None)
        if ranks is None or specials is None:
            return super().token_bytes
        table = [b""] * self.vocab_size
        for data, i in ranks.items():
            table[i] = data
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
