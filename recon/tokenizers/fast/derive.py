"""Boundary rules derived from a pre-tokenizer pattern itself, not written by hand.

Why this module exists: :class:`recon.tokenizers.fast.canonical.CanonicalCheck` needs, for a
pattern, the pairs of characters (x, y) between which the pattern always starts a fresh match
and matches the text on either side as it would alone, whatever surrounds them. Hand-written
tables (``pretokenize._digits_then_gpt2``) don't scale to the tiktoken families (cl100k, Qwen,
Kimi/o200k), whose patterns have optional prefixes, case-split letter runs, possessive
quantifiers, ``(?!\\S)`` and ``$``. Here the rules are read off the pattern's structure.

The argument (one per pattern, mechanical). The pattern is parsed into atoms (character classes,
each evaluated on every character of the alphabet with ``regex``), zero-width assertions
(``(?!X)``/``(?=X)`` with X one class, ``$``/``\\Z``) and their Glushkov *follow* relation: which
atom or assertion may be tried right after which (counted repeats ``{m,n}`` over-approximated by
loops, possessive and lazy marks ignored: both only prune the engine's search). Take any text
``u + r`` where ``u`` (non-empty) ends with x and ``r`` starts with y. A match that starts inside
``u`` is the engine's first success over a search tree whose every step tests one character or
one assertion; the only steps that can tell ``u + r`` from ``u`` alone are those at the position
``len(u)``, and any such step follows an atom that consumed x. So if every atom that may follow
an atom accepting x rejects y (fails there as it fails at the end of ``u``), every lookahead that
may be tried there rejects y in its one class (so it fails inside as at the end), and no ``$``
may be tried there, the search trees are identical and so is the match, for every start inside
``u``. With no lookbehind, ``^`` or ``\\b`` (refused), matches that start at ``len(u)`` or later
depend on ``r`` only, and with a match at every position (checked: every character of the
alphabet is matched alone by an alternative whose other parts are optional, no assertion in it,
and the pattern matches nothing empty), the pre-tokens of ``u + r`` are those of ``u`` then
those of ``r``. That is the :class:`~recon.tokenizers.fast.pretokenize.Boundaries` contract.

It is sufficient, not necessary: cuts that hold for a subtler reason (cl100k's cut after a line
end, which ``\\s++$`` would match alone, or the whitespace-run-gives-back-its-space cut) are not
made here. The tests check every derived cut against the native pre-tokenizer in many contexts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import regex

from recon.tokenizers.fast.pretokenize import ALPHABET, Boundaries, _class_end


class Refused(ValueError):
    """The pattern uses something this derivation doesn't model (no rules for it)."""


@dataclass(eq=False)
class Pos:
    """One position of the pattern: an atom (``members``: the alphabet's characters it accepts),
    a lookahead (``members`` of its one class) or the end anchor."""

    kind: str  # "atom" | "ahead" | "end"
    members: frozenset[str] = frozenset()
    follow: set = field(default_factory=set)


@dataclass
class Node:
    first: set
    last: set
    nullable: bool
    positions: list
    #: whether it can match without consuming a character (an assertion can)
    zero: bool = False
    #: for the coverage check: one Repeat/Atom over a single atom, with its minimum
    single: "tuple[Pos, int] | None" = None


class _Parser:
    def __init__(self, pattern: str, alphabet: str):
        self.p, self.k, self.alphabet = pattern, 0, alphabet
        self.nested = "&&" in pattern
        self.flags = regex.V1 if self.nested else regex.V0

    def members(self, source: str, ci: bool) -> frozenset[str]:
        test = regex.compile(("(?i:%s)" if ci else "(?:%s)") % source, self.flags).fullmatch
        return frozenset(c for c in self.alphabet if test(c))

    def alternation(self, ci: bool) -> list[Node]:
        alts = [self.sequence(ci)]
        while self.k < len(self.p) and self.p[self.k] == "|":
            self.k += 1
            alts.append(self.sequence(ci))
        return alts

    def sequence(self, ci: bool) -> Node:
        items = []
        while self.k < len(self.p) and self.p[self.k] not in "|)":
            items.append(self.quantified(self.item(ci)))
        return cat(items)

    def item(self, ci: bool) -> Node:
        p, k = self.p, self.k
        ch = p[k]
        if ch == "(":
            head = next((h for h in ("(?:", "(?i:", "(?!", "(?=") if p.startswith(h, k)), None)
            if head is None and p.startswith("(?", k):
                raise Refused(f"group {p[k:k + 4]!r}")
            self.k = k + len(head or "(")
            inner = self.alternation(ci or head == "(?i:")
            if self.k >= len(p) or p[self.k] != ")":
                raise Refused("unbalanced group")
            self.k += 1
            if head in ("(?!", "(?="):
                if len(inner) != 1 or inner[0].single is None or inner[0].single[1] != 1 or \
                        len(inner[0].positions) != 1:
                    raise Refused("a lookahead of more than one character class")
                return assertion(Pos("ahead", inner[0].single[0].members))
            return alt(inner)
        if ch == "[":
            end = _class_end(p, k, self.nested)
        elif ch == "\\":
            nxt = p[k + 1 : k + 2]
            if nxt in ("Z", "z"):
                self.k = k + 2
                return assertion(Pos("end"))
            if nxt in ("p", "P"):
                end = p.index("}", k) + 1 if p[k + 2 : k + 3] == "{" else k + 3
            elif nxt.isalnum() and nxt not in "sSdDwWrntfv":
                raise Refused(f"escape \\{nxt}")
            else:
                end = k + 2
        elif ch == "$":
            self.k = k + 1
            return assertion(Pos("end"))
        elif ch in "^*+?{":
            raise Refused(f"{ch!r} here")
        else:
            end = k + 1
        self.k = end
        return atom(Pos("atom", self.members(p[k:end], ci)))

    def quantified(self, node: Node) -> Node:
        p, k = self.p, self.k
        if k >= len(p) or p[k] not in "?*+{":
            return node
        if p[k] == "{":
            close = p.index("}", k)
            lo, _, hi = p[k + 1 : close].partition(",")
            low, high = int(lo), (int(hi) if hi else None) if "," in p[k + 1 : close] else int(lo)
            k = close + 1
        else:
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[p[k]]
            k += 1
        if k < len(p) and p[k] in "?+":  # lazy or possessive: only prunes the search (see the module)
            k += 1
        self.k = k
        return repeat(node, low, high)


def atom(pos: Pos) -> Node:
    return Node({pos}, {pos}, False, [pos], False, (pos, 1))


def assertion(pos: Pos) -> Node:
    return Node({pos}, {pos}, False, [pos], True)


def cat(items: list[Node]) -> Node:
    if len(items) == 1:
        return items[0]
    first, last, nullable, positions = set(), set(), True, []
    zero = all(item.zero or item.nullable for item in items)
    for item in items:
        for pos in last:
            pos.follow |= item.first
        if nullable:
            first |= item.first
        last = item.last | last if item.nullable else set(item.last)
        nullable = nullable and item.nullable
        positions += item.positions
    return Node(first, last, nullable, positions, zero)


def alt(items: list[Node]) -> Node:
    if len(items) == 1:
        return items[0]
    return Node(set().union(*(i.first for i in items)), set().union(*(i.last for i in items)),
                any(i.nullable for i in items), [p for i in items for p in i.positions],
                any(i.zero or i.nullable for i in items))


def repeat(node: Node, low: int, high: int | None) -> Node:
    if high is not None and high < max(low, 1):
        raise Refused("an empty repeat")
    if high is None or high > 1:
        for pos in node.last:
            pos.follow |= node.first
    single = (node.single[0], low) if node.single is not None and node.single[1] == 1 else None
    return Node(set(node.first), set(node.last), low == 0 or node.nullable, node.positions,
                low == 0 or node.zero or node.nullable, single)


def _covered(alternative: Node, items: list[Node]) -> frozenset[str]:
    """The characters this alternative matches alone whatever follows them: one part is a repeat
    of one atom (at least once), the parts before it are optional and don't take the character,
    the parts after are optional, and there is no assertion in it."""
    if any(pos.kind != "atom" for pos in alternative.positions):
        return frozenset()
    required = [i for i, item in enumerate(items) if not item.nullable]
    if len(required) != 1 or items[required[0]].single is None:
        return frozenset()
    j = required[0]
    taken = set().union(*(pos.members for item in items[:j] for pos in item.first))
    return items[j].single[0].members - taken


def _top(pattern: str, alphabet: str, sources: list[str] | None = None) -> tuple[list[Node], list[list[Node]]]:
    """The pattern's alternatives, each with its parts (for the coverage check); each one's
    source text appended to ``sources`` where given."""
    parser = _Parser(pattern, alphabet)
    alternatives, parts = [], []
    while True:
        items, start = [], parser.k
        while parser.k < len(pattern) and pattern[parser.k] not in "|)":
            items.append(parser.quantified(parser.item(False)))
        alternatives.append(cat(items))
        parts.append(items)
        if sources is not None:
            sources.append(pattern[start : parser.k])
        if parser.k >= len(pattern):
            return alternatives, parts
        if pattern[parser.k] == ")":
            raise Refused("unbalanced group")
        parser.k += 1


def boundary_tests(pattern: str, alphabet: str = ALPHABET) -> dict[str, list[Pos]]:
    """Per character x: the atoms and assertions that may be tried right after an atom of the
    pattern consumed x (through zero-width assertions). Refused unless every character of the
    alphabet is sure to be matched (a tiktoken pattern drops text no match covers)."""
    tests, covered, _, _ = _analysis(pattern, alphabet)
    if set(alphabet) - covered:
        raise Refused(f"no sure match at {sorted(set(alphabet) - covered)[:5]}")
    return tests


def _analysis(pattern: str, alphabet: str) -> tuple[dict[str, list[Pos]], frozenset[str], frozenset[str], bool]:
    """:func:`boundary_tests` without the coverage check, plus: the characters sure to be matched
    alone, those no atom or assertion of the pattern accepts, and whether it has an end anchor."""
    alternatives, parts = _top(pattern, alphabet)
    whole = alt(alternatives)
    if whole.nullable or whole.zero:
        raise Refused("the pattern matches the empty text")
    covered = frozenset().union(*(_covered(a, items) for a, items in zip(alternatives, parts)))
    seen_anywhere = frozenset().union(*(pos.members for pos in whole.positions))
    out: dict[str, list[Pos]] = {}
    for x in alphabet:
        seen: dict[int, Pos] = {}
        todo = [q for pos in whole.positions if pos.kind == "atom" and x in pos.members for q in pos.follow]
        while todo:
            q = todo.pop()
            if id(q) not in seen:
                seen[id(q)] = q
                if q.kind != "atom":  # zero-width: what follows it is tried at the same place
                    todo += q.follow
        out[x] = list(seen.values())
    return out, covered, frozenset(alphabet) - seen_anywhere, any(pos.kind == "end" for pos in whole.positions)


def is_cut(tests: list[Pos], y: str) -> bool:
    """Whether nothing tried at the boundary can tell ``y`` there from the end of the text."""
    told = told_from_end(tests)
    return told is not None and y not in told


def told_from_end(tests: list[Pos]) -> frozenset[str] | None:
    """The characters that something tried at the boundary can tell from the end of the text
    (None: every one, an end anchor is tried). :func:`is_cut` for every ``y`` at once."""
    if any(q.kind == "end" for q in tests):
        return None
    return frozenset().union(*(q.members for q in tests))


#: Every character ``regex``'s ``\s`` matches (U+3000 is the last of them).
WHITESPACE = "".join(regex.findall(r"\s", "".join(map(chr, range(0x3001)))))  # (one call: 12k cost 0.1 s)
NEWLINES = frozenset("\r\n")
#: Whitespace tails the cuts after whitespace are argued for (see :func:`whitespace_cuts`):
#: Qwen's and Kimi's (o200k's) ``\s*[\r\n]+|\s+(?!\S)|\s+``, and cl100k's, whose ``\s++$``
#: matches a run at the end of a text whole, so only a line end cuts there.
TAILS = {r"\s*[\r\n]+|\s+(?!\S)|\s+": "gives back its space", r"\s++$|\s*[\r\n]|\s+(?!\S)|\s": "line ends"}


def whitespace_cuts(pattern: str) -> str | None:
    r"""Which cuts after whitespace hold for ``pattern``: "gives back its space", "line ends" or
    None (none are made). Both kinds:

    * *line ends*: x is ``\r`` or ``\n`` and y is not whitespace;
    * *gives back its space* (the first tail only): x is whitespace and y a token that starts with
      whitespace other than ``\r\n`` then a character that is not whitespace (``   `` + `` content``).

    The argument. Let A be the run of whitespace that ends at x. Which alternative matches where
    inside A is decided by what A holds and what follows it, so compare A followed by the end of
    the text with A followed by y. The pattern ends with one of :data:`TAILS`, and every other
    alternative is *checked* here to touch whitespace only in two ways: a first atom that may take
    a whitespace character other than ``\r\n``, cannot end the match and is followed only by atoms
    that take no whitespace (``[^\r\n\p{L}\p{N}]?\p{L}+``, `` ?[^\s\p{L}\p{N}]+``: a prefix of the
    word after the run); or, later in a match, atoms that take only ``\r\n``, end the match, and are
    followed only by such atoms (``[\r\n]*`` after punctuation: a prefix of A of line ends). So a
    match from before A takes the same line ends of A either way; no other alternative than the
    tail's starts inside A, whose characters are all followed by whitespace or the end (a prefix
    needs a character that is not whitespace after it). In the tail, with a line end in what is
    left of A, ``\s*[\r\n]+`` or ``\s*[\r\n]`` (or, at the end of the text, ``\s++$``) takes it up to
    its last line end, and with y not whitespace that is the whole rest of A either way. With the
    first tail and no line end left, ``\s+(?!\S)`` takes the rest of A: at the end of the text as
    a whole, before y's whitespace and the character after it by giving back exactly y's part.
    Then y starts a fresh match, which looks behind at nothing. Atoms are evaluated over ASCII
    and every Unicode whitespace character, so A may hold any of them."""
    sources: list[str] = []
    try:
        alternatives, _ = _top(pattern, ALPHABET + WHITESPACE[WHITESPACE.index("\x85"):], sources)
    except (Refused, regex.error, ValueError, IndexError):
        return None
    sources = [src.replace("\r", r"\r").replace("\n", r"\n") for src in sources]  # (a JSON pattern holds them raw)
    kind = next((kind for tail, kind in TAILS.items() if "|".join(sources[-tail.count("|") - 1 :]) == tail), None)
    if kind is None:
        return None
    space = frozenset(WHITESPACE)
    for alternative in alternatives[: len(alternatives) - next(t for t in TAILS if TAILS[t] == kind).count("|") - 1]:
        for pos in alternative.positions:
            if pos.kind != "atom" or not pos.members & space:
                continue
            if pos in alternative.first:
                sound = not pos.members & NEWLINES and pos not in alternative.last and \
                    all(q.kind == "atom" and not q.members & space for q in pos.follow)
            else:
                sound = pos.members & space <= NEWLINES and pos in alternative.last and \
                    all(q.kind == "atom" and q.members & space <= NEWLINES and not q.members - NEWLINES
                        for q in pos.follow)
            if not sound:
                return None
    return kind


@lru_cache(maxsize=8)
def derived_boundaries(pattern: str) -> Boundaries | None:
    """The :class:`Boundaries` of a tiktoken-style pattern over ASCII, one class per character
    (class ``ord(c) + 1``; 0 for a character outside ASCII, which never cuts); None where the
    pattern has something :class:`_Parser` refuses, or leaves a character unmatched (tiktoken
    drops such text)."""
    return split_sequence_boundaries([pattern], every_character=True)


def _boundaries(pairs: list[list[bool]], kind: str | None, solid: list[str]) -> Boundaries:
    """``pairs`` (one class per ASCII character) with the cuts after whitespace of ``kind`` (see
    :func:`whitespace_cuts`) made before the characters of ``solid``."""
    for x in NEWLINES if kind is not None else ():
        for y in solid:
            pairs[ord(x) + 1][ord(y) + 1] = True
    classes = tuple(range(1, len(pairs)))
    if kind != "gives back its space":
        return Boundaries(pairs, classes=classes)
    horizontal = frozenset(ord(c) + 1 for c in ALPHABET if c in WHITESPACE and c not in NEWLINES)
    return Boundaries(pairs, classes=classes, space_first=horizontal, space_then=frozenset(ord(c) + 1 for c in solid))


def split_sequence_boundaries(patterns: list[str], every_character: bool = False) -> Boundaries | None:
    """The :class:`Boundaries` of ``tokenizers``' pre-tokenizer made of Isolated splits, one per
    pattern, in order (each step splits every piece the one before made; text no match covers
    stays a piece of its own). DeepSeek's: digits by threes, CJK runs, then a tiktoken-style
    pattern. None where a step has something the parser refuses.

    Per step and pair (x, y), the boundary between them is *clean* when it becomes a piece
    boundary with each side's pieces as alone: the pattern's tests after x can't tell y from the
    end (:func:`is_cut`), and x and y are each either sure to be matched (so x's match ends at
    the boundary and y's starts there) or accepted by nothing in the pattern (a gap ends or
    starts there; not both). It is *transparent* when nothing in the pattern accepts x or y and
    it has no end anchor: the boundary lies inside one gap piece, u's last gap then r's first,
    and the next step sees that piece as it would see the two texts apart. A pair is a cut when
    some step is clean and every step before it transparent. The cuts after whitespace of the
    last step (:func:`whitespace_cuts`) hold where every earlier step is transparent to all
    whitespace and to the character after the space (so the run and the word stay in one piece).
    ``every_character``: None unless the first pattern is sure to match every ASCII character (a
    single tiktoken pattern: with no gaps, every pair it cuts is clean)."""
    if not patterns:
        return None
    try:
        steps = [_analysis(p, ALPHABET + WHITESPACE[WHITESPACE.index("\x85"):]) for p in patterns]
    except (Refused, regex.error, ValueError, IndexError):
        return None
    if every_character and set(ALPHABET) - steps[0][1]:
        return None
    size = len(ALPHABET) + 1
    pairs = [[False] * size for _ in range(size)]
    told = [{x: told_from_end(tests[x]) for x in ALPHABET} for tests, _, _, _ in steps]  # (is_cut, per x once)
    for x in ALPHABET:
        for y in ALPHABET:
            for (tests, covered, never, has_end), told_x in zip(steps, told):
                if x in never and y in never and not has_end:
                    continue  # transparent: the next step decides
                sure = (x in covered or x in never) and (y in covered or y in never)
                pairs[ord(x) + 1][ord(y) + 1] = sure and told_x[x] is not None and y not in told_x[x]
                break
    space = frozenset(WHITESPACE)
    earlier = steps[:-1]
    kind = whitespace_cuts(patterns[-1]) if all(space <= never and not has_end for _, _, never, has_end in earlier) else None
    return _boundaries(pairs, kind, [c for c in ALPHABET if c not in space and all(c in never for _, _, never, _ in earlier)])


def matches_no_ascii(pattern: str) -> bool:
    """Whether ``pattern`` can match nothing in a text of ASCII characters: no atom of it accepts
    one, and every match takes a character (a pattern that can match the empty text, or that the
    parser refuses, is not said to)."""
    try:
        _, _, never, _ = _analysis(pattern, ALPHABET)
    except (Refused, regex.error, ValueError, IndexError):
        return False
    return never == frozenset(ALPHABET)
