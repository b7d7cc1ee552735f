"""recon's pre-token cut is the native tokenizers' own, and the word cache built on it is exact."""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import recon
from recon.tokenizers.bytelevel import piece_to_bytes
from recon.tokenizers.families import FAMILIES
from recon.tokenizers.fast.pretokenize import (
    ALPHABET, DIGITS_THEN_GPT2, GPT2_PATTERN, _anchored, _compile, _hf_patterns, ascii_pattern, for_huggingface,
    for_tiktoken, plain,
)

EXAMPLES = int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

NAMES = ["smollm2", "deepseek-v4", "qwen3.6", "cl100k", "kimi-k2.5"]
HF_NAMES = ["smollm2", "deepseek-v4"]
TIKTOKEN_NAMES = ["qwen3.6", "cl100k", "kimi-k2.5"]

# -- code-like text --------------------------------------------------------------------------
LOWER = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
UPPER = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8)
IDENT = st.one_of(
    st.lists(LOWER, min_size=1, max_size=3).map(lambda ps: ps[0] + "".join(map(str.capitalize, ps[1:]))),  # camelCase
    st.lists(LOWER, min_size=1, max_size=3).map(lambda ps: "".join(p.capitalize() for p in ps)),  # PascalCase
    UPPER,  # ALLCAPS
    st.lists(st.one_of(LOWER, UPPER), min_size=1, max_size=3).map("_".join),  # snake_case, SNAKE_CASE
    st.tuples(st.sampled_from(["_", "__"]), LOWER, st.sampled_from(["", "__", "2", "8"])).map("".join),
)
DIGITS = st.text("0123456789", min_size=1, max_size=12)  # cl100k / DeepSeek group digits by three
SPACE = st.sampled_from([" ", "  ", "    ", "\t", "\x0b", "\x0c"])
WHITESPACE = st.lists(st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c"]), min_size=1,
                      max_size=6).map("".join)
PUNCT = st.lists(st.sampled_from([
    "):", "->", "==", "{}", '"""', "#", "(", ")", "[", "]", ",", ".", ":", "=", "+=", "!=", "**", "...", "'", '"',
    "\\", "/", "@", "$", "%", "&&", "||", "<", ">", "`", "~", "^", ";", "-", "_",
]), min_size=1, max_size=3).map("".join)
CONTRACTION = st.tuples(
    st.sampled_from(["", " ", "  ", "\n", "\t", "x", "X", "it", "IT", "'"]),
    st.sampled_from(["'s", "'S", "'ll", "'LL", "'re", "'Re", "'ve", "'VE", "'d", "'D", "'m", "'M", "'t", "'T"]),
).map("".join)
SPECIAL_TEXT = st.sampled_from(["<|endoftext|>", "<|im_end|>", "<think>"])  # plain ASCII too
TOKEN = st.one_of(IDENT, DIGITS, PUNCT, CONTRACTION, st.sampled_from(ALPHABET), st.text(ALPHABET, max_size=4),
                  st.just(" "), SPACE, WHITESPACE, SPECIAL_TEXT)
NON_ASCII = st.sampled_from(["é", "日本", "🤖", "\u00a0", "\u2028"])
EOL = st.sampled_from(["\n", "\r\n", "\r", "\n\n", "\x0b", "\x0c", ""])
TRAILING = st.sampled_from(["", "", " ", "  ", "\t", " \t", "\t "])


def lines(token):
    """Text of lines: indentation, tokens, trailing whitespace, a line end."""
    line = st.tuples(st.one_of(st.just(""), SPACE, st.lists(SPACE, max_size=4).map("".join)),
                     st.lists(token, max_size=10).map("".join), TRAILING, EOL).map("".join)
    return st.lists(line, min_size=1, max_size=5).map("".join)


PLAIN = st.one_of(lines(TOKEN), st.lists(TOKEN, max_size=16).map("".join), WHITESPACE)  # WHITESPACE: nothing else
MIXED = st.tuples(st.one_of(lines(st.one_of(TOKEN, NON_ASCII)), st.lists(st.one_of(TOKEN, NON_ASCII)).map("".join)),
                  NON_ASCII, PLAIN).map("".join)  # never plain: space-words, each plain one cut into pre-tokens
TEXTS = st.one_of(PLAIN, MIXED)
BATCHES = st.lists(TEXTS, min_size=1, max_size=8)


@pytest.fixture(scope="module")
def all_tokenizers(tokenizers, kimi):
    return {**tokenizers, "kimi-k2.5": kimi}


def native(tok, texts, allow_special=True):
    return [tok.encode(t, allow_special=allow_special) for t in texts]  # single encode: never the cache


def hf_native_pieces(core, text):
    return [piece_to_bytes(p).decode() for p, _ in core.pre_tokenizer.pre_tokenize_str(text)]


def tiktoken_native_pieces(pattern, text):
    """tiktoken's own cut of ``text`` by ``pattern``: a BPE over every substring of the text merges
    each pre-token into one token, so the tokens are the pre-tokens (text no match covers is dropped,
    as tiktoken drops it)."""
    data = text.encode()
    if not data:
        return []
    subs = {data[i:j] for i in range(len(data)) for j in range(i + 1, len(data) + 1)}
    ranks = {s: r for r, s in enumerate(sorted(subs, key=lambda s: (len(s), s)))}
    enc = tiktoken.Encoding("pieces", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return [enc.decode_single_token_bytes(t).decode() for t in enc.encode_ordinary(text)]


@SETTINGS
@given(PLAIN, MIXED)
def test_strategy_texts_are_what_they_claim(plain_text, mixed_text):
    assert plain(plain_text) and not plain(mixed_text)


# -- 1. the cache's batches are the native encodes ---------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_encode_batch_is_native_on_code_like_text(name, all_tokenizers):
    tok = all_tokenizers[name]
    cache = tok.word_cache(True)
    assert cache is not None and cache._cut is not None  # the pre-token cut is in use, not just the word cut

    @SETTINGS
    @given(BATCHES)
    def agrees(batch):
        assert tok.encode_batch(batch, allow_special=True) == native(tok, batch, True)

    agrees()


@pytest.mark.parametrize("name", ["smollm2", "cl100k", "deepseek-v4"])
def test_encode_batch_is_native_without_specials(name, all_tokenizers):
    tok = all_tokenizers[name]
    assert tok.word_cache(False) is not None and tok.word_cache(False)._cut is not None

    @SETTINGS
    @given(BATCHES)
    def agrees(batch):
        assert tok.encode_batch(batch, allow_special=False) == native(tok, batch, False)

    agrees()


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_tokenizer_learns_every_piece_cold(name, kimi_dir):
    tok = recon.load_tokenizer(kimi_dir if name == "kimi-k2.5" else name)
    first = ["def f(x):\n    return x  # 12345678\r\n\tIT'S 'll\x0b\x0c  ", "  \n ", "é 日本 x=1🤖\u00a0\u2028 ok"]
    assert tok.encode_batch(first) == native(tok, first)  # its first batch, right after the probe check

    @SETTINGS
    @given(BATCHES)
    def agrees(batch):
        cache = tok._make_word_cache(True)  # empty, not even the probes learned: every key is a miss
        assert cache is not None and cache._cut is not None
        tok.__dict__["_word_caches"] = {True: cache}
        assert tok.encode_batch(batch) == native(tok, batch)
        assert cache.misses == len(cache.words) - len(cache._tokens)

    agrees()


# -- 2. the cut is the native pre-tokenizer's ---------------------------------------------------
@pytest.mark.parametrize("name", HF_NAMES)
def test_the_huggingface_cut_is_the_native_pre_tokenizer(name, all_tokenizers):
    core = all_tokenizers[name].core
    cut = for_huggingface(core)
    assert cut is not None

    @SETTINGS
    @given(PLAIN)
    def same(text):
        assert plain(text)
        assert cut(text) == hf_native_pieces(core, text)

    same()


@pytest.mark.parametrize("name", TIKTOKEN_NAMES)
def test_the_tiktoken_cut_is_tiktokens(name, all_tokenizers):
    pattern = all_tokenizers[name].core._pat_str
    cut = for_tiktoken(pattern)
    assert cut is not None

    @SETTINGS
    @given(PLAIN)
    def same(text):
        assert cut(text) == tiktoken_native_pieces(pattern, text)  # also: never None on plain text

    same()


def test_the_native_cut_helper_sees_pre_tokens():
    assert tiktoken_native_pieces(FAMILIES["cl100k"].pattern, "it's 1234  x\n") == ["it", "'s", " ", "123", "4", " ",
                                                                                     " x", "\n"]


# -- 3. the `re` translations find what `regex` finds -------------------------------------------
def all_patterns(tokenizers):
    patterns = {f"family {f.name}": f.pattern for f in FAMILIES.values()}
    patterns |= {"GPT2_PATTERN": GPT2_PATTERN, "DIGITS_THEN_GPT2": DIGITS_THEN_GPT2}
    for name in HF_NAMES:
        for k, p in enumerate(_hf_patterns(json.loads(tokenizers[name].core.pre_tokenizer.__getstate__()))):
            patterns[f"{name} step {k}"] = p
    return patterns


def test_every_pattern_has_a_re_translation(tokenizers):
    patterns = all_patterns(tokenizers)
    assert len(patterns) >= 5 + 3
    assert [label for label, p in patterns.items() if ascii_pattern(p) is None] == []


def test_re_translations_find_what_regex_finds(tokenizers):
    pairs = {label: (ascii_pattern(p), _compile(p)) for label, p in all_patterns(tokenizers).items()}

    @SETTINGS
    @given(PLAIN)
    def same(text):
        for label, (fast, slow) in pairs.items():
            assert [m.span() for m in fast.finditer(text)] == [m.span() for m in slow.finditer(text)], label

    same()


# -- 4. deterministic ----------------------------------------------------------------------------
def stdlib_slices():
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / f).read_text(encoding="utf-8") for f in ("textwrap.py", "argparse.py")]
    return [t[i : i + 2000] for t in texts for i in range(0, len(t), 2000)]


@pytest.mark.parametrize("name", NAMES)
def test_the_standard_library_encodes_as_natively(name, all_tokenizers):
    tok = all_tokenizers[name]
    slices = stdlib_slices()
    assert len(slices) > 50 and sum(map(plain, slices)) > 50
    mixed = [s.replace(" = ", " = é", 3).replace("\n", "\u2028", 1) for s in slices[::5]]  # the space-word path
    texts = slices + mixed
    assert tok.encode_batch(texts) == native(tok, texts)
    cache = tok.word_cache(True)
    misses = cache.misses
    assert tok.encode_batch(texts[::-1]) == native(tok, texts[::-1]) and cache.misses == misses  # all looked up


def test_plain_is_the_alphabet():
    assert plain("a\tb\n") and plain("") and plain(ALPHABET)
    assert plain("\x1c") and plain("\x00") and plain("x\x7f") and plain("\x1f")  # ASCII, classes agree everywhere
    assert not plain("é") and not plain("x\u00a0") and not plain("\x85")


def test_anchors_outside_a_class_decline():
    assert _anchored(r"\s+$") and _anchored(r"^\s+") and _anchored(r"a|b$")
    assert not _anchored(r"[$^]+") and not _anchored(r"\$\^") and not _anchored(r"[^\s]+")
    assert not _anchored(GPT2_PATTERN)
    assert for_tiktoken(r"\s+$|\S+") is None and for_tiktoken(r"^\w+|\s+") is None
    assert for_tiktoken(FAMILIES["cl100k"].pattern) is not None  # its `\s++$` is the one anchor it knows


def test_an_anchored_split_makes_the_huggingface_cut_decline():
    from tokenizers import Regex, Tokenizer as Core
    from tokenizers import models, pre_tokenizers

    core = Core(models.BPE({"a": 0, " ": 1}, []))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+$|\S+| "), "isolated")
    assert for_huggingface(core) is None
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+|\S+"), "isolated")
    assert for_huggingface(core)("a  a") == ["a", "  ", "a"]
