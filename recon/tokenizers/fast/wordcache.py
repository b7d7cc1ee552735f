"""Encoding through a cache of words: the tokenizer's own ids, without re-encoding what it has seen.

Why: an audit re-encodes millions of texts made of a few hundred thousand distinct words, and a
batched encode spends most of its time cutting text into pre-tokens and merging bytes it merged
before. BPE never merges across a pre-token boundary, so a text cut at points where every
pre-tokenizer recon knows (GPT-2, cl100k, Qwen, DeepSeek, Kimi, SmolLM2 patterns) always starts a
fresh pre-token encodes as the concatenation of its pieces' encodings. Each distinct piece is
encoded once by the real tokenizer, in a batch; after that it is a dictionary look-up.

The cut points are spaces (U+0020) right after a character that is not whitespace: in none of
those patterns can a match run from a non-whitespace character into a following space (a space
only ever starts a match or continues a run of whitespace), and none looks behind, so matching
starts afresh at such a space whatever came before it. Before that, text is cut
at added tokens exactly as the tokenizer extracts them (HF ``tokenizers``: leftmost-longest,
non-normalized tokens first; tiktoken: specials, with texts where two could compete sent to
the real encoder). Whether a tokenizer qualifies is decided by its structure and then checked
on probe texts against the real encoder; one that does not is encoded the slow way, exactly.

Text of the plain ASCII alphabet is cut finer, into the pre-tokens the tokenizer's own
pre-tokenizer makes (:mod:`recon.tokenizers.fast.pretokenize`): words glued by line ends and indentation are
mostly distinct in code, their pre-tokens are not, so data never seen before still hits.
"""

from __future__ import annotations

import re
from functools import lru_cache
from itertools import accumulate, chain, compress, count, groupby, repeat
from operator import is_
from typing import Callable, Iterable, Mapping, Sequence

from recon.tokenizers.fast.pretokenize import ALPHABET, Cut, plain

#: Missing words encoded together in one glued text (see WordCache._learn).
GLUE = 64

#: Whitespace then a space: those texts take the careful cut.
_SPACE_AFTER_WHITESPACE = re.compile(r"\s ")

#: Texts every word cache must encode exactly as the real encoder before it is used.
PROBES = (
    "Hello world, it's 12345 o'clock.  Two  spaces,\ttab\n\nnew lines \n indented\n    code();",
    "日本語のテキスト と 中文 混合 text, 한국어 문장 ; émigré café naïve e\u0301 \u0301x ½ ² Ⅻ 100,000.5",
    " leading and trailing  ",
    "emoji 🤖🤖 and ZWJ 👩\u200d💻 ; \u00a0nbsp\u00a0 \u2003em\u3000ideographic\u0085nel\x1c\x1f end",
    "x. y? z! 'quoted' \"double\" (paren) [br] {cb} a-b a_b a/b a\\b $5 #1 @me 3.14 -2 +7 1e10",
    "I'm you're we've they'll she'd IT'S DON'T don 't 's  't",
    "\r\nwindows\r\n line \r\n\r\n ends\r \n",
    "def f(x):\n    return x  # comment\n\n\tif x:\n\t\tpass\n",
    "<think> tags </think> and <|im_end|> look-alikes <|endoftext|> <｜end▁of▁sentence｜>",
    "x = f(a, b)  # 1234567 12.5e-3 0x1F\n\n    if y:\n        return 'it''s'  \n\t\r\n  \x0b\x0c end",
    ALPHABET,
    "".join(a + b for a in ALPHABET[::7] for b in ALPHABET),  # every character after a few others
)


def split_words(text: str) -> list[str]:
    """``text`` cut before every space (U+0020) that follows a character which is not whitespace.

    ``"".join(split_words(t)) == t`` always. Python's ``str.isspace`` counts more characters as
    whitespace than the tokenizers' ``\\s`` does, so the test errs towards not cutting."""
    parts = text.split(" ")
    if len(parts) == 1:
        return parts
    if _SPACE_AFTER_WHITESPACE.search(text) is None:  # every space is a cut point
        words = [" " + p for p in parts]
        if parts[0]:
            words[0] = parts[0]
        else:  # a leading space starts the first word
            del words[0]
        return words
    words = [parts[0]]
    for part in parts[1:]:
        prev = words[-1]
        if prev and not prev[-1].isspace():
            words.append(" " + part)
        else:
            words[-1] = prev + " " + part
    return words


@lru_cache(maxsize=8)
def _ints(n: int) -> list[int]:
    """``list(range(n))``: one int object per id, shared by every cached key that holds it."""
    return list(range(n))


def prefixes_of_others(texts) -> list[str]:
    """The texts that begin another of ``texts`` (distinct strings), in sorted order: each is
    checked against the one sorted right after it only (a string that begins another sorts
    before it, and every string between them begins with it too), not against all of them."""
    ordered = sorted(texts)
    return [a for a, b in zip(ordered, ordered[1:]) if b.startswith(a)]


def _alternation(contents: Iterable[str]) -> re.Pattern | None:
    """A capturing pattern that finds the longest of ``contents`` at the leftmost position."""
    ordered = sorted(set(contents), key=lambda s: (-len(s), s))
    return re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None


class WordCache:
    """Batch encoding with a cache of word encodings, for one tokenizer and one ``allow_special``.

    ``encode_texts`` is the native batch encoder; ``lengths[id]`` each token's length in bytes.
    A text is cut into words, and its ids are the concatenation of their cached encodings; the
    words a batch misses are encoded natively first (:meth:`_learn`). ``passes`` are the added
    tokens extracted before pre-tokenization, content -> id, one mapping per extraction pass, in
    order; ``bail`` holds contents that send a text to the native encoder (tokens whose matching
    the cut can't mirror). When the cache holds more than ``max_words``
    keys after a batch it keeps only the keys that batch used, so memory stays bounded (a key
    with its ids takes a few hundred bytes) and the common keys stay.

    With ``cut`` (the tokenizer's own pre-tokenizer, :mod:`recon.tokenizers.fast.pretokenize`) and
    ``encode_pieces`` (the BPE model alone, no pre-tokenizer), text of the plain ASCII alphabet
    is cut into pre-tokens instead of words: far fewer distinct keys in code and data, where a
    "word" runs on over line ends and indentation. Each pre-token is learned from the BPE model,
    exactly what the native encoder runs on it. Keys are then of two kinds that can't be
    confused: a plain key is a pre-token, any other a word."""

    def __init__(
        self,
        encode_texts: Callable[[list[str]], list[list[int]]],
        lengths: Sequence[int],
        passes: Sequence[Mapping[str, int]] = (),
        bail: Iterable[str] = (),
        max_words: int = 1 << 15,
        cut: Cut | None = None,
        encode_pieces: Callable[[list[str]], list[list[int]]] | None = None,
    ):
        self._encode_texts = encode_texts
        self._cut = cut if encode_pieces is not None else None
        self._encode_pieces = encode_pieces
        self._lengths = lengths
        self._passes = [(_alternation(p), {c: [i] for c, i in p.items()}) for p in passes if p]
        self._bail = _alternation(bail)
        self._tokens = {c: ids for _, table in self._passes for c, ids in table.items()}
        self.max_words = max_words
        self.words: dict[str, Sequence[int]] = dict(self._tokens)
        self._ints = _ints(len(lengths))
        self.lookups = 0  #: words looked up so far
        self.misses = 0  #: words learned from a native encode

    def _segments(self, text: str) -> list[str]:
        """The text cut at the added tokens the encoder extracts, pass after pass: the added
        tokens' contents (a segment in ``_tokens`` is one) and the text between them."""
        segments = [text]
        for pattern, _ in self._passes:
            segments = [s for seg in segments for s in (pattern.split(seg) if seg not in self._tokens else [seg])]
        return segments

    def _keys(self, text: str) -> list[str] | None:
        """The text as cache keys: pre-tokens or words, and added tokens' contents (which map to
        their id); None where the cut gives up (the text is encoded natively)."""
        segments = self._segments(text)
        if len(segments) == 1:
            return [text] if text in self._tokens else self._words(text)
        keys: list[str] = []
        for s in segments:
            if s in self._tokens:
                keys.append(s)
            elif s:
                words = self._words(s)
                if words is None:
                    return None
                keys += words
        return keys

    def added_contents(self) -> list[str]:
        """The contents of every added token this cache extracts."""
        return list(self._tokens)

    def added_ids(self, content: str) -> Sequence[int]:
        return self._tokens.get(content, ())

    def bails(self, text: str) -> bool:
        """Whether ``text`` holds an added token's content that sends it to the native encoder."""
        return self._bail is not None and self._bail.search(text) is not None

    def holds_added(self, text: str) -> bool:
        """Whether ``text`` holds the content of an added token this cache extracts or bails on."""
        return any(p.search(text) for p, _ in self._passes) or (self._bail is not None and self._bail.search(text) is not None)

    def added_spans(self, text: str) -> list[tuple[int, int]] | None:
        """(offset, id) of each added token the encoder extracts from ``text``, in order (offsets
        in characters); None if the text holds an added token the cache sends to the native
        encoder."""
        if self._bail is not None and self._bail.search(text):
            return None
        spans, at = [], 0
        for s in self._segments(text):
            if s in self._tokens:
                spans.append((at, self._tokens[s][0]))
            at += len(s)
        return spans

    def _words(self, text: str) -> list[str] | None:
        """Text with no added token in it, cut into keys."""
        cut = self._cut
        if cut is None:
            return split_words(text)
        if plain(text):
            return cut(text)
        # words meet at pre-token boundaries where matching starts afresh, so a run of plain words
        # is cut as one text (and cut alike as word by word); the other words stay whole
        keys: list[str] = []
        for is_plain, words in groupby(split_words(text), key=plain):
            if not is_plain:
                keys += words
                continue
            pieces = cut("".join(words))
            if pieces is None:
                return None
            keys += pieces
        return keys

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        words = self.words
        keyed = [None if self._bail is not None and self._bail.search(text) else self._keys(text) for text in texts]
        # every key of the batch looked up in one pass, and the misses found in another, at C speed
        keys = list(chain.from_iterable(keys for keys in keyed if keys is not None))
        self.lookups += len(keys)
        found = list(map(words.get, keys))
        gaps = list(compress(count(), map(is_, found, repeat(None))))
        if gaps:
            self._learn(sorted(set(map(keys.__getitem__, gaps))))  # sorted: the same order in every process
            for k in gaps:
                found[k] = words[keys[k]]
        out: list[list[int] | None] = []
        at = 0
        for text_keys in keyed:
            if text_keys is None:
                out.append(None)
            else:
                out.append(list(chain.from_iterable(found[at : at + len(text_keys)])))
                at += len(text_keys)
        if len(words) > self.max_words:  # full: keep what this batch used (the common keys), drop the rest
            used = set(keys)
            kept = {w: words[w] for w in used} if len(used) <= self.max_words // 2 else {}
            words.clear()
            words.update(self._tokens)
            words.update(kept)
        slow = [k for k, keys in enumerate(keyed) if keys is None]
        if slow:
            for k, ids in zip(slow, self._encode_texts([texts[k] for k in slow])):
                out[k] = ids
        return out  # type: ignore[return-value]

    def _learn(self, missing: list[str]) -> None:
        """Encode the keys natively and cache them: pre-tokens through the BPE model, in one batch;
        words through the whole encoder.

        A word that starts with a space and ends with a character that is not whitespace (most
        of them) can follow another such word without changing either's encoding: that is the
        cut this cache relies on. So those are glued into a few long texts, encoded together
        and cut back apart at their byte boundaries; one input per word would cost more in
        per-input overhead than in BPE. A glued text that holds an added token's content, or
        whose ids don't cut at its words' boundaries, is encoded word by word instead."""
        self.misses += len(missing)
        if self._cut is not None:
            is_piece = list(map(plain, missing))
            pieces = list(compress(missing, is_piece))
            if pieces:
                self._store(zip(pieces, self._encode_pieces(pieces)))
                missing = [w for w, piece in zip(missing, is_piece) if not piece]
        glueable: list[str] = []
        alone: list[str] = []
        for w in missing:
            (glueable if w[:1] == " " and not w[-1].isspace() and len(w) > 1 else alone).append(w)
        groups = [glueable[i : i + GLUE] for i in range(0, len(glueable), GLUE)]
        texts = ["".join(group) for group in groups]
        special = [p for p, _ in self._passes] + ([self._bail] if self._bail is not None else [])
        for group, text in zip(groups, texts):
            if any(p.search(text) for p in special):  # an added token's text where two words meet
                alone += group
                group.clear()
        encoded = self._encode_texts([t for g, t in zip(groups, texts) if g] + alone)
        for group, ids in zip([g for g in groups if g], encoded):
            shares = self._cut_ids(group, ids)
            if shares is None:  # not cut where the words meet: learn them one by one
                shares = list(zip(group, self._encode_texts(group)))
            self._store(shares)
        self._store(zip(alone, encoded[len(encoded) - len(alone):]))

    def _store(self, learned: Iterable[tuple[str, list[int]]]) -> None:
        """Cache keys' ids as tuples of shared int objects: each id above 256 would otherwise be
        an object of its own in every key (a cached key then takes ~150 bytes, not ~250)."""
        ints = self._ints
        self.words.update((key, tuple(map(ints.__getitem__, ids))) for key, ids in learned)

    def _cut_ids(self, words: list[str], ids: list[int]) -> list[tuple[str, list[int]]] | None:
        """``ids`` (the encoding of ``words`` joined) cut into each word's share, or None if a word
        boundary falls inside a token."""
        token_at = dict(zip(accumulate(map(self._lengths.__getitem__, ids)), range(1, len(ids) + 1)))
        stops = list(map(token_at.get, accumulate(map(len, map(str.encode, words)))))
        if None in stops:
            return None
        return list(zip(words, map(ids.__getitem__, map(slice, [0, *stops[:-1]], stops))))

    def agrees(self, texts: Sequence[str] = PROBES) -> bool:
        """Whether this cache encodes ``texts``, their tails and texts glued from their words in
        another order as the native encoder does, from words it learned in other texts."""
        tails = [t[i:] for t in texts for i in (len(t) // 3, len(t) // 2)]
        self.encode_batch(list(texts) + tails)  # learn
        words = [w for t in texts for w in (self._keys(t) or [t])]
        shuffled = ["".join(words[i::k]) for k in (3, 5, 7) for i in range(k)]  # words next to new neighbours
        probes = list(texts) + tails + shuffled
        self.encode_batch(shuffled)  # learn what the new neighbours' own words are, if any are new
        return self.encode_batch(probes) == self._encode_texts(probes)
