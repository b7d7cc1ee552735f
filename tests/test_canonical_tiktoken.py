"""The boundary rules derived from the tiktoken families' patterns (recon.tokenizers.fast.derive) are
the native pre-tokenizer's, and the token-space check built on them gives exactly the native
encoder's ids for cl100k, Qwen3.6 and the Kimi-shaped tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st

import recon
from recon.tokenizers.families import FAMILIES
from recon.tokenizers.fast.derive import (
    boundary_tests,
    derived_boundaries,
    is_cut,
    whitespace_cuts,
)
from recon.tokenizers.fast.pretokenize import ALPHABET, _compile
from recon.tokenizers.native import MAX_RUN_CHARS

from .test_canonical import SIDE, variants
from .test_pretokenize import MIXED, PLAIN, SETTINGS

NAMES = ["cl100k", "qwen3.6", "kimi-k2.5"]
END = {"cl100k": "<|endoftext|>", "qwen3.6": "<|im_end|>", "kimi-k2.5": "<|im_end|>"}
#: characters the patterns single out, over-weighted in the random contexts
POOL = ALPHABET + "    \n\n\r\r\t\x0b\x0c aeiouAEIOU'sStTdDmMlLrevV019 (),.!?-_#\"" * 2


@pytest.fixture(scope="module")
def toks(tokenizers, kimi):
    return {"cl100k": tokenizers["cl100k"], "qwen3.6": tokenizers["qwen3.6"], "kimi-k2.5": kimi}


def rules_of(tok):
    return derived_boundaries(tok.core._pat_str)


def cuts(rules, left: str, right: str) -> bool:
    return rules.pairs[ord(left[-1]) + 1][ord(right[0]) + 1]


def native_pieces(pattern: str, texts: list[str]) -> list[list[str]]:
    """tiktoken's own pre-tokens of each text: with every substring of the texts a token (ranked by
    length), BPE merges each pre-token into one token, so the tokens are the pre-tokens."""
    subs = {t.encode()[i:j] for t in texts for i in range(len(t)) for j in range(i + 1, len(t) + 1)}
    ranks = {s: r for r, s in enumerate(sorted(subs, key=lambda s: (len(s), s)))}
    enc = tiktoken.Encoding("pieces", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return [[enc.decode_single_token_bytes(i).decode() for i in ids] for ids in enc.encode_ordinary_batch(texts)]


def contexts(rng: random.Random, x: str, y: str, longest: int = 6) -> tuple[str, str]:
    left = "".join(rng.choice(POOL) for _ in range(rng.randrange(longest))) + x
    right = y + "".join(rng.choice(POOL) for _ in range(rng.randrange(longest)))
    return left, right


def test_the_three_families_get_rules_and_only_sound_ones(toks):
    for name, tok in toks.items():
        rules = rules_of(tok)
        assert rules is not None, name
        assert tok.canonical_check() is not None, name
        # cuts every family makes, and joins no family may cut
        for x, y in [("a", " "), ("a", "("), ("1", "a"), (")", " "), ("a", "\n"), ("x", "1"), ("\n", "a"), ("\r", "(")]:
            assert cuts(rules, x, y), (name, x, y)
        for x, y in [("a", "b"), (" ", "a"), (" ", " "), ("(", "a"), ("\n", "\n"), (" ", "("), ("'", "s"),
                     ("\t", "a"), (".", "\n"), ("\n", " "), ("\r", "\n"), ("A", "b")]:
            assert not cuts(rules, x, y), (name, x, y)
    qwen, cl100k, kimi = (rules_of(toks[n]) for n in ("qwen3.6", "cl100k", "kimi-k2.5"))
    assert cuts(qwen, "1", "2") and not cuts(cl100k, "1", "2") and not cuts(kimi, "1", "2")  # \p{N} vs \p{N}{1,3}
    assert cuts(cl100k, "t", "'") and not cuts(kimi, "t", "'")  # Kimi keeps "it's" whole
    assert cuts(kimi, "a", "B") and not cuts(qwen, "a", "B")  # Kimi cuts camelCase


def test_what_the_derivation_refuses_or_does_not_cut():
    assert derived_boundaries(r"(?<=a)b|\s+|\S") is None  # a lookbehind
    assert derived_boundaries(r"^\w+|\s+|\S") is None
    assert derived_boundaries(r"\b\w+|\s+|\S") is None
    assert derived_boundaries(r"a|b") is None  # no match at most characters: tiktoken would drop text
    assert derived_boundaries(r"\s*|\S") is None  # an empty match
    assert derived_boundaries(r"(?=a)|\S|\s") is None
    tests = boundary_tests(r"\w+|\s+$|\s|[^\w\s]")  # a `$` may be tried after whitespace: nothing cuts there
    assert not any(is_cut(tests[" "], y) for y in "a \n")
    assert is_cut(tests["a"], " ") and not is_cut(tests["a"], "b")
    tests = boundary_tests(r"\w+(?!x)|\w|\s+|[^\w\s]")  # the lookahead's class decides
    assert not is_cut(tests["a"], "x") and not is_cut(tests["a"], "b") and is_cut(tests["a"], " ")


@pytest.mark.parametrize("name", NAMES)
def test_every_derived_cut_holds_for_every_pair_of_characters_in_many_contexts(name, toks):
    """Every ASCII pair (x, y) the rules cut (every pair of character classes is a pair of characters
    here), 24 random contexts each, pre-tokenized by `regex`; 4 of them per pair (one in six) through
    tiktoken's own pre-tokenizer and through the native encoder with the real vocabulary: left +
    right is always left's pre-tokens (ids) then right's."""
    tok = toks[name]
    rules, pattern, rng = rules_of(tok), tok.core._pat_str, random.Random(11)
    findall = _compile(pattern).findall
    cases = []
    for x in ALPHABET:
        for y in ALPHABET:
            if rules.pairs[ord(x) + 1][ord(y) + 1]:
                cases += [contexts(rng, x, y) for _ in range(24)]
    assert len(cases) > 100_000  # most pairs of classes are cuts: the check isn't vacuous
    for left, right in cases:
        assert findall(left + right) == findall(left) + findall(right), (left, right)
    core, sample = tok.core, cases[::6]
    for start in range(0, len(sample), 20_000):
        batch = sample[start : start + 20_000]
        whole = core.encode_ordinary_batch([a + b for a, b in batch])
        apart = core.encode_ordinary_batch([t for pair in batch for t in pair])
        for k, (pair, ids) in enumerate(zip(batch, whole)):
            assert ids == apart[2 * k] + apart[2 * k + 1], pair
    for start in range(0, len(sample), 1500):
        batch = sample[start : start + 1500]
        texts = [t for a, b in batch for t in (a + b, a, b)]
        pieces = native_pieces(pattern, texts)
        for k, pair in enumerate(batch):
            assert pieces[3 * k] == pieces[3 * k + 1] + pieces[3 * k + 2], pair


def test_which_cuts_after_whitespace_each_pattern_gets():
    kinds = {name: whitespace_cuts(f.pattern) for name, f in FAMILIES.items()}
    assert kinds == {"kimi": "gives back its space", "qwen3.5": "gives back its space", "cl100k": "line ends"}
    gpt2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    assert whitespace_cuts(gpt2) is None  # no tail it is argued for (a line end gives back to \s+(?!\S) there)
    assert whitespace_cuts(r"x[\r\n]*y|\s*[\r\n]+|\s+(?!\S)|\s+|.") is None  # line ends inside a match
    assert whitespace_cuts(r"\n\w+|\s*[\r\n]+|\s+(?!\S)|\s+|.") is None  # a word that starts with a line end
    assert whitespace_cuts(r" \s\w|\s*[\r\n]+|\s+(?!\S)|\s+|.") is None  # a prefix followed by whitespace


#: whitespace the runs before a cut are made of (outside ASCII too: the argument covers all of \s)
RUNS = " \t\n\r\x0b\x0c\u3000\xa0\x85 \n  "


@pytest.mark.parametrize("name", NAMES)
def test_cuts_after_whitespace_hold_in_many_contexts(name, toks):
    """The two token-level cuts after whitespace, in random contexts: a line end then anything
    but whitespace (every family), and whitespace then a token that starts with whitespace other
    than a line end and then something else (Qwen, Kimi): left + right is left's pre-tokens (and
    ids, with the real vocabulary) then right's, by `regex`, tiktoken's pre-tokenizer and the
    native encoder."""
    tok = toks[name]
    rules, pattern, rng = rules_of(tok), tok.core._pat_str, random.Random(13)
    findall = _compile(pattern).findall
    solid = [c for c in ALPHABET if not c.isspace() and c not in "\x1c\x1d\x1e\x1f"]
    cases = []
    for _ in range(20_000):
        run = "".join(rng.choice(RUNS) for _ in range(rng.randrange(1, 6)))
        before = "".join(rng.choice(POOL) for _ in range(rng.randrange(5)))
        after = "".join(rng.choice(POOL + "中文é") for _ in range(rng.randrange(5)))
        left = before + run + rng.choice("\r\n")
        cases.append((left, rng.choice(solid) + after))  # a line end, then no whitespace
        if rules.space_first:
            first = chr(rng.choice(sorted(rules.space_first)) - 1)
            then = chr(rng.choice(sorted(rules.space_then)) - 1)
            cases.append((before + run, first + then + after))
    assert all(cuts(rules, a, b) for a, b in cases if a[-1] in "\r\n" and not b[0].isspace())
    for left, right in cases:
        assert findall(left + right) == findall(left) + findall(right), (left, right)
    core = tok.core
    whole = core.encode_ordinary_batch([a + b for a, b in cases])
    apart = core.encode_ordinary_batch([t for pair in cases for t in pair])
    for k, (pair, ids) in enumerate(zip(cases, whole)):
        assert ids == apart[2 * k] + apart[2 * k + 1], pair
    sample = [(a, b) for a, b in cases[::10] if (a + b).isascii()]  # (native_pieces: its ranks are ASCII-safe)
    assert len(sample) > 500
    pieces = native_pieces(pattern, [t for a, b in sample for t in (a + b, a, b)])
    for k, pair in enumerate(sample):
        assert pieces[3 * k] == pieces[3 * k + 1] + pieces[3 * k + 2], pair


def test_cl100k_does_not_cut_a_run_at_its_end_before_whitespace(toks):
    r"""cl100k's \s++$ takes a run at the end of a text whole: "\n   " alone is one pre-token, in
    "\n    x" it is "\n" then "   " (the cut Qwen and Kimi get is not one here)."""
    findall = _compile(toks["cl100k"].core._pat_str).findall
    assert findall("\n   ") == ["\n   "] and findall("\n    x") == ["\n", "   ", " x"]
    assert not rules_of(toks["cl100k"]).space_first


@pytest.mark.parametrize("name", NAMES)
def test_every_cut_the_rules_make_holds_in_hypothesis_contexts(name, toks):
    tok = toks[name]
    rules, pattern = rules_of(tok), tok.core._pat_str

    @SETTINGS
    @given(left=SIDE, x=st.sampled_from(ALPHABET), y=st.sampled_from(ALPHABET), right=SIDE)
    def holds(left, x, y, right):
        left, right = left + x, y + right
        if cuts(rules, left, right):
            whole, alone, after = native_pieces(pattern, [left + right, left, right])
            assert whole == alone + after
            assert tok.encode(left + right, allow_special=False) == \
                tok.encode(left, allow_special=False) + tok.encode(right, allow_special=False)

    holds()


def guesses_agree(tok, end_text: str) -> None:
    """Hypothesis text with canonical, re-segmented, truncated and special-spelled guesses:
    encode_batch(guesses=) is the native encode, and a confirmed guess is that encoding."""

    @SETTINGS
    @given(texts=st.lists(st.one_of(PLAIN, MIXED), min_size=1, max_size=6), seed=st.integers(0, 1 << 30))
    def agrees(texts, seed):
        rng = random.Random(seed)
        batch, guesses = [], []
        for text in texts:
            for guess in variants(tok, tok.encode(text), rng, end_text):
                batch.append(tok.decode(guess) if rng.random() < 0.8 else text)
                guesses.append(guess if rng.random() < 0.9 else None)
        expected = [tok.encode(t) for t in batch]
        assert tok.encode_batch(batch, guesses=guesses) == expected
        check = tok.canonical_check()
        assert all(got is None or got == e for got, e in zip(check.encode(batch, guesses), expected))
        assert all(g == e for g, e, ok in zip(guesses, expected, check.confirm(batch, guesses)) if ok)

    agrees()


@pytest.mark.parametrize("name", NAMES)
def test_encode_with_guesses_is_the_native_encode(name, toks):
    tok = toks[name]
    assert END[name] in tok.added_by_content
    guesses_agree(tok, END[name])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("many", [5, 150])
def test_texts_that_spell_added_tokens_are_checked_where_their_ids_hold_them(name, toks, many):
    """Texts holding an added token's text, some with it spelled by ordinary ids, some in the
    middle: every one takes the way that compares where the ids hold added tokens with where the
    encoder extracts them, few samples one by one and many at once; the native encode decides."""
    tok, end = toks[name], END[name]
    spelled = tok.encode(end, allow_special=False)
    texts, guesses = [], []
    for k in range(many):
        head, tail = tok.encode(f"item {k}: "), tok.encode(f" then {k * 7} 中文")
        guess = [head + tok.encode(end) + tail, head + spelled + tail, head + tail + spelled][k % 3]
        texts.append(tok.decode(guess))
        guesses.append(guess)
    expected = [tok.encode(t) for t in texts]
    got = tok.canonical_check().encode(texts, guesses)
    assert all(g is None or g == e for g, e in zip(got, expected))
    assert all(g == e for g, e, guess in zip(got, expected, guesses) if guess == e)  # (the canonical ones: answered)
    assert any(guess != e for guess, e in zip(guesses, expected)) and any(guess == e for guess, e in zip(guesses, expected))
    assert [ok for ok in tok.canonical_check().confirm(texts, guesses)] == [g == e for g, e in zip(guesses, expected)]


@pytest.mark.parametrize("name", NAMES)
def test_canonical_code_is_confirmed_and_resegmented_code_is_not(name, kimi_dir):
    tok = recon.load_tokenizer(kimi_dir if name == "kimi-k2.5" else name)  # its own tables, learned from nothing
    rng, end = random.Random(5), tok.encode(END[name])
    package = Path(recon.__file__).parent
    text = "".join(open(p).read() for p in sorted(package.glob("audit/*.py")))
    texts = [t for t in (text[i : i + 400] for i in range(0, len(text) - 400, 170)) if t.isascii()]
    assert len(texts) > 150
    ids = [tok.encode(t) + end for t in texts]
    texts = [t + END[name] for t in texts]
    resegmented = [variants(tok, i, rng, END[name])[1] for i in ids]
    check = tok.canonical_check()
    for _ in range(2):
        assert check.confirm(texts, ids) == [True] * len(texts)
        assert check.confirm(texts, resegmented) == [r == i for r, i in zip(resegmented, ids)]
        spelled = [tok.decode(r) == t for r, t in zip(resegmented, texts)]
        assert sum(spelled) > 100
        assert check.encode(texts, resegmented) == [i if ok else None for i, ok in zip(ids, spelled)]
        assert tok.encode_batch(texts, guesses=resegmented) == ids


def test_a_text_kimis_loader_would_slice_is_not_checked_on_its_ids(toks):
    tok = toks["kimi-k2.5"]
    text = "x" * (MAX_RUN_CHARS + 10) + " end"
    ids = tok.encode(text)
    assert tok.encode_batch([text, "a b"], guesses=[ids, tok.encode("a b")]) == [ids, tok.encode("a b")]
    calls = []
    real = type(tok.canonical_check()).encode
    try:  # encode_batch never asks the check about that text
        type(tok.canonical_check()).encode = lambda self, texts, guesses, decoded=None: (
            calls.append(list(guesses)) or real(self, texts, guesses, decoded))
        tok.encode_batch([text], guesses=[ids])
    finally:
        type(tok.canonical_check()).encode = real
    assert calls == [[None]]


def test_families_patterns_all_derive():
    for family in FAMILIES.values():
        assert derived_boundaries(family.pattern) is not None, family.name


@pytest.mark.parametrize("name", NAMES)
def test_stretches_glued_with_an_added_token_are_encoded_as_alone(name, toks):
    """Stretches no glue character fits (non-ASCII at an edge, lone marks, text not in NFC, an
    added token's own text inside) go many to a call glued with an added token; each comes back
    as the native encoder makes of it alone (the oracle: ``tok.encode`` of each stretch's text)."""
    tok = toks[name]
    check = tok.canonical_check()
    glue = check._glued._special
    assert glue is not None and tok.decode([glue.id]) == glue.text and glue.text in {t.content for t in tok.added_tokens}
    rng = random.Random(11)
    pieces = ["数据", "模型的", "한국어", "Ünïcode", "é", "\u0301x", "e\u0301", "🙂🙂", "x数", "数x", " 数", "数\n",
              "Ω", glue.text, f"a{glue.text}b", END[name], f"数{END[name]}数", "\u3000", "٣٤", "ΑΒΓ", "\u200dz"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(600)] + pieces
    stretches = [tok.encode(t) for t in texts] + [tok.encode("数") + tok.encode("据")]  # the last: not canonical
    calls = []

    def encode(text):
        calls.append(text)
        return glue.encode(text)

    check._glued._special = glue._replace(encode=encode)
    try:
        got = check._glued.encode(stretches)
    finally:
        check._glued._special = glue
    assert calls and sum(text.count(glue.text) for text in calls) > len(stretches) // 2  # most went glued this way
    want = [tok.encode(tok.decode(s)) for s in stretches]
    assert [g is None or g == w for g, w in zip(got, want)] == [True] * len(want)
    assert sum(g is not None for g in got) > 0.9 * len(got)
    assert check._learn(stretches) == [w == s for w, s in zip(want, stretches)]
    data = [t.encode() for t in texts[:5]]
    glued = tok.encode(glue.text.join(texts[:5]))
    assert check._glued.unglue(glued, data, glue.id, len(glue.text.encode())) == [tok.encode(t) for t in texts[:5]]
