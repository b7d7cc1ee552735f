"""Whether ids are the tokenizer's own encoding of the text they spell, decided on the ids.

Why: an audit asks of every sample whether the ids are what the tokenizer makes of their text,
and most samples say yes. Finding out by encoding the text cuts it into pre-tokens and looks each
one up (:mod:`recon.tokenizers.fast.wordcache`), a few hundred Python operations per sample. Here the ids are cut
instead, with NumPy, between two tokens where the pre-tokenizer starts a fresh pre-token
whatever text surrounds them (:func:`recon.tokenizers.fast.pretokenize.boundary_rules`: after a letter, around a
digit, before whitespace...). Each stretch between two cuts is then checked once in the life of
the process: a single token against a table over the vocabulary, two to a few tokens as one
integer in a set. Only stretches never seen before are spelled out and encoded.

Exact: encoding a text extracts its added tokens, pre-tokenizes the text between them and encodes
each pre-token alone. A cut that is a pre-token boundary whatever surrounds it (and pre-tokenizes
each side as it would alone) splits that work into independent parts, so the ids are the text's
encoding iff the added tokens are extracted exactly where the ids hold them and every stretch
between two cuts is the encoding of its own text.
"""

from __future__ import annotations

from itertools import chain, compress
from typing import Sequence

import numpy as np

import regex

from recon.tokenizers.fast.pretokenize import ALPHABET, Boundaries
from recon.tokenizers.fast.wordcache import WordCache


class CanonicalCheck:
    """Token-space check for one tokenizer (with ``allow_special``: added tokens' text is theirs).

    ``texts[id]`` is the text of each token whose native decode is its ASCII bytes, else None
    (:attr:`recon.tokenizers.tokenizer.Tokenizer._ascii_texts`; ids that are None never pass);
    ``byte_lengths[id]`` every token's length in bytes; ``rules`` the pre-tokenizer's
    :class:`~recon.tokenizers.fast.pretokenize.Boundaries`; ``cache`` the word cache that encodes stretches never seen.
    At most ``max_runs`` learned stretches of two tokens or more are kept; past that only those
    the last batch used, the common ones (so memory stays flat)."""

    def __init__(self, cache: WordCache, texts: Sequence[str | None], byte_lengths: np.ndarray,
                 rules: Boundaries, added_ids: frozenset[int], max_runs: int = 1 << 15):
        vocab_size = len(byte_lengths)
        self._cache = cache
        self._texts = texts
        self._byte_lengths = byte_lengths
        glue = cache.encode_batch([rules.glue]) if rules.glue else None
        #: (character, its id) that glues stretches learned together, where it is one token
        self._glue = (rules.glue, glue[0][0]) if glue and len(glue[0]) == 1 else None
        # each token's first, second and last character's class (0 for a token outside the table)
        tabled = np.fromiter((text is not None for text in texts[:vocab_size]), bool, vocab_size)
        self._lengths = np.where(tabled, byte_lengths, 0)
        data, starts = np.frombuffer("".join(filter(None, texts[:vocab_size])).encode("ascii"), np.uint8), \
            np.cumsum(self._lengths) - self._lengths
        classes = np.array(rules.class_of(), dtype=np.int16)

        def class_at(where: np.ndarray, has: np.ndarray) -> np.ndarray:
            out = np.zeros(vocab_size, np.int16)
            out[has] = classes[data[where[has]]]
            return out

        first = class_at(starts, tabled)  # (a token in the table has a character at least)
        second = class_at(starts + 1, tabled & (self._lengths > 1))
        last = class_at(starts + self._lengths - 1, tabled)
        self._first, self._last = first, last
        self._rules = np.array(rules.pairs, dtype=bool)
        #: per id: the token ends with whitespace; it starts with a space the rules let a fresh
        #: pre-token start with after whitespace
        spaces = sorted({int(classes[ord(c)]) for c in ALPHABET if regex.match(r"\s", c)})
        self._ends_space = np.isin(last, spaces)
        self._space_word = (first == classes[ord(" ")]) & np.isin(second, sorted(rules.space_then))
        self._added = np.zeros(vocab_size, dtype=bool)
        self._added[list(added_ids)] = True
        #: per id: 1 if the token alone is its own text's encoding, 0 if not, -1 not known yet
        self._single = np.full(vocab_size, -1, dtype=np.int8)
        #: a stretch of 2.._pack tokens packed into one int: ``_bits`` bits per id + 1
        self._bits = max(1, vocab_size.bit_length())
        self._pack = 64 // self._bits
        self._runs: set[int] = set()  # packed stretches known to be their text's encoding
        self._long: set[tuple[int, ...]] = set()  # longer ones, as tuples
        self.max_runs = max_runs

    def confirm(self, texts: Sequence[str], guesses: Sequence[Sequence[int] | None],
                decoded: Sequence[str | None] | None = None) -> list[bool]:
        """For each text, whether its guess is exactly its encoding (False where it isn't, or
        where unsure). ``decoded``: as for :meth:`encode`."""
        return [ids is not None and ids == guess for ids, guess in zip(self.encode(texts, guesses, decoded), guesses)]

    def encode(self, texts: Sequence[str], guesses: Sequence[Sequence[int] | None],
               decoded: Sequence[str | None] | None = None) -> list[list[int] | None]:
        """Each text's encoding, worked out from its guess: the guess itself where every stretch
        is its own text's encoding, else the guess with the stretches that aren't replaced by
        their text's encoding; None where unsure (the caller encodes those texts).

        ``decoded[k]``, where not None, must be ``decode(guesses[k])`` exactly (as
        :meth:`recon.tokenizers.tokenizer.Tokenizer.decode_batch` returned it): the guess is then compared
        with the text through it, instead of being spelled out again."""
        out: list[list[int] | None] = [None] * len(texts)
        spelled: list[int] = []  # texts their guess decodes to
        join, get = "".join, self._texts.__getitem__
        for k, (text, ids) in enumerate(zip(texts, guesses)):
            if ids is None or not len(ids):
                continue
            if decoded is not None and decoded[k] is not None:
                if decoded[k] == text:
                    spelled.append(k)
                continue
            try:  # a token outside the ASCII table is None there, and join refuses it
                if join(map(get, ids)) == text:
                    spelled.append(k)
            except (TypeError, IndexError):
                continue
        if not spelled:
            return out
        counts = np.fromiter(map(len, (guesses[k] for k in spelled)), np.int64, len(spelled))
        flat = np.fromiter(chain.from_iterable(guesses[k] for k in spelled), np.int64, int(counts.sum()))
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        inside = (flat >= 0) & (flat < len(self._lengths))  # (a decode skips ids it doesn't know)
        tabled = np.zeros(len(flat), dtype=bool)
        tabled[inside] = self._lengths[flat[inside]] > 0
        tabled = np.logical_and.reduceat(tabled, starts)  # every token in the ASCII table
        if not tabled.all():  # (decoded texts were not spelled from the table): only those go on
            flat = flat[np.repeat(tabled, counts)]
            spelled, counts = list(compress(spelled, tabled.tolist())), counts[tabled]
            if not spelled:
                return out
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        added = self._added[flat]
        extracted = self._added_where_held(texts, spelled, flat, starts, added)
        # a stretch starts at each sample's first token, around every added token, and at every
        # boundary the rules make certain
        cut = np.zeros(len(flat), dtype=bool)
        cut[starts] = True
        left, right = flat[:-1], flat[1:]
        cut[1:] |= (self._rules[self._last[left], self._first[right]] | added[:-1] | added[1:]
                    | (self._ends_space[left] & self._space_word[right]))
        first = np.flatnonzero(cut)
        size = np.diff(np.append(first, len(flat)))
        good, keys, tuples = self._stretches_known(flat, first, size, added)
        whole = np.logical_and.reduceat(good, np.searchsorted(first, starts)) & extracted
        for k, ok in zip(spelled, whole.tolist()):
            if ok:
                out[k] = list(guesses[k])
        # a sample whose added tokens are right but some stretch is not its text's encoding:
        # its encoding is the guess with each such stretch encoded (a cut splits the work)
        bad = np.flatnonzero(~good)
        if len(bad):
            sample = np.searchsorted(starts, first[bad], side="right") - 1
            fixable = extracted[sample]
            bad, sample = bad[fixable], sample[fixable]
            encoded = self._encode([flat[first[b] : first[b] + size[b]].tolist() for b in bad.tolist()])
            spliced: dict[int, list[int]] = {}
            at: dict[int, int] = {}  # per sample: how far its guess is copied
            for b, s, ids in zip(bad.tolist(), sample.tolist(), encoded):
                guess, begin = guesses[spelled[s]], int(first[b] - starts[s])
                done = spliced.setdefault(s, [])
                done += guess[at.get(s, 0) : begin]
                done += ids
                at[s] = begin + int(size[b])
            for s, done in spliced.items():
                guess = guesses[spelled[s]]
                out[spelled[s]] = done + list(guess[at[s] :])
        if len(self._runs) + len(self._long) > self.max_runs:  # full: keep what this batch used
            runs, longs = self._runs.intersection(keys), self._long.intersection(tuples)
            if len(runs) + len(longs) > self.max_runs // 2:
                runs, longs = set(), set()
            self._runs, self._long = runs, longs
        return out

    def _added_where_held(self, texts, spelled: list[int], flat, starts, added) -> np.ndarray:
        """Per sample: whether the encoder extracts from its text exactly the added tokens its ids
        hold, at the same offsets (text that spells an added token with ordinary ones, or an added
        token the encoder would not extract, fails)."""
        ends = np.cumsum(self._lengths[flat])
        at = np.flatnonzero(added)
        sample = np.searchsorted(starts, at, side="right") - 1
        base = np.concatenate(([0], ends))[starts]  # each sample's first byte, laid end to end
        offsets = (ends[at] - self._lengths[flat[at]] - base[sample]).tolist()
        held: list[list[tuple[int, int]]] = [[] for _ in spelled]
        for s, offset, token_id in zip(sample.tolist(), offsets, flat[at].tolist()):
            held[s].append((offset, token_id))
        return np.fromiter((self._cache.added_spans(texts[k]) == spans for k, spans in zip(spelled, held)),
                           dtype=bool, count=len(spelled))

    def _stretches_known(self, flat: np.ndarray, first: np.ndarray, size: np.ndarray,
                         added: np.ndarray) -> tuple[np.ndarray, list[int], list[tuple[int, ...]]]:
        """Per stretch (``size[s]`` tokens from ``flat[first[s]]``): whether it is its own text's
        encoding; and the keys of the stretches of two tokens or more, packed and as tuples.
        Stretches not seen before are learned together, in one batch encode."""
        good = np.ones(len(first), dtype=bool)  # an added token alone: extracted where it should be
        lone = np.flatnonzero((size == 1) & ~added[first])
        packed = np.flatnonzero((size > 1) & (size <= self._pack))
        long = np.flatnonzero(size > self._pack)
        lone_ids = flat[first[lone]]
        keys = self._packed(flat, first[packed], size[packed]).tolist()
        tuples = [tuple(flat[first[s] : first[s] + size[s]].tolist()) for s in long.tolist()]
        runs, longs = self._runs, self._long
        new_lone = np.unique(lone_ids[self._single[lone_ids] < 0]).tolist()
        new_packed: dict[int, list[int]] = {}
        for k in np.flatnonzero(~np.fromiter(map(runs.__contains__, keys), bool, len(keys))).tolist():
            if keys[k] not in new_packed:
                s = packed[k]
                new_packed[keys[k]] = flat[first[s] : first[s] + size[s]].tolist()
        new_long = [t for t in dict.fromkeys(tuples) if t not in longs]
        stretches = [[i] for i in new_lone] + list(new_packed.values()) + [list(t) for t in new_long]
        if stretches:
            ok = iter(self._learn(stretches))
            for i in new_lone:
                self._single[i] = next(ok)
            runs.update(key for key in new_packed if next(ok))
            longs.update(t for t in new_long if next(ok))
        good[lone] = self._single[lone_ids] == 1
        good[packed] = np.fromiter(map(runs.__contains__, keys), bool, len(keys))
        good[long] = np.fromiter(map(longs.__contains__, tuples), bool, len(tuples))
        return good, keys, tuples

    def _learn(self, stretches: list[list[int]]) -> list[bool]:
        """Whether each stretch is the encoding of its own text."""
        return [got == want for got, want in zip(self._encode(stretches), stretches)]

    def _encode(self, stretches: list[list[int]]) -> list[list[int]]:
        """The encoding of each stretch's text. The texts are encoded as one, glued with a
        character the pre-tokenizer always cuts around (a digit, for Digits then GPT-2): one
        call instead of one per stretch. The encoding comes apart at the glue when each glue
        character is a token of its own at its place (else, say where an added token's text
        spans the glue, the stretches are encoded one by one)."""
        get = self._texts.__getitem__
        texts = ["".join(map(get, ids)) for ids in stretches]
        glue = self._glue
        if glue is None or len(texts) < 2:
            encoded = self._cache.encode_batch(texts)
        else:
            ids = self._cache.encode_batch([glue[0].join(texts)])[0]
            encoded = self._unglue(ids, texts, glue[1])
            if encoded is None:
                encoded = self._cache.encode_batch(texts)
        return encoded

    def _unglue(self, ids: list[int], texts: list[str], glue_id: int) -> list[list[int]] | None:
        """The encoding of the texts glued (one glue character between two) cut back into each
        text's, or None where a glue character is not a token of its own at its place."""
        held = np.array(ids, dtype=np.int64)
        lengths = self._byte_lengths[held]
        starts = np.cumsum(lengths) - lengths
        sizes = np.fromiter(map(len, texts), np.int64, len(texts))  # ASCII: characters are bytes
        places = np.cumsum(sizes[:-1] + 1) - 1  # where each glue character is
        at = np.searchsorted(starts, places)
        if (at >= len(ids)).any() or not ((starts[at] == places) & (lengths[at] == 1) & (held[at] == glue_id)).all():
            return None
        bounds = [-1, *at.tolist(), len(ids)]
        return [ids[a + 1 : b] for a, b in zip(bounds[:-1], bounds[1:])]

    def _packed(self, flat: np.ndarray, first: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Each stretch of at most ``_pack`` tokens as one integer: id + 1 in each ``_bits`` bits."""
        keys = np.zeros(len(first), dtype=np.uint64)
        for j in range(int(size.max()) if len(size) else 0):
            inside = size > j
            keys[inside] |= (flat[first[inside] + j] + 1).astype(np.uint64) << np.uint64(self._bits * j)
        return keys
