"""Many stretches of ids encoded in one native call, glued together where the rules cut.

Why a module of its own: :class:`recon.tokenizers.fast.canonical.CanonicalCheck` learns each
stretch it has not seen by encoding its text, and on cold data a chunk holds tens of thousands
of them. One native call per stretch would cost more in per-call overhead than in BPE, so the
texts are glued into long texts with a character the pre-tokenizer cuts around where each two
meet (the boundary rules say which), encoded at once, and cut back apart at the glue, which is
checked to be a token of its own at every place it was put.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Callable, NamedTuple, Sequence

import numpy as np

from recon.kernel import join_each, unglue_check
from recon.tokenizers.fast.pretokenize import ALPHABET
from recon.tokenizers.fast.wordcache import WordCache


class SpecialGlue(NamedTuple):
    """An added token to glue stretches with, where the encoder splits its input at added tokens
    before anything else (tiktoken does): the text between two is encoded as if alone, whatever
    characters meet the glue, so stretches no glue character fits (a CJK character at an edge,
    say) still go many to a call. ``encode``: the encoder with every added token extracted;
    ``accepts``: whether a stretch's text may go (a family that normalizes: its NFC), or None."""

    text: str
    id: int
    encode: Callable[[str], list[int]]
    accepts: Callable[[str], bool] | None = None


class GluedEncoder:
    """Encodes stretches of ids (their texts) for one tokenizer. ``first``/``last``: each id's
    first and last character class; ``pairs``: the boundary rules over those classes;
    ``classes``: the class of each byte; ``preferred``: a glue character to try first (the
    rules' own); ``encode_glued``: the native encoding of one text, or None where it can't
    vouch for it (then each stretch goes through the word ``cache``); without it the word cache
    encodes the glued texts too. ``special``, where given, glues the stretches no glue character
    fits with an added token (:class:`SpecialGlue`)."""

    def __init__(self, cache: WordCache, token_bytes: Sequence[bytes], byte_lengths: np.ndarray, first: np.ndarray,
                 last: np.ndarray, pairs: np.ndarray, classes: np.ndarray, preferred: str | None,
                 encode_glued: Callable[[str], list[int] | None] | None, special: SpecialGlue | None = None):
        self._cache, self._token_bytes, self._byte_lengths = cache, token_bytes, np.ascontiguousarray(byte_lengths, np.int64)
        self._special = special
        # the kernel's join takes a list: the tokenizer's own, not a copy, where it is one
        self._table = token_bytes if type(token_bytes) is list else list(token_bytes)
        self._first, self._last, self._pairs = first, last, pairs
        self._native = encode_glued
        self._encode_glued = encode_glued or (lambda text: cache.encode_batch([text])[0])
        self.glues = self._glue_characters(preferred, classes)

    def _glue_characters(self, preferred: str | None, classes: np.ndarray) -> list[tuple[bytes, int, np.ndarray, np.ndarray]]:
        """ASCII characters that glue stretches together, best first: (its byte, its id, the
        classes a stretch may end with before it, those it may start with after it). A glue
        character g fits between two stretches when the rules cut between the first's last
        character and g and between g and the second's first character: then the glued text's
        pre-tokens are the first's, g alone, and the second's. Only characters that are one token
        of their own are taken."""
        pairs = self._pairs
        found = []
        for char in dict.fromkeys(([preferred] if preferred else []) + list(ALPHABET)):
            c = int(classes[ord(char)])
            before, after = pairs[:, c].copy(), pairs[c, :].copy()
            if before.sum() + after.sum() == 0:
                continue
            found.append((-(int(before.sum()) + int(after.sum())), char, before, after))
        found.sort(key=lambda f: f[0])
        glues = []
        for _, char, before, after in found[:8]:
            ids = self._cache.encode_batch([char])[0]
            if len(ids) == 1 and self._token_bytes[ids[0]] == char.encode():
                glues.append((char.encode(), ids[0], before, after))
            if len(glues) == 3:
                break
        return glues

    def encode(self, stretches: list[list[int]]) -> list[list[int] | None]:
        """The encoding of each stretch's text (None for one whose bytes are not UTF-8)."""
        return self._run(stretches, False)

    def matches(self, stretches: list[list[int]]) -> list[bool]:
        """Whether each stretch is the encoding of its own text: :meth:`encode`'s work, but the
        glued encodings are held against the stretches where they lie
        (:func:`recon.kernel.unglue_check`), not cut into a list per stretch."""
        return [bool(same) for same in self._run(stretches, True)]

    def _run(self, stretches: list[list[int]], check: bool) -> list:
        """Each stretch's encoding, or with ``check`` whether it is the stretch (None / False for
        one whose bytes are not UTF-8).

        The texts are encoded many at a time, glued with a character the rules cut around
        where the two stretches meet (:meth:`_glue_characters`; a digit, mostly): one native
        call instead of one per stretch, whose per-call overhead would cost more than the BPE.
        The encoding comes apart at the glue when each glue character is a token of its own at
        its place (else, say where an added token's text spans the glue, or where the glued text
        is not one the encoder vouches for, the stretches are encoded one by one)."""
        table, get = self._table, self._token_bytes.__getitem__
        data = join_each(stretches, table, False)
        if None in data:  # (ids the table can't join: the tokenizer's own bytes, or its error)
            data = [d if d is not None else b"".join(map(get, ids)) for d, ids in zip(data, stretches)]
        out: list[list[int] | None] = [None] * len(stretches)
        if self.glues and len(stretches) > 1:
            firsts = self._first[np.fromiter(map(itemgetter(0), stretches), np.int64, len(stretches))]
            lasts = self._last[np.fromiter(map(itemgetter(-1), stretches), np.int64, len(stretches))]
            sizes = np.fromiter(map(len, data), np.int64, len(data)) + 1  # (each with its glue)
            todo = np.ones(len(stretches), dtype=bool)
            for glue, glue_id, before, after in self.glues:
                fits = np.flatnonzero(todo & before[lasts] & after[firsts])
                todo[fits] = False
                for group in _groups(fits, sizes):
                    want = [stretches[i] for i in group] if check else None
                    for i, ids in zip(group, self._glued(glue, glue_id, [data[i] for i in group], want=want)):
                        out[i] = ids
            special = self._special
            if special is not None and todo.sum() > 1:  # the rest, glued with an added token
                left = np.flatnonzero(todo)
                if special.accepts is not None:
                    accepts = special.accepts
                    left = left[[data[i].isascii() or accepts(data[i].decode("utf-8", "replace")) for i in left.tolist()]]
                sizes[left] += len(special.text.encode()) - 1
                for group in _groups(left, sizes):
                    want = [stretches[i] for i in group] if check else None
                    for i, ids in zip(group, self._glued(special.text.encode(), special.id, [data[i] for i in group],
                                                         special.encode, want)):
                        out[i] = ids
        # the rest one by one: natively where it vouches (a native call costs a few µs; the
        # word cache's Python pre-tokenizer several times that), else through the word cache
        alone, texts, native = [], [], self._native
        for i, ids in enumerate(out):
            if ids is None:
                try:
                    text = data[i].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if native is None or (ids := native(text)) is None:
                    texts.append(text)
                    alone.append(i)
                else:
                    out[i] = ids == stretches[i] if check else ids
        for i, ids in zip(alone, self._cache.encode_batch(texts)):
            out[i] = ids == stretches[i] if check else ids
        return out

    def _glued(self, glue: bytes, glue_id: int, data: list[bytes], encode: Callable[[str], list[int] | None] | None = None,
               want: list[list[int]] | None = None) -> list:
        """The encodings of the texts ``data`` spell, from one encode of them glued with ``glue``
        (the rules cut around it at every place it is put, or an added token the encoder
        extracts first); Nones where that can't be done. With ``want`` (the stretches ``data``
        spells): whether each is its encoding, as 0/1 (bytes), or Nones."""
        try:
            text = glue.join(data).decode("utf-8")
        except UnicodeDecodeError:
            return [None] * len(data)
        ids = (encode or self._encode_glued)(text)
        if ids is None:
            return [None] * len(data)
        if want is not None:
            same = unglue_check(ids, want, self._byte_lengths, glue_id, len(glue))
            return same if same is not None else [None] * len(data)
        encoded = self.unglue(ids, data, glue_id, len(glue))
        return encoded if encoded is not None else [None] * len(data)

    def unglue(self, ids: list[int], data: list[bytes], glue_id: int, glue_size: int = 1) -> list[list[int]] | None:
        """The encoding of the texts glued (a glue of ``glue_size`` bytes between two) cut back
        into each text's, or None where a glue is not a token of its own at its place."""
        if len(data) == 1:
            return [ids]
        held = np.array(ids, dtype=np.int64)
        lengths = self._byte_lengths[held]
        starts = np.cumsum(lengths) - lengths
        sizes = np.fromiter(map(len, data), np.int64, len(data))
        places = np.cumsum(sizes[:-1] + glue_size) - glue_size  # where each glue starts, in bytes
        at = np.searchsorted(starts, places)
        if (at >= len(ids)).any() or \
                not ((starts[at] == places) & (lengths[at] == glue_size) & (held[at] == glue_id)).all():
            return None
        bounds = [-1, *at.tolist(), len(ids)]
        return [ids[a + 1 : b] for a, b in zip(bounds[:-1], bounds[1:])]


#: bytes of stretches glued into one text at most (past that, a new text)
GLUED_BYTES = 1 << 16


def _groups(which: np.ndarray, sizes: np.ndarray) -> list[list[int]]:
    """``which`` cut into runs of about :data:`GLUED_BYTES` of data each (``sizes[i]``: item i's
    bytes): a run starts where the bytes before it cross a multiple of it."""
    if not len(which):
        return []
    ends = np.cumsum(sizes[which])
    block = (ends - sizes[which]) // GLUED_BYTES  # (each item's first byte, in blocks)
    cuts = np.flatnonzero(block[1:] != block[:-1]) + 1
    return [part.tolist() for part in np.split(which, cuts)]
