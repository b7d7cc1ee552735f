"""The two native cores behind :class:`~recon.tokenizers.tokenizer.Tokenizer`: HF ``tokenizers`` here
and ``tiktoken`` (:mod:`recon.tokenizers.native_tiktoken`), and the guard every call into a Rust
core that reads untrusted input goes through.

Each wrapper reproduces its original loader's behaviour (see :mod:`recon.tokenizers.tokenizer`)
and offers the exact fast paths of :mod:`recon.tokenizers.fast` where its pre-tokenizer allows.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from contextlib import contextmanager
from functools import cached_property
from typing import Iterator, Sequence

import numpy as np

from recon.tokenizers.bytelevel import bytes_to_piece, piece_to_bytes, pieces_to_bytes
from recon.tokenizers.fast.derive import matches_no_ascii, split_sequence_boundaries
from recon.tokenizers.fast.equivalents import EQUIVALENTS
from recon.tokenizers.fast.cjkruns import DEEPSEEK_V4_GROUPS, ONE_GROUP, SPACED, PairCheck, group_table, pairs_pay, placeholders
from recon.tokenizers.fast.pretokenize import (
    GPT2_PATTERN,
    Boundaries,
    _hf_patterns,
    boundary_rules,
    for_huggingface,
    split_patterns,
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
        cut = for_huggingface(self._core, idle=matches_no_ascii)
        return WordCache(lambda texts: self._encode_batch(texts, allow_special), self.token_lengths, passes, bail,
                         cut=cut, encode_pieces=self._bpe_batch if cut is not None else None)

    def _boundary_rules(self) -> Boundaries | None:
        """SmolLM2's by hand; a pre-tokenizer of Isolated splits (DeepSeek's) derived from its
        patterns (:func:`recon.tokenizers.fast.derive.split_sequence_boundaries`)."""
        if not _word_cacheable(self._core):
            return None
        rules = boundary_rules(self._core)
        if rules is None:
            patterns = split_patterns(self._core)
            rules = split_sequence_boundaries(patterns) if patterns else None
        return rules

    def _equivalents(self) -> tuple[tuple[int, int, str], ...]:
        """GPT-2's regex after ``Digits`` (SmolLM2's): CJK letters are ``x``, CJK punctuation ``,``
        (:data:`recon.tokenizers.fast.equivalents.EQUIVALENTS`)."""
        import json

        if not _word_cacheable(self._core):
            return ()
        try:
            patterns = _hf_patterns(json.loads(self._core.pre_tokenizer.__getstate__()))
        except (ValueError, TypeError, AttributeError):
            return ()
        return EQUIVALENTS["letters"] if patterns == ["[0-9]", GPT2_PATTERN] else ()

    def _cjk_pairs(self, bits: int) -> PairCheck | None:
        """Runs of CJK tokens confirmed by their pairs (:mod:`recon.tokenizers.fast.cjkruns`) for
        a byte-level BPE (no merges skipped, no affixes, no dropout) behind ``Digits`` then
        GPT-2's regex (SmolLM2's: one group) or DeepSeek-V4's three splits (Han and kana, then
        Hangul); each pair by the model alone."""
        import json

        model = self._core.model
        if os.environ.get("RECON_CJK_PAIRS") == "0" or not self._byte_level or not _word_cacheable(self._core) \
                or getattr(model, "ignore_merges", True) or getattr(model, "continuing_subword_prefix", "") \
                or getattr(model, "end_of_word_suffix", "") or getattr(model, "dropout", None):
            return None
        try:
            patterns = _hf_patterns(json.loads(self._core.pre_tokenizer.__getstate__()))
        except (ValueError, TypeError, AttributeError):
            return None
        groups = {0: ONE_GROUP, 1: DEEPSEEK_V4_GROUPS}.get(
            [["[0-9]", GPT2_PATTERN], DEEPSEEK_V4_PATTERNS].index(patterns)
            if patterns in (["[0-9]", GPT2_PATTERN], DEEPSEEK_V4_PATTERNS) else -1)
        if groups is None:
            return None
        table = group_table(self.token_bytes, groups, self.added_ids)
        if not pairs_pay(lambda: table, True):
            return None
        found = placeholders(groups, self.token_bytes, self._bpe_bytes, SPACED[groups], table)
        space = self._bpe_bytes([b" "])[0]
        if found is None or len(space) != 1:
            return None
        return PairCheck(self.token_bytes, self.added_ids, groups, found, bits, self._pair_test, spaced=SPACED[groups], table=table,
                         space=space[0])

    def _bytes_model(self):
        """A core of the BPE model alone (no normalizer, pre-tokenizer or added tokens)."""
        core = self.__dict__.get("_bytes_core")
        if core is None:
            from tokenizers import Tokenizer as Core

            core = self._bytes_core = Core(self._core.model)
        return core

    def _bpe_bytes(self, data: list[bytes]) -> list[list[int]]:
        """The BPE model alone on each byte string, each one input of one byte-level word."""
        core = self._bytes_model()
        return [e.ids for e in core.encode_batch([[bytes_to_piece(d)] for d in data], is_pretokenized=True,
                                                 add_special_tokens=False)]

    def _pair_test(self, a: np.ndarray, b: np.ndarray, same: np.ndarray) -> np.ndarray:
        """Per pair: whether the BPE model alone makes exactly [a, b] of a's bytes then b's;
        every pair one word of one pre-tokenized input (a byte-level piece is its bytes' pieces
        joined), one native call."""
        if not len(a):
            return np.zeros(0, dtype=bool)
        core = self._bytes_model()
        piece = self._core.id_to_token
        words = [piece(x) + piece(y) for x, y in zip(a.tolist(), b.tolist())]
        encoding = core.encode(words, is_pretokenized=True, add_special_tokens=False)
        ids = np.array(encoding.ids, dtype=np.int64)
        word = np.array(encoding.word_ids, dtype=np.int64)
        sizes = np.bincount(word, minlength=len(words))
        first = np.cumsum(sizes) - sizes
        two = sizes == 2
        ok = np.zeros(len(words), dtype=bool)
        ok[two] = (ids[first[two]] == a[two]) & (ids[first[two] + 1] == b[two])
        return ok

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
        native = lambda rest: self._core.decode_batch(rest, skip_special_tokens=False)  # noqa: E731
        if self._unjoined is None:
            return native([ids if type(ids) is list else list(ids) for ids in batch])
        return self._join_decode(batch, self._unjoined, native)

    def _natively_decoded(self, texts: list[str | None]) -> list[int]:
        if self._unjoined is None:
            return super()._natively_decoded(texts)
        return sorted(i for i in self._unjoined if i < len(texts) and texts[i] is not None)

    def _decodes_bytes(self) -> bool:
        return self._unjoined is not None and all(not self.token_bytes[i] for i in self._unjoined)

    @cached_property
    def _unjoined(self) -> frozenset[int] | None:
        """For a ByteLevel decoder, which maps every token back to its bytes and decodes them
        joined (invalid UTF-8 replaced): the ids whose decode alone is not their
        :attr:`token_bytes` (gaps; an added token whose text the decoder maps, say one holding
        ``Ġ``), which go to the core. None for any other decoder (everything goes to the core)."""
        if not self._byte_level:
            return None
        table = self.token_bytes
        unjoined = {i for i, data in enumerate(table) if not data}
        added = [t.id for t in self.added_tokens if t.id < len(table)]
        for token_id, text in zip(added, self._core.decode_batch([[i] for i in added], skip_special_tokens=False)):
            if text.encode("utf-8") != table[token_id]:
                unjoined.add(token_id)
        return frozenset(unjoined)

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
        if not self._byte_level:
            return [b"" if piece is None else self._piece_bytes(i, piece) for i, piece in enumerate(piece_of)]
        added = self.added_by_content  # (one translate a piece, the table fetched once: ~0.1 s a start)
        return [b"" if piece is None else data if data is not None and piece not in added else self._piece_bytes(i, piece)
                for i, (piece, data) in enumerate(zip(piece_of, pieces_to_bytes(piece_of)))]

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


#: DeepSeek-V4's pre-tokenizer: digits by threes, CJK runs, then a tiktoken-style pattern, each Isolated
DEEPSEEK_V4_PATTERNS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


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


# the tiktoken core's wrapper (and Kimi's input slicing) live in their own module, named here too
from recon.tokenizers.native_tiktoken import (  # noqa: E402, F401
    MAX_ENCODE_CHARS,
    MAX_RUN_CHARS,
    TiktokenTokenizer,
    split_long_runs,
)
