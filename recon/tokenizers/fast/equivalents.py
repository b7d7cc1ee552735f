"""Non-ASCII characters a pre-tokenizer can't tell from an ASCII one, so its boundary rules
hold around them.

Why: :class:`recon.tokenizers.fast.canonical.CanonicalCheck` cuts ids where the boundary rules
(:mod:`recon.tokenizers.fast.pretokenize`, :mod:`recon.tokenizers.fast.derive`) make a fresh
pre-token certain, and the rules are over ASCII: a character outside it has class 0, which never
cuts. In CJK text that leaves a record one long stretch. Where every class and lookahead of the
pattern holds all or none of a set of characters and an ASCII character ``c``, no match can tell
them from ``c``, so every cut the rules make around ``c`` holds around them: they take ``c``'s
class at a token's edges. Which sets may, per pattern, is :data:`EQUIVALENTS` (the tokenizers say
which applies to them).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from recon.tokenizers.fast.cjkruns import H, HANGUL, KANA

#: CJK punctuation (all ``\p{P}``, three bytes in UTF-8), which the patterns that don't name
#: ASCII punctuation apart see as they see ``,``.
PUNCTUATION = "，。、！？：；（）「」『』【】《》〈〉“”‘’…—・"
#: Per pre-tokenizer, the characters its boundary rules may treat as an ASCII one
#: (:func:`equivalent_classes`): for cl100k's, Qwen3.5/3.6's and GPT-2's patterns every letter
#: of the three kinds is ``x`` (a letter no contraction names; the patterns use letters only as
#: ``\p{L}``, with ``\p{M}`` in Qwen's, and in negated classes and ``\S``) and the punctuation
#: ``,``; for Kimi's only the punctuation (its letter classes split by case and Han, which no
#: ASCII letter matches alike; tiktoken's ``\p{Han}`` is the Script property, which none of the
#: punctuation has); for DeepSeek-V4's none (its CJK split holds ``・``, its third names ASCII
#: punctuation).
EQUIVALENTS = {
    "letters": tuple((lo, hi, "x") for lo, hi in H + KANA + HANGUL) + tuple((ord(c), ord(c), ",") for c in PUNCTUATION),
    "punctuation": tuple((ord(c), ord(c), ",") for c in PUNCTUATION),
}


def equivalent_classes(equivalents: Sequence[tuple[int, int, str]], classes: np.ndarray, data: np.ndarray,
                        starts: np.ndarray, lengths: np.ndarray, first: np.ndarray, second: np.ndarray,
                        last: np.ndarray) -> None:
    """Give a token's first, second and last character, where it is a three-byte character of
    one of ``equivalents`` (``(lo, hi, c)``: code points lo..hi), the class of the ASCII character
    ``c``, in place. Sound where the tokenizer's pre-tokenizer can't tell those characters from
    ``c`` (every class and lookahead of its pattern holds all or none of them and ``c``), so
    every cut the rules make around ``c`` holds around them (the tokenizer says where)."""
    of = np.full(1 << 16, -1, np.int16)
    for lo, hi, c in equivalents:
        of[lo : hi + 1] = classes[ord(c)]
    padded = np.concatenate((data, np.zeros(3, np.uint8))).astype(np.int64)

    def at(where: np.ndarray, has: np.ndarray, out: np.ndarray) -> None:
        where = where[has]
        b0, b1, b2 = padded[where], padded[where + 1], padded[where + 2]
        lead = ((b0 & 0xF0) == 0xE0) & ((b1 & 0xC0) == 0x80) & ((b2 & 0xC0) == 0x80)
        cls = np.where(lead, of[((b0 & 0x0F) << 12 | (b1 & 0x3F) << 6 | (b2 & 0x3F)) & 0xFFFF], -1)
        ids = np.flatnonzero(has)
        out[ids[cls >= 0]] = cls[cls >= 0]

    three = lengths >= 3
    at(starts, three, first)
    at(starts + 1, (lengths >= 4) & (data[np.minimum(starts, len(data) - 1)] < 0x80), second)
    at(starts + lengths - 3, three, last)
