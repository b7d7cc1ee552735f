"""Whether ids are the tokenizer's own encoding of the text they spell, decided on the ids.

Why: an audit asks of every sample whether the ids are what the tokenizer makes of their text,
and most samples say yes. Finding out by encoding the text cuts it into pre-tokens and looks each
one up (:mod:`recon.tokenizers.fast.wordcache`), a few hundred Python operations per sample. Here the ids are cut
instead, in one C pass over a batch's ids (:func:`recon.kernel.unsettled`), between two tokens where the
pre-tokenizer starts a fresh pre-token whatever text surrounds them
(:func:`recon.tokenizers.fast.pretokenize.boundary_rules`: after a letter, around a digit, before
whitespace...). The same pass looks each stretch between two cuts up (a single token in a table
over the vocabulary, two to a few tokens as one integer in a hash set) and lists the few it can't
settle, so each stretch is checked once in the life of the process. Only stretches never seen
before are spelled out and encoded, glued into long texts (one native call for many stretches,
see :meth:`CanonicalCheck._learn`).

Every token takes part, not only ASCII ones: a token's first and last character classes come from
its bytes (a byte outside ASCII is class 0, which never cuts), so a cut always falls between two
ASCII characters and every stretch is whole characters of the text. A sample whose ids hold a
token outside ASCII is taken on only where its ids' bytes are exactly its text's UTF-8.

Exact: encoding a text extracts its added tokens, pre-tokenizes the text between them and encodes
each pre-token alone. A cut that is a pre-token boundary whatever surrounds it (and pre-tokenizes
each side as it would alone) splits that work into independent parts, so the ids are the text's
encoding iff the added tokens are extracted exactly where the ids hold them and every stretch
between two cuts is the encoding of its own text.

It is one module because :class:`CanonicalCheck` is one pass over a batch: the cut, the look-ups,
the learning and the CJK runs' hand-off share its tables and stores, and split apart each would
reach into the others' state.
"""

from __future__ import annotations

from itertools import chain, compress, count
from typing import Callable, Sequence

import numpy as np
import regex

from recon.kernel import KeySet, count_in, cut, cut_table, flatten, slices, unsettled
from recon.tokenizers.fast.pretokenize import ALPHABET, Boundaries
from recon.tokenizers.fast.glue import GluedEncoder, SpecialGlue
from recon.tokenizers.fast.cjkruns import PairCheck, skeletons
from recon.tokenizers.fast.equivalents import equivalent_classes
from recon.tokenizers.fast.wordcache import WordCache, prefixes_of_others


class CanonicalCheck:
    """Token-space check for one tokenizer (with ``allow_special``: added tokens' text is theirs).

    ``texts[id]`` is the text of each token whose native decode is its ASCII bytes, else None
    (:attr:`recon.tokenizers.tokenizer.Tokenizer._ascii_texts`: a fast way to spell ASCII samples);
    ``token_bytes[id]`` every token's bytes (``b""`` for an id no token holds, which never passes);
    ``byte_lengths[id]`` their lengths; ``rules`` the pre-tokenizer's
    :class:`~recon.tokenizers.fast.pretokenize.Boundaries`; ``cache`` the word cache that encodes
    stretches never seen (``decodes_bytes``: every token's decode is its bytes); ``encode_glued``, where given, the tokenizer's own encoding of one long
    text holding no added token's content, or None where it can't vouch for it (the word cache
    encodes it then). At most ``max_packed`` learned stretches that pack into an int (8 bytes
    each) and ``max_runs`` longer ones (a bytes object each) are kept; past that only those the
    last batch used, the common ones (so memory stays flat). Packed keys are cheap, so their store
    is large: on cold data a stretch seen chunks ago is then not learned again."""

    def __init__(self, cache: WordCache, texts: Sequence[str | None], byte_lengths: np.ndarray,
                 rules: Boundaries, added_ids: frozenset[int], max_runs: int = 1 << 15, max_packed: int = 3 << 18, *,
                 token_bytes: Sequence[bytes], encode_glued: Callable[[str], list[int] | None] | None = None,
                 decodes_bytes: bool = False, special_glue: SpecialGlue | None = None,
                 cjk_pairs: Callable[[int], PairCheck | None] | None = None,
                 equivalents: Sequence[tuple[int, int, str]] = ()):
        vocab_size = len(byte_lengths)
        self._cache = cache
        self._texts = texts
        self._token_bytes = token_bytes
        self._byte_lengths = byte_lengths
        #: whether the decode of every token is its bytes (invalid UTF-8 replaced): then a decode
        #: that equals a text without U+FFFD says the bytes are the text's
        self._decodes_bytes = decodes_bytes
        #: per id: in the ASCII table (its text is ``texts[id]``)
        self._ascii = np.zeros(vocab_size, dtype=bool)
        self._ascii[np.fromiter(compress(count(), texts[:vocab_size]), np.int64)] = True  # (texts are non-empty)
        self._known = byte_lengths > 0
        # each token's first, second and last character's class (0 outside ASCII, or no token)
        data = np.frombuffer(b"".join(token_bytes[:vocab_size]), np.uint8)
        starts = np.cumsum(byte_lengths) - byte_lengths
        classes = np.zeros(256, dtype=np.int16)
        classes[:128] = rules.class_of()

        def class_at(where: np.ndarray, has: np.ndarray) -> np.ndarray:
            out = np.zeros(vocab_size, np.int16)
            out[has] = classes[data[where[has]]]
            return out

        first = class_at(starts, self._known)
        second = class_at(starts + 1, byte_lengths > 1)
        last = class_at(starts + byte_lengths - 1, self._known)
        if equivalents:
            equivalent_classes(equivalents, classes, data, starts, byte_lengths, first, second, last)
        pairs = np.array(rules.pairs, dtype=bool)
        # per id: the token ends with whitespace; it starts with a space the rules let a fresh
        # pre-token start with after whitespace
        spaces = sorted({int(classes[ord(c)]) for c in ALPHABET if regex.match(r"\s", c)})
        ends_space = np.isin(last, spaces)
        space_first = rules.space_first if rules.space_first is not None else {int(classes[ord(" ")])}
        space_word = np.isin(first, sorted(space_first)) & np.isin(second, sorted(rules.space_then))
        self._added = np.zeros(vocab_size, dtype=bool)
        self._added[list(added_ids)] = True
        #: per id, what :func:`recon.kernel.cut` reads of it
        self._cut_table = cut_table(first, last, self._added, ends_space, space_word)
        self._rules_bytes = pairs.astype(np.uint8).tobytes()
        self._glued = GluedEncoder(cache, token_bytes, byte_lengths, first, last, pairs, classes, rules.glue,
                                   encode_glued, special_glue)
        self._prefixes, self._inside = _prefix_counts(cache, vocab_size)
        #: per id: 1 if the token alone is its own text's encoding, 0 if not, -1 not known yet
        self._single = np.full(vocab_size, -1, dtype=np.int8)
        #: a stretch of 2.._pack tokens packed into one int: ``_bits`` bits per id + 1
        self._bits = max(1, vocab_size.bit_length())
        self._pack = 64 // self._bits
        #: packed stretches known to be their text's encoding (a hash set in C, 8 bytes a slot,
        #: at most 4/5 full: the default cap keeps it within 2^20 slots, 8 MB)
        self._runs = KeySet()
        self._long: set[bytes] = set()  # longer ones, as their ids' int32 bytes
        self.max_runs, self.max_packed = max_runs, max_packed
        #: runs of CJK tokens checked by their pairs (:mod:`recon.tokenizers.fast.cjkruns`), where
        #: the tokenizer's pre-tokenizer allows it
        self.pairs = cjk_pairs(self._bits) if cjk_pairs is not None and 2 * self._bits <= 64 else None

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
        spelled = [k for k, ids in enumerate(guesses) if ids is not None and len(ids)]
        if not spelled:
            return out
        counts = np.fromiter(map(len, (guesses[k] for k in spelled)), np.int64, len(spelled))
        try:
            flat = np.frombuffer(flatten([guesses[k] for k in spelled]), np.int64)
        except (TypeError, OverflowError):  # ids given as something else than lists of ints
            flat = np.fromiter(chain.from_iterable(guesses[k] for k in spelled), np.int64, int(counts.sum()))
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        if len(flat) and 0 <= flat.min() and flat.max() < len(self._byte_lengths):  # (as ids mostly are)
            known, ascii_ = self._known[flat], self._ascii[flat]
        else:  # a decode skips ids it doesn't know
            inside = (flat >= 0) & (flat < len(self._byte_lengths))
            known, ascii_ = np.zeros(len(flat), dtype=bool), np.zeros(len(flat), dtype=bool)
            known[inside], ascii_[inside] = self._known[flat[inside]], self._ascii[flat[inside]]
        ok = self._spelled(texts, guesses, decoded, spelled, np.logical_and.reduceat(known, starts).tolist(),
                           np.logical_and.reduceat(ascii_, starts).tolist())
        if not all(ok):  # only the samples their ids spell go on
            keep = np.array(ok, dtype=bool)
            flat = flat[np.repeat(keep, counts)]
            spelled, counts = list(compress(spelled, ok)), counts[keep]
            if not spelled:
                return out
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        added = self._added[flat]
        extracted = self._added_where_held(texts, spelled, flat, starts, added)
        by_runs = self._by_runs(flat, starts, counts, extracted) if self.pairs is not None else None
        confirmed, fixed = by_runs if by_runs is not None else (None, {})
        if confirmed is not None and confirmed.any():  # those are done; the rest go on as usual
            for s in np.flatnonzero(confirmed).tolist():
                out[spelled[s]] = fixed.get(s) or list(guesses[spelled[s]])
            rest = ~confirmed
            if not rest.any():
                return out
            flat = flat[np.repeat(rest, counts)]
            spelled, counts, extracted = list(compress(spelled, rest.tolist())), counts[rest], extracted[rest]
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        # a stretch starts at each sample's first token, around every added token, and at every
        # boundary the rules make certain; most are known to be their text's encoding, the others
        # (unsettled) are looked up or learned here
        at, size, sample, keys, kind, first = (np.frombuffer(part, np.int64) for part in unsettled(
            flat, starts, self._cut_table, self._rules_bytes, self._bits, self._pack, self._single, self._runs))
        good, tuples = self._settle(flat, at, size, keys.view(np.uint64), kind, first)
        whole = extracted.copy()
        whole[sample[~good]] = False
        for k, ok in zip(spelled, whole.tolist()):
            if ok:
                out[k] = list(guesses[k])
        # a sample whose added tokens are right but some stretch is not its text's encoding:
        # its encoding is the guess with each such stretch encoded (a cut splits the work)
        bad = np.flatnonzero(~good)
        bad = bad[extracted[sample[bad]]]
        if len(bad):
            encoded = self._encode(slices(flat, at[bad], size[bad]))
            spliced: dict[int, list[int]] = {}
            done_to: dict[int, int] = {}  # per sample: how far its guess is copied
            unsure: set[int] = set()  # (a stretch with no encoding: the caller encodes the sample)
            for b, s, ids in zip(bad.tolist(), sample[bad].tolist(), encoded):
                if ids is None:
                    unsure.add(s)
                    continue
                guess, begin = guesses[spelled[s]], int(at[b] - starts[s])
                done = spliced.setdefault(s, [])
                done += guess[done_to.get(s, 0) : begin]
                done += ids
                done_to[s] = begin + int(size[b])
            for s, done in spliced.items():
                if s in unsure:
                    continue
                guess = guesses[spelled[s]]
                out[spelled[s]] = done + list(guess[done_to[s] :])
        self._trim(flat, starts, tuples)
        return out

    def _trim(self, flat: np.ndarray, starts: np.ndarray, tuples: list[bytes]) -> None:
        """A store that is full keeps what this batch used (``flat``, ``starts``: its ids;
        ``tuples``: its longer stretches), nothing if that is over half of it."""
        if len(self._runs) > self.max_packed:
            keys = np.frombuffer(cut(flat, starts, self._cut_table, self._rules_bytes, self._bits, self._pack)[2],
                                 np.uint64)
            keys = keys[keys != 0]  # every packed stretch of the batch
            runs = KeySet()
            runs.add(keys[np.frombuffer(self._runs.find(keys), dtype=bool)])
            self._runs = runs if len(runs) <= self.max_packed // 2 else KeySet()
        if len(self._long) > self.max_runs:
            longs = self._long.intersection(tuples)
            self._long = longs if len(longs) <= self.max_runs // 2 else set()

    def _by_runs(self, flat: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                 extracted: np.ndarray) -> tuple[np.ndarray, dict[int, list[int]]] | None:
        """Per sample: whether its encoding is settled by its runs of CJK tokens' pairs and its
        skeleton (:mod:`recon.tokenizers.fast.cjkruns`); False for a sample with no such run, or
        whose added tokens are not where its ids hold them. And the encoding of each settled
        sample whose ids are not it (a whole run that is a pre-token of its own, with a pair
        that fails, encoded again: a cut splits the work). None where no sample has a run."""
        # samples at least half of whose tokens are outside ASCII (in the others, the runs are
        # short and the usual check on the whole sample costs less than their pairs)
        wide = 2 * np.add.reduceat(~self._ascii[flat], starts) >= counts
        if not wide.any():
            return None
        if not wide.all():  # (only those are looked at)
            flat, counts, extracted = flat[np.repeat(wide, counts)], counts[wide], extracted[wide]
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        found = skeletons(self.pairs, flat, starts, counts, extracted, self._added)
        if found is None:
            return None
        take, skeleton, piece_at, piece_sample, (redo_at, redo_size) = found
        confirmed = np.zeros(len(wide), dtype=bool)
        if not take.any():
            return confirmed, {}
        whole = take.copy()
        if len(piece_at):
            at, size, where, keys, kind, first = (np.frombuffer(part, np.int64) for part in unsettled(
                skeleton, piece_at, self._cut_table, self._rules_bytes, self._bits, self._pack, self._single, self._runs))
            good, tuples = self._settle(skeleton, at, size, keys.view(np.uint64), kind, first)
            self._trim(skeleton, piece_at, tuples)
            whole[piece_sample[where[~good]]] = False
        fixed: dict[int, list[int]] = {}
        if len(redo_at):  # each such run's own encoding, spliced into its sample's ids
            owner = np.searchsorted(starts, redo_at, side="right") - 1
            keep = whole[owner]
            redo_at, redo_size, owner = redo_at[keep], redo_size[keep], owner[keep]
            spliced: dict[int, list[tuple[int, int, list[int]]]] = {}
            for s, at, size, ids in zip(owner.tolist(), (redo_at - starts[owner]).tolist(), redo_size.tolist(),
                                        self._encode(slices(flat, redo_at, redo_size))):
                if ids is None:  # (not encoded: the usual way)
                    whole[s] = False
                spliced.setdefault(s, []).append((at, size, ids))
            index = np.flatnonzero(wide)
            for s, runs in spliced.items():
                if whole[s]:
                    ids = flat[starts[s] : starts[s] + counts[s]].tolist()
                    for at, size, encoded in reversed(runs):  # (in order: from the last, places stay put)
                        ids[at : at + size] = encoded
                    fixed[int(index[s])] = ids
        confirmed[np.flatnonzero(wide)[whole]] = True
        return confirmed, fixed

    def _spelled(self, texts, guesses, decoded, which: list[int], known: list[bool], ascii_: list[bool]) -> list[bool]:
        """Per sample in ``which``: whether its ids spell its text exactly. Ids all in the ASCII
        table: their decode (given, or joined from the table) is the text; else every id a token
        and the ids' bytes the text's UTF-8 (a decode replaces invalid UTF-8, so it can't tell)."""
        join, get = "".join, self._texts.__getitem__
        bjoin, get_bytes = b"".join, self._token_bytes.__getitem__
        ok = []
        for k, is_known, is_ascii in zip(which, known, ascii_):
            text = texts[k]
            if not is_known:
                ok.append(False)
            elif decoded is not None and decoded[k] is not None and (
                    is_ascii or decoded[k] != text or ("\ufffd" not in text and self._decodes_bytes)):
                # a decode replaces invalid UTF-8 with U+FFFD: equal to a text without one, the
                # bytes were valid and are the text's; unequal, the bytes differ too
                ok.append(decoded[k] == text)
            elif is_ascii:
                ok.append(join(map(get, guesses[k])) == text)
            else:
                try:
                    ok.append(bjoin(map(get_bytes, guesses[k])) == text.encode("utf-8"))
                except UnicodeEncodeError:  # a lone surrogate: no ids spell it
                    ok.append(False)
        return ok

    def _added_where_held(self, texts, spelled: list[int], flat, starts, added) -> np.ndarray:
        """Per sample: whether the encoder extracts from its text exactly the added tokens its ids
        hold, at the same offsets (text that spells an added token with ordinary ones, or an added
        token the encoder would not extract, fails)."""
        at = np.flatnonzero(added)
        sample = np.searchsorted(starts, at, side="right") - 1
        # most texts hold an added token's opening characters only inside the added tokens their
        # ids hold: then the encoder extracts exactly those (see _prefix_counts); the rest are
        # extracted as the cache does it, and compared with where the ids hold them
        quick = [False] * len(spelled)
        if self._prefixes is not None:
            inside = np.zeros(len(spelled), dtype=np.int64)
            np.add.at(inside, sample, self._inside[flat[at]])
            found = np.frombuffer(count_in([texts[k] for k in spelled], self._prefixes), np.int64)
            quick = (found == inside).tolist()
        ok = [only_held and not self._cache.bails(texts[k]) for k, only_held in zip(spelled, quick)]
        slow = [s for s, fine in enumerate(ok) if not fine]
        for s, spans in zip(slow, self._held(flat, starts, at, sample, slow)):
            text = texts[spelled[s]]
            ok[s] = _in_bytes(text, self._cache.added_spans(text)) == spans
        return np.array(ok, dtype=bool)

    def _held(self, flat: np.ndarray, starts: np.ndarray, at: np.ndarray, sample: np.ndarray,
              which: list[int]) -> list[list[tuple[int, int]]]:
        """(byte offset, id) of each added token each sample of ``which`` holds (``at``: where the
        batch's added tokens are in ``flat``; ``sample``: whose each is). A few samples one by one
        (most texts take the quick way), many at once over the whole batch."""
        if len(which) > 64:
            lengths = self._byte_lengths[flat]
            ends = np.cumsum(lengths)
            base = np.concatenate(([0], ends))[starts]  # each sample's first byte, laid end to end
            offsets = (ends[at] - lengths[at] - base[sample]).tolist()
            held: list[list[tuple[int, int]]] = [[] for _ in range(len(starts))]
            for s, offset, token_id in zip(sample.tolist(), offsets, flat[at].tolist()):
                held[s].append((offset, token_id))
            return [held[s] for s in which]
        out = []
        for s in which:
            lo, hi = np.searchsorted(sample, [s, s + 1])
            first, mine = int(starts[s]), at[lo:hi] - int(starts[s])
            ids = flat[first : first + int(mine[-1]) + 1] if len(mine) else flat[:0]
            offsets = np.concatenate(([0], np.cumsum(self._byte_lengths[ids])))[mine]
            out.append(list(zip(offsets.tolist(), ids[mine].tolist())))
        return out

    def _settle(self, flat: np.ndarray, at: np.ndarray, size: np.ndarray, keys: np.ndarray, kind: np.ndarray,
                first: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
        """Per unsettled stretch (``size[s]`` tokens from ``flat[at[s]]``, of ``kind[s]`` as
        :func:`recon.kernel.unsettled` lists them, ``keys[s]`` packed where it packs, ``first[s]``
        the row that first lists the same ids): whether it is its own text's encoding; and the
        keys of the longer ones (their ids' bytes). Each distinct stretch is looked up or learned
        once; those not seen before are learned together, in one batch encode."""
        good = np.zeros(len(at), dtype=bool)  # kind 0: a lone token known not to be
        new = first == np.arange(len(at))  # each distinct stretch's first row
        longs = np.flatnonzero(new & (kind == 3))
        tuples = _slices(flat, at[longs], size[longs])
        known = np.fromiter(map(self._long.__contains__, tuples), bool, len(tuples))
        good[longs[known]] = True
        new[longs[known]] = False
        new &= kind >= 1
        learn = np.flatnonzero(new)
        if len(learn):
            good[learn] = self._learn(slices(flat, at[learn], size[learn]))
            lone = learn[kind[learn] == 1]
            self._single[flat[at[lone]]] = good[lone]
            packed = learn[kind[learn] == 2]
            self._runs.add(keys[packed[good[packed]]])
            self._long.update(compress(tuples, (good[longs] & ~known).tolist()))
        return good[first], tuples

    def _learn(self, stretches: list[list[int]]) -> list[bool]:
        """Whether each stretch is the encoding of its own text."""
        return self._glued.matches(stretches)

    def _encode(self, stretches: list[list[int]]) -> list[list[int] | None]:
        """The encoding of each stretch's text (None for one whose bytes are not UTF-8)."""
        return self._glued.encode(stretches)


def _in_bytes(text: str, spans: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
    """(offset, id) spans with their offsets in characters of ``text`` made offsets in its UTF-8 bytes."""
    if not spans or text.isascii():
        return spans
    return [(len(text[:offset].encode("utf-8")), token_id) for offset, token_id in spans]


def _prefix_counts(cache: WordCache, vocab_size: int) -> tuple[list[str] | None, np.ndarray]:
    """The first two characters of every added token's content the cache extracts, and per id
    how often they occur inside its content; (None, ...) where that can't decide anything.

    Why it decides: every added token starts with one of the prefixes. ``str.count`` of a prefix
    that can't overlap itself (two different characters) counts every occurrence, so over a text
    cut into its held added tokens and the ordinary text between, the count is the pieces' counts
    plus the occurrences that straddle two pieces. A text whose count is only what its held added
    tokens hold therefore holds no other added token's start outside them and none across their
    edges. Extraction is leftmost (longest first at a place), so no other added token is
    extracted: one starting inside a held one is passed over with it, and one starting where a
    held one starts and running on past it would have the held one as its prefix (a tokenizer
    with such a pair takes the slow way for every text). Each held one is extracted where it
    stands (its text is there: the ids spell the text). Contents of one character, or a cache
    that extracts none, take the slow way too."""
    inside = np.zeros(vocab_size, dtype=np.int64)
    contents = [c for c in cache.added_contents() if c]
    prefixes = sorted({c[:2] for c in contents})
    if not contents or any(len(p) < 2 or p[0] == p[1] for p in prefixes):
        return None, inside
    if prefixes_of_others(contents):
        return None, inside
    for content in contents:
        for token_id in cache.added_ids(content):
            if token_id < vocab_size:
                inside[token_id] = sum(map(content.count, prefixes))
    return prefixes, inside


def _slices(flat: np.ndarray, first: np.ndarray, size: np.ndarray) -> list[bytes]:
    """Each stretch (``size[s]`` ids from ``flat[first[s]]``) as its ids' int32 bytes: an exact
    key, sliced from one buffer (a tuple of ints per stretch costs several times more)."""
    if not len(first):
        return []
    buf = flat.astype(np.int32).tobytes()
    return list(map(buf.__getitem__, map(slice, (first * 4).tolist(), ((first + size) * 4).tolist())))
