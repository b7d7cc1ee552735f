"""Text cut into pre-tokens as the tokenizer's own pre-tokenizer cuts it, for plain ASCII text.

Why: BPE never merges across a pre-token, so a text's ids are its pre-tokens' ids end to end, and
real text is made of few distinct pre-tokens (code repeats ``self``, ``    ``, ``(``, ``):``...)
even when no two texts share a line. :class:`recon.tokenizers.fast.wordcache.WordCache` keys its cache on them.

The cut is the tokenizer's own, replayed with Python's ``re``: the regex of every ``Split``
step of a ``tokenizers`` pre-tokenizer, ``Digits``, the GPT-2 regex of ``ByteLevel``, or a
tiktoken family's pattern, applied in the same order with the same behaviour. It is used only on
text made of :data:`ALPHABET`: on those characters the classes the patterns use (``\\p{L}``,
``\\p{N}``, ``\\s``, ``\\p{P}``...) are the same in every Unicode version and in every engine
involved (onig in ``tokenizers``, fancy-regex in tiktoken, ``regex`` here), so the matches are
the same; other text keeps the word cache's coarser, pattern-independent cut. A pre-tokenizer
with a step not listed here is not replayed (:func:`for_huggingface` returns None), and the word
cache is checked against the native encoder before use either way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

import regex

#: ASCII. The one class on which engines differ here is Python's own ``\s`` (``str.isspace``
#: counts U+001C..U+001F); ``re`` patterns below get explicit classes, so it never decides.
ALPHABET = "".join(map(chr, range(128)))

#: The regex ``tokenizers``' ByteLevel pre-tokenizer uses when ``use_regex`` is set (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: Cuts one text into pieces; None where it can't be sure (the caller encodes that text natively).
Cut = Callable[[str], "list[str] | None"]


def plain(text: str) -> bool:
    """Whether ``text`` is made of :data:`ALPHABET` only (the text this module cuts); O(1): a str
    knows whether it is ASCII."""
    return text.isascii()


def _anchored(pattern: str) -> bool:
    """Whether ``pattern`` has ``^`` or ``$`` outside a character class (their meaning differs
    between engines: onig's ``$`` ends a line, Python's also matches before a final newline)."""
    depth, escaped = 0, False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "[":
            depth += 1
        elif ch == "]" and depth:
            depth -= 1
        elif ch in "^$" and not depth:
            return True
    return False


def _compile(pattern: str) -> regex.Pattern:
    # `&&` (class intersection, Kimi's pattern) needs the module's version 1 syntax
    return regex.compile(pattern, regex.V1 if "&&" in pattern else regex.V0)


def _class_end(pattern: str, start: int, nested: bool) -> int:
    """The index just past the character class that opens at ``pattern[start]``."""
    k = start + 1
    if k < len(pattern) and pattern[k] == "^":
        k += 1
    if k < len(pattern) and pattern[k] == "]":  # a ']' first in a class is a literal
        k += 1
    depth = 1
    while k < len(pattern):
        ch = pattern[k]
        if ch == "\\":
            k += 2
            continue
        if ch == "[" and nested:
            depth += 1
        elif ch == "]":
            depth -= 1
            if not depth:
                return k + 1
        k += 1
    raise ValueError("unterminated character class")


def _escape_end(pattern: str, start: int) -> int:
    """The index just past the escape at ``pattern[start]`` (a backslash)."""
    if pattern[start + 1 : start + 2] in ("p", "P"):
        return pattern.index("}", start) + 1 if pattern[start + 2 : start + 3] == "{" else start + 3
    return start + 2


def ascii_pattern(pattern: str) -> re.Pattern | None:
    """``pattern`` for Python's faster ``re``, exact on :data:`ALPHABET` text: every character class
    and class escape (``[^\\s\\p{L}]``, ``\\p{N}``, ``\\s``...) becomes the list of the alphabet's
    characters ``regex`` says it holds; the rest (literals, groups, quantifiers, look-arounds) is
    kept. None where ``re`` can't take the result or it doesn't find what ``regex`` finds on
    probe text."""
    original = _compile(pattern)
    nested = "&&" in pattern
    out, k = [], 0
    try:
        while k < len(pattern):
            ch = pattern[k]
            if ch == "[":
                end = _class_end(pattern, k, nested)
            elif ch == "\\" and pattern[k + 1 : k + 2] in tuple("pPsSdDwW"):
                end = _escape_end(pattern, k)
            else:
                end = k + 2 if ch == "\\" else k + 1
                out.append(pattern[k:end])
                k = end
                continue
            test = _compile(pattern[k:end]).fullmatch
            members = [c for c in ALPHABET if test(c)]
            out.append("[" + "".join(map(re.escape, members)) + "]" if members else "(?!)")
            k = end
        fast = re.compile("".join(out))
    except (re.error, regex.error, ValueError):
        return None
    probes = [ALPHABET, ALPHABET[::-1], *(c + ALPHABET + c + c + " " + c for c in ALPHABET)]
    return fast if all(fast.findall(t) == original.findall(t) for t in probes) else None


def isolated(pattern: str, *, keep_gaps: bool = True) -> Cut:
    """Every match of ``pattern`` is a piece, and so is the text between matches
    (``tokenizers``' ``Split`` with behaviour ``Isolated``). ``keep_gaps=False``: text between
    matches is a reason to give up (tiktoken drops such text; this cut doesn't guess)."""
    compiled = ascii_pattern(pattern) or _compile(pattern)
    findall, finditer = compiled.findall, compiled.finditer

    def with_gaps(text: str) -> list[str] | None:
        pieces, at = [], 0
        for m in finditer(text):
            if m.start() > at:
                if not keep_gaps:
                    return None
                pieces.append(text[at : m.start()])
            if m.end() > m.start():
                pieces.append(m.group())
            at = m.end()
        if at < len(text):
            if not keep_gaps:
                return None
            pieces.append(text[at:])
        return pieces

    if compiled.groups:  # findall would return the groups, not the matches
        return with_gaps

    def cut(text: str) -> list[str] | None:
        pieces = findall(text)
        if sum(map(len, pieces)) == len(text):  # matches in order, none empty or missing: they cover the text
            return pieces if "" not in pieces else [p for p in pieces if p]
        return with_gaps(text)

    return cut


def sequence(steps: list[Cut]) -> Cut:
    """Each step applied to every piece the step before made (``tokenizers``' ``Sequence``)."""
    if len(steps) == 1:
        return steps[0]

    def cut(text: str) -> list[str] | None:
        pieces = [text]
        for step in steps:
            out: list[str] = []
            for piece in pieces:
                got = step(piece)
                if got is None:
                    return None
                out += got
            pieces = out
        return pieces

    return cut


#: ``Digits(individual_digits=True)`` then ByteLevel's regex, as one pass over ASCII text: a digit
#: is a piece of its own, no other piece holds a digit, and a whitespace run may end before a
#: digit (the end of the stretch the Digits step left, where GPT-2's ``(?!\S)`` holds).
DIGITS_THEN_GPT2 = r"""[0-9]|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s0-9])|\s+"""


def _hf_patterns(state: dict) -> list[str] | None:
    """The patterns of a ``tokenizers`` pre-tokenizer's steps, each applied Isolated, in order."""
    kind = state.get("type")
    if kind == "Sequence":
        patterns: list[str] = []
        for child in state.get("pretokenizers", []):
            got = _hf_patterns(child)
            if got is None:
                return None
            patterns += got
        return patterns
    if kind == "Split":
        pattern = state.get("pattern", {})
        if state.get("behavior") != "Isolated" or state.get("invert"):
            return None
        if "String" in pattern:
            return [regex.escape(pattern["String"])]
        if "Regex" in pattern and not _anchored(pattern["Regex"]):
            return [pattern["Regex"]]
        return None
    if kind == "Digits":  # on ASCII text `char::is_numeric` is [0-9]
        return ["[0-9]" if state.get("individual_digits") else "[0-9]+"]
    if kind == "ByteLevel":
        if state.get("add_prefix_space"):
            return None
        return [GPT2_PATTERN] if state.get("use_regex", True) else []
    return None


def for_huggingface(core, idle: Callable[[str], bool] | None = None) -> Cut | None:
    """The cut of a ``tokenizers.Tokenizer``'s pre-tokenizer, or None if it has a step this module
    doesn't replay (or none at all). ``idle(pattern)``: True for a step that can match nothing in
    ASCII text (DeepSeek's CJK runs), left out: the cut only ever sees ASCII text."""
    if core.pre_tokenizer is None:
        return None
    try:
        patterns = _hf_patterns(json.loads(core.pre_tokenizer.__getstate__()))
        if not patterns:
            return None
        if idle is not None:
            patterns = [p for p in patterns if not idle(p)] or [r"(?s:.)+"]  # (all idle: the text whole)
        if patterns[:2] == ["[0-9]", GPT2_PATTERN]:  # SmolLM2's, and many more: one pass instead of two
            patterns[:2] = [DIGITS_THEN_GPT2]
        return sequence([isolated(p) for p in patterns])
    except (regex.error, ValueError, TypeError, AttributeError):
        return None


def for_tiktoken(pattern: str) -> Cut | None:
    """The cut of a tiktoken pattern: its matches (text no match covers sends the text natively)."""
    if _anchored(pattern.replace(r"\s++$", "")):
        return None
    # cl100k's `\s++$`: a whitespace run that ends the text; Python's `$` would also match before a
    # final newline, `\Z` only at the very end, as fancy-regex's `$` does
    try:
        return isolated(pattern.replace(r"\s++$", r"\s++\Z"), keep_gaps=False)
    except regex.error:
        return None


# -- boundaries between two tokens ----------------------------------------------------------------
#: Classes of ASCII characters for :func:`boundary_rules` (0: a character outside them, or none).
LETTER, DIGIT, SPACE, OTHER_SPACE, APOSTROPHE, OTHER = range(1, 7)
CLASSES = 7


def ascii_classes() -> list[int]:
    """The class of each ASCII character as the patterns see it (``regex``'s ``\\p{L}``,
    ``\\p{N}`` and ``\\s``, which agree with the native engines on ASCII: see the module)."""
    out = []
    for ch in ALPHABET:
        if regex.match(r"\p{L}", ch):
            out.append(LETTER)
        elif regex.match(r"\p{N}", ch):
            out.append(DIGIT)
        elif ch == " ":
            out.append(SPACE)
        elif regex.match(r"\s", ch):
            out.append(OTHER_SPACE)
        elif ch == "'":
            out.append(APOSTROPHE)
        else:
            out.append(OTHER)
    return out


@dataclass(frozen=True)
class Boundaries:
    """Where a pre-tokenizer always starts a fresh pre-token between two ASCII characters, and
    pre-tokenizes the text on either side as it would alone, whatever surrounds them."""

    #: ``pairs[x][y]``: between a character of class x and one of class y (:data:`CLASSES`)
    pairs: list[list[bool]]
    #: after whitespace, before a token that starts with a character of a ``space_first`` class
    #: (None: the space's) followed by one of a ``space_then`` class
    space_then: frozenset[int] = frozenset()
    space_first: frozenset[int] | None = None
    #: a character with a cut on both sides whatever surrounds it, or None
    glue: str | None = None
    #: the class of each ASCII character, where the table is not over :func:`ascii_classes`'
    #: (:mod:`recon.tokenizers.fast.derive` gives every character a class of its own)
    classes: tuple[int, ...] | None = None

    def class_of(self) -> list[int]:
        """The class of each ASCII character, as ``pairs`` is indexed."""
        return list(self.classes) if self.classes is not None else ascii_classes()


def _digits_then_gpt2() -> Boundaries:
    r"""Where ``Digits(individual_digits=True)`` then GPT-2's regex always starts a fresh pre-token.

    Between characters x and y, whatever text surrounds them, when:

    * x or y is a digit: the Digits step cuts around every digit before the regex runs;
    * x is a letter and y is not: no match runs from a letter into anything but a letter;
    * x is punctuation other than ``'`` and y a letter (`` ?[^\s\p{L}\p{N}]+`` stops there;
      after ``'`` a contraction may follow);
    * x is not whitespace and y is: only whitespace matches hold whitespace after their start;
    * x is whitespace, y a space and the character after y a letter or punctuation: the run of
      whitespace gives its last space back to the word (``\s+(?!\S)``), and alone, at the end
      of a text, the run is matched whole: the same pre-tokens.

    And the matching of the text before the cut is the same with or without the text after: a
    match that ends at x is a letter, digit, punctuation or contraction match, none of which looks
    ahead, or the whitespace run of the last rule. Other cuts after whitespace depend on what
    follows the run, so they are never made."""
    pairs = [[False] * CLASSES for _ in range(CLASSES)]
    known = range(1, CLASSES)
    for x in known:
        for y in known:
            pairs[x][y] = (
                DIGIT in (x, y)
                or (x == LETTER and y != LETTER)
                or (x == OTHER and y == LETTER)
                or (x not in (SPACE, OTHER_SPACE) and y in (SPACE, OTHER_SPACE))
            )
    return Boundaries(pairs, frozenset({LETTER, APOSTROPHE, OTHER}), glue="0")


def split_patterns(core) -> list[str] | None:
    """The patterns of a ``tokenizers`` pre-tokenizer made only of Isolated ``Split`` steps (and a
    ``ByteLevel`` that splits nothing), in order; None for any other (DeepSeek's is one such)."""
    try:
        state = json.loads(core.pre_tokenizer.__getstate__()) if core.pre_tokenizer is not None else None
    except (ValueError, TypeError, AttributeError):
        return None
    steps = state.get("pretokenizers", []) if isinstance(state, dict) and state.get("type") == "Sequence" else [state]
    for step in steps:
        if not isinstance(step, dict) or not (step.get("type") == "Split" or (
                step.get("type") == "ByteLevel" and step.get("use_regex") is False)):
            return None
    return _hf_patterns(state) or None


def boundary_rules(core) -> Boundaries | None:
    """The :class:`Boundaries` of a ``tokenizers.Tokenizer``'s pre-tokenizer, or None for one with
    no rules here (only ``Digits`` then GPT-2's ``ByteLevel``, SmolLM2's, so far: derived by hand
    and checked against the native pre-tokenizer by the tests; the tiktoken families' rules are
    derived from their patterns, :mod:`recon.tokenizers.fast.derive`)."""
    if core.pre_tokenizer is None:
        return None
    try:
        patterns = _hf_patterns(json.loads(core.pre_tokenizer.__getstate__()))
    except (ValueError, TypeError, AttributeError):
        return None
    return _digits_then_gpt2() if patterns == ["[0-9]", GPT2_PATTERN] else None
