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
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress, count
from pathlib import Path
from typing import Sequence

from recon.kernel import ascii_texts, join, join_each
from recon.tokenizers.fast.canonical import CanonicalCheck
from recon.tokenizers.fast.glue import SpecialGlue
from recon.tokenizers.fast.cjkruns import PairCheck
from recon.tokenizers.fast.pretokenize import Boundaries
from recon.tokenizers.fast.wordcache import WordCache


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

    #: Whether batch encodes may take the exact fast paths (:mod:`recon.tokenizers.fast`). False:
    #: every text goes through the native encoder, the oracle the fast paths are checked against
    #: (``recon audit --encoder native``; ``--check native`` runs both and compares). Not a
    #: dataclass field: set it on a loaded tokenizer.
    fast_paths = True

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
        its encoding is worked out on the ids (:mod:`recon.tokenizers.fast.canonical`): the guess itself (copied)
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
        """The :class:`~recon.tokenizers.fast.canonical.CanonicalCheck` behind ``encode_batch(..., guesses=)``,
        or None where this tokenizer has no boundary rules (or no word cache, or no decode table)."""
        if "_canonical" not in self.__dict__:
            rules = self._boundary_rules()
            cache = self.word_cache(True) if rules is not None else None
            texts = self._ascii_texts if cache is not None else None
            self._canonical = (CanonicalCheck(cache, texts, self.length_array, rules, self.added_ids,  # type: ignore[arg-type]
                                              token_bytes=self.token_bytes, encode_glued=self._glued_encoder(),
                                              decodes_bytes=self._decodes_bytes(), special_glue=self._special_glue(),
                                              cjk_pairs=self._cjk_pairs, equivalents=self._equivalents())
                               if texts is not None else None)
        return self._canonical

    def _decodes_bytes(self) -> bool:
        """Whether :meth:`decode` of any ids is their :attr:`token_bytes` joined, invalid UTF-8
        replaced (ids no token holds aside)."""
        return False

    def _glued_encoder(self):
        """For :class:`~recon.tokenizers.fast.canonical.CanonicalCheck`: the native encoding of one
        long text, or None where the word cache should encode it (the default)."""
        return None

    def _equivalents(self) -> tuple[tuple[int, int, str], ...]:
        """For :class:`~recon.tokenizers.fast.canonical.CanonicalCheck`: code point ranges whose
        characters the pre-tokenizer can't tell from an ASCII one, ``(lo, hi, c)``, so its
        boundary rules hold for them as for ``c`` (:data:`recon.tokenizers.fast.equivalents.EQUIVALENTS`);
        none by default."""
        return ()

    def _special_glue(self) -> SpecialGlue | None:
        """For :class:`~recon.tokenizers.fast.canonical.CanonicalCheck`: an added token to glue
        stretches with (:class:`~recon.tokenizers.fast.glue.SpecialGlue`), where the native core
        splits at added tokens first and vouches for its encodes; None (the default) where not."""
        return None

    def _boundary_rules(self) -> Boundaries | None:
        return None

    def _cjk_pairs(self, bits: int) -> PairCheck | None:
        """For :class:`~recon.tokenizers.fast.canonical.CanonicalCheck`: the
        :class:`~recon.tokenizers.fast.cjkruns.PairCheck` that confirms runs of CJK tokens by their
        pairs (``bits``: bits per id in a packed key), or None where the pre-tokenizer is not one
        it is exact for (the default), or ``RECON_CJK_PAIRS=0``."""
        return None

    def _encode_batch(self, texts: Sequence[str], allow_special: bool) -> list[list[int]]:
        """The native core's batch encode (what the word cache falls back to)."""
        return [self.encode(t, allow_special=allow_special) for t in texts]

    def word_cache(self, allow_special: bool = True) -> WordCache | None:
        """The :class:`~recon.tokenizers.fast.wordcache.WordCache` batch encodes go through, or None where this
        tokenizer's pre-tokenizer isn't one the cache is exact for (checked on probe texts against
        the native encoder), or the fast paths are off (:attr:`fast_paths`, ``RECON_WORD_CACHE=0``)."""
        if not self.fast_paths or os.environ.get("RECON_WORD_CACHE", "1") == "0":
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
        check = self.canonical_check()
        if check is not None and check.pairs is not None:
            check.pairs.prepare()
        self._decode_batch([[]])  # (its tables)
        return self

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text for ``ids``: special tokens kept, invalid UTF-8 replaced by U+FFFD."""

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """``[decode(ids) for ids in batch]``. Where the native decode is the tokens' bytes joined
        (:attr:`_joins_bytes`: tiktoken, HF ByteLevel), they are joined here (:meth:`_join_decode`,
        faster than joining texts even for ASCII); the rest go to the native core in one batch."""
        return self._decode_batch(batch)

    def _decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """The native core's batch decode."""
        return [self.decode(ids) for ids in batch]

    def _natively_decoded(self, texts: list[str | None]) -> list[int]:
        """Of the ids whose ``texts[id]`` is not None, those :meth:`_decode_batch` hands to the
        native decoder (the rest it joins from :attr:`token_bytes`): all of them, unless a
        backend joins."""
        return list(compress(count(), texts))  # (every text is non-empty: true)

    def _join_decode(self, batch: Sequence[Sequence[int]], unjoined: frozenset[int], native) -> list[str]:
        """Each sequence's :attr:`token_bytes` joined and decoded, invalid UTF-8 replaced (what a
        decoder that joins bytes does, without a native call per batch; faster than joining
        texts even for ASCII); sequences holding an id of ``unjoined`` or outside the vocabulary
        go to ``native`` (lists in, texts out). ``unjoined`` must be the same at every call."""
        table = self.__dict__.get("_join_table")
        if table is None:  # None where the native decode must say: joining refuses it
            table = list(self.token_bytes)
            for i in unjoined:
                if 0 <= i < len(table):
                    table[i] = None
            self._join_table = table
        out: list[str | None] = join_each(batch if type(batch) is list else list(batch), table, True)
        slow = [k for k, text in enumerate(out) if text is None]
        if slow:
            for k, text in zip(slow, native([list(batch[k]) for k in slow])):
                out[k] = text
        return out  # type: ignore[return-value]

    #: whether :meth:`decode` is the tokens' bytes joined, invalid UTF-8 replaced (set by backends where it is)
    _joins_bytes = False

    @cached_property
    def _ascii_texts(self) -> list[str | None] | None:
        """The text of each token whose bytes are ASCII and whose native decode is exactly that
        text, else None; or None where decoding is not a join of token bytes. As many Nones
        follow, so that a negative id (``texts[-1]`` is the last entry) finds None too."""
        if not self._joins_bytes:
            return None
        texts = ascii_texts(self.token_bytes)
        # the ids the decode hands to the native decoder (the rest it joins from these very bytes):
        # all of them decoded in one sequence first; where that is their texts joined (a decoder
        # that joins tokens' bytes, as this table assumes), each decodes to its own; else one by one
        ids = self._natively_decoded(texts)
        if ids and self._decode_batch([ids])[0] != "".join(texts[i] for i in ids):
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

    def pieces_of(self, ids: Sequence[int]) -> list[str]:
        """``[piece(i) for i in ids]``, with the pieces named before read straight from the cache
        (an audit names ~35 for each mismatched record: a method call each cost more than the rest)."""
        table = self.__dict__.get("pieces")
        if table is not None:
            return list(map(self.piece, ids))
        cache = self._piece_cache
        out = list(map(cache.get, ids))
        if None in out:
            missing = list(dict.fromkeys(i for i, found in zip(ids, out) if found is None))
            cache.update(zip(missing, self._pieces_batch(missing)))
            out = [found if found is not None else cache[i] for i, found in zip(ids, out)]
        return out

    def _pieces_batch(self, ids: list[int]) -> list[str]:
        """:meth:`piece` of each of ``ids`` (none of them cached): a backend that can makes them
        at once."""
        return [self.piece(i) for i in ids]

    def piece(self, token_id: int) -> str:
        """``pieces[token_id]``, without building the whole table (an audit names a few pieces
        per mismatch; the table costs a pass over the vocabulary in every worker)."""
        table = self.__dict__.get("pieces")
        if table is not None and 0 <= token_id < len(table):
            return table[token_id]
        found = self._piece_cache.get(token_id)
        if found is None:
            try:
                found = self.id_to_piece(token_id) if 0 <= token_id < self.vocab_size else None
            except (KeyError, IndexError, ValueError, OverflowError):
                found = None
            found = found or f"<{token_id}>"
            self._piece_cache[token_id] = found
        return found

    @cached_property
    def _piece_cache(self) -> dict[int, str]:
        return {}

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
        return list(map(len, self.token_bytes))

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
        table = self.token_bytes
        data = join(ids, table, False) if type(table) is list else None  # (None: an id it can't join)
        return data if data is not None else b"".join(map(table.__getitem__, ids))

    @cached_property
    def gap_ids(self) -> frozenset[int]:
        """Ids below ``vocab_size`` that no token holds (decoding them fails)."""
        import numpy as np

        return frozenset(np.flatnonzero(self.length_array == 0).tolist())

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
