"""One tokenizer interface over two native cores: HF ``tokenizers`` and ``tiktoken``.

Everything else in recon talks to a :class:`Tokenizer`: single and batch encode/decode, the
vocabulary size, id <-> piece and id <-> bytes, and the added tokens with the ids a config
declared for them. The two backends reproduce their original loaders' behaviour:

* ``encode(text)`` adds no BOS/EOS and, by default, turns the literal text of an added token
  into its id (``allow_special=True``), as chat templates and servers do;
* ``decode(ids)`` keeps special tokens and replaces bytes that are not valid UTF-8 with U+FFFD,
  so a sample cut inside a character decodes to a replacement character, as servers return it.

Ids are assumed to be in the vocabulary; validating them is the input reader's job.
"""

from __future__ import annotations

import os
import re
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Sequence

from .bytelevel import bytes_to_piece, piece_to_bytes
from .canonical import CanonicalCheck
from .families import FAMILIES, TiktokenFamily
from .pretokenize import Boundaries, boundary_rules, for_huggingface, for_tiktoken
from .wordcache import WordCache


@dataclass(frozen=True)
class AddedToken:
    """A token outside the BPE merges: a special/control token or a user-added one."""

    id: int
    content: str
    special: bool
    #: False for ids recon filled in itself (e.g. Kimi's ``<|reserved_token_N|>``).
    declared: bool = True


@dataclass
class Tokenizer(ABC):
    """A loaded tokenizer. Build one with :func:`recon.load_tokenizer`."""

    name: str
    source: Path
    kind: str
    #: Added tokens as loaded, sorted by id.
    added_tokens: tuple[AddedToken, ...]
    #: What the tokenizer's config declares: id -> token. Empty when the file is its own config.
    declared: dict[int, AddedToken] = field(default_factory=dict)
    #: Named roles from the config (``bos``, ``eos``, ``pad``, ``unk``) -> token text.
    roles: dict[str, str] = field(default_factory=dict)

    # -- encode / decode ---------------------------------------------------------------
    @abstractmethod
    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Ids for ``text``; with ``allow_special`` the text of added tokens becomes their ids."""

    def encode_batch(self, texts: Sequence[str], *, allow_special: bool = True,
                     guesses: Sequence[Sequence[int] | None] | None = None,
                     decoded: Sequence[str | None] | None = None) -> list[list[int]]:
        """``[encode(t) for t in texts]``, through the tokenizer's word cache where it has one.

        ``guesses``: ids expected to be each text's encoding (None where there is no guess), as
        an audit expects a sample's text to encode back to its ids. Where a guess spells the text,
        its encoding is worked out on the ids (:mod:`recon.canonical`): the guess itself (copied)
        where it is the encoding, else with only the stretches that aren't encoded again; the
        result is the same either way.
        ``decoded``: each guess as :meth:`decode_batch` returned it (None where not at hand), so
        the guesses need not be decoded again to compare with the texts; it must be exactly that."""
        cache = self.word_cache(allow_special)
        if cache is None:
            return self._encode_batch(texts, allow_special)
        check = self.canonical_check() if guesses is not None and allow_special else None
        if check is None:
            return cache.encode_batch(texts)
        out = check.encode(texts, guesses, decoded)
        rest = [k for k, ids in enumerate(out) if ids is None]
        for k, ids in zip(rest, cache.encode_batch([texts[k] for k in rest])):
            out[k] = ids
        return out  # type: ignore[return-value]

    def canonical_check(self) -> CanonicalCheck | None:
        """The :class:`~recon.canonical.CanonicalCheck` behind ``encode_batch(..., guesses=)``,
        or None where this tokenizer has no boundary rules (or no word cache, or no decode table)."""
        if "_canonical" not in self.__dict__:
            rules = self._boundary_rules()
            cache = self.word_cache(True) if rules is not None else None
            texts = self._ascii_texts if cache is not None else None
            self._canonical = (CanonicalCheck(cache, texts, self.length_array, rules, self.added_ids)  # type: ignore[arg-type]
                               if texts is not None else None)
        return self._canonical

    def _boundary_rules(self) -> Boundaries | None:
        return None

    def _encode_batch(self, texts: Sequence[str], allow_special: bool) -> list[list[int]]:
        """The native core's batch encode (what the word cache falls back to)."""
        return [self.encode(t, allow_special=allow_special) for t in texts]

    def word_cache(self, allow_special: bool = True) -> WordCache | None:
        """The :class:`~recon.wordcache.WordCache` batch encodes go through, or None where this
        tokenizer's pre-tokenizer isn't one the cache is exact for (checked on probe texts against
        the native encoder) or ``RECON_WORD_CACHE=0`` is set."""
        if os.environ.get("RECON_WORD_CACHE", "1") == "0":
            return None
        caches = self.__dict__.setdefault("_word_caches", {})
        if allow_special not in caches:
            cache = self._make_word_cache(allow_special)
            caches[allow_special] = cache if cache is not None and cache.agrees() else None
        return caches[allow_special]

    def _make_word_cache(self, allow_special: bool) -> WordCache | None:
        return None

    def prepare(self) -> "Tokenizer":
        """Build now the tables batch calls build on first use (the word cache, the decode table,
        byte lengths): a process that forks workers calls this first, so they share one copy."""
        self.word_cache(True)
        self._ascii_texts
        self.length_array
        self.canonical_check()
        return self

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text for ``ids``: special tokens kept, invalid UTF-8 replaced by U+FFFD."""

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """``[decode(ids) for ids in batch]``. A sequence of ASCII tokens (most of code and English)
        is joined from a table of their texts, checked against the native decode when built;
        the rest go to the native core in one batch."""
        texts = self._ascii_texts
        if texts is None:
            return self._decode_batch(batch)
        join, get = "".join, texts.__getitem__
        out: list[str | None] = []
        for ids in batch:
            try:  # any other token is None in the table (a negative id too), and join refuses it
                out.append(join(map(get, ids)))
            except (TypeError, IndexError):
                out.append(None)
        slow = [k for k, text in enumerate(out) if text is None]
        if slow:
            for k, text in zip(slow, self._decode_batch([batch[k] for k in slow])):
                out[k] = text
        return out  # type: ignore[return-value]

    def _decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """The native core's batch decode."""
        return [self.decode(ids) for ids in batch]

    #: whether :meth:`decode` of ASCII tokens is their bytes joined (set by backends where it is)
    _joins_bytes = False

    @cached_property
    def _ascii_texts(self) -> list[str | None] | None:
        """The text of each token whose bytes are ASCII and whose native decode is exactly that
        text, else None; or None where decoding is not a join of token bytes. As many Nones
        follow, so that a negative id (``texts[-1]`` is the last entry) finds None too."""
        if not self._joins_bytes:
            return None
        texts = [data.decode("ascii") if data and data.isascii() else None for data in self.token_bytes]
        ids = [i for i, text in enumerate(texts) if text is not None]
        # all of them decoded in one sequence first: where that is their texts joined (a decoder
        # that joins tokens' bytes, as this table assumes), each decodes to its own; else one by one
        if self._decode_batch([ids])[0] != "".join(texts[i] for i in ids):
            for i, native in zip(ids, self._decode_batch([[i] for i in ids])):
                if native != texts[i]:
                    texts[i] = None
        return texts + [None] * len(texts)

    # -- vocabulary ------------------------------------------------------------------------
    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the model can emit: the largest id + 1."""

    @abstractmethod
    def id_to_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (an added token: its UTF-8 text)."""

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str | None:
        """The vocabulary's string for a token (byte-level form, e.g. ``Ġjets``), or None."""

    @abstractmethod
    def piece_to_id(self, piece: str) -> int | None:
        """The id whose vocabulary string is ``piece`` (added tokens by their text), or None."""

    @cached_property
    def added_by_content(self) -> dict[str, AddedToken]:
        return {t.content: t for t in self.added_tokens}

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """``token_bytes[id]`` is the token's bytes (``b""`` for a gap): a table for fast joins."""
        table = []
        for i in range(self.vocab_size):
            try:
                table.append(self.id_to_bytes(i))
            except KeyError:
                table.append(b"")
        return table

    @cached_property
    def pieces(self) -> list[str]:
        """``pieces[id]``: :meth:`id_to_piece` as a table (``"<id>"`` for an id no token holds)."""
        return [self.id_to_piece(i) or f"<{i}>" for i in range(self.vocab_size)]

    @cached_property
    def added_ids(self) -> frozenset[int]:
        return frozenset(t.id for t in self.added_tokens)

    @cached_property
    def token_lengths(self) -> list[int]:
        """``token_lengths[id]``: the token's length in bytes."""
        return [len(b) for b in self.token_bytes]

    @cached_property
    def length_array(self):
        """:attr:`token_lengths` as a numpy array (for whole-batch offset arithmetic)."""
        import numpy as np

        return np.array(self.token_lengths, dtype=np.int64)

    @cached_property
    def byte_table(self):
        """Every token's bytes end to end (numpy uint8) and where each id's begin (numpy int64)."""
        import numpy as np

        table = np.frombuffer(b"".join(self.token_bytes), dtype=np.uint8)
        return table, np.cumsum(self.length_array) - self.length_array

    def ids_bytes(self, ids: Sequence[int]) -> bytes:
        """The exact bytes of a sequence of ids (no UTF-8 decoding, nothing replaced)."""
        return b"".join(map(self.token_bytes.__getitem__, ids))

    @cached_property
    def gap_ids(self) -> frozenset[int]:
        """Ids below ``vocab_size`` that no token holds (decoding them fails)."""
        return frozenset(i for i, data in enumerate(self.token_bytes) if not data)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of added tokens flagged special (the ones servers skip in returned text)."""
        return frozenset(t.id for t in self.added_tokens if t.special)

    @cached_property
    def bytes_to_id(self) -> dict[bytes, int]:
        """Every token's exact bytes -> its id (the lowest id where two tokens share bytes)."""
        return {data: i for i, data in reversed(list(enumerate(self.token_bytes))) if data}

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} kind={self.kind} vocab_size={self.vocab_size} "
            f"added_tokens={len(self.added_tokens)}>"
        )


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
        # ``guesses`` and ``decoded`` go unused: no boundary rules for tiktoken patterns yet (canonical_check is None)
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
        return self._core.decode_batch([ids if type(ids) is list else list(ids) for ids in batch], errors="replace")

    @property
    def vocab_size(self) -> int:
        return self._core.n_vocab

    def id_to_bytes(self, token_id: int) -> bytes:
        return self._core.decode_single_token_bytes(token_id)

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
