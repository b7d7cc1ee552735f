"""DeepSeek-V4's boundary rules, derived from its pre-tokenizer of three Isolated splits
(recon.tokenizers.fast.derive.split_sequence_boundaries), are its native pre-tokenizer's, and the
token-space check built on them gives exactly the native encoder's ids."""

from __future__ import annotations

import json
import random

import pytest

from recon.tokenizers.fast.derive import split_sequence_boundaries
from recon.tokenizers.fast.pretokenize import ALPHABET, split_patterns

from .test_canonical import pre_tokens
from .test_canonical_tiktoken import POOL, RUNS, contexts, guesses_agree

END = "<\uff5cend\u2581of\u2581sentence\uff5c>"


@pytest.fixture(scope="module")
def deepseek(tokenizers):
    return tokenizers["deepseek-v4"]


def test_the_pre_tokenizer_is_three_splits_and_gets_rules(deepseek):
    state = json.loads(deepseek.core.pre_tokenizer.__getstate__())
    assert [s["type"] for s in state["pretokenizers"]] == ["Split", "Split", "Split", "ByteLevel"]
    patterns = split_patterns(deepseek.core)
    assert patterns is not None and len(patterns) == 3
    rules = split_sequence_boundaries(patterns)
    assert rules is not None and deepseek.canonical_check() is not None
    cut = lambda x, y: rules.pairs[ord(x) + 1][ord(y) + 1]  # noqa: E731
    assert cut("a", "1") and cut("1", "a") and cut("a", " ") and cut("\n", "a") and cut("\n", "1")
    assert not cut("1", "2") and not cut("a", "b") and not cut(" ", "a") and not cut("(", "a") and not cut("\n", " ")
    # the word after a space is never a digit: the digit split would leave the space at the end of its piece
    assert rules.space_then and ord("1") + 1 not in rules.space_then and ord("a") + 1 in rules.space_then


def test_every_derived_cut_holds_in_many_contexts(deepseek):
    """Every ASCII pair the rules cut, 6 random contexts each, and both cuts after whitespace in
    contexts with runs of any whitespace: DeepSeek's own pre-tokenizer gives left + right as
    left's pre-tokens then right's, and its encoder left's ids then right's."""
    core, rng = deepseek.core, random.Random(17)
    rules = split_sequence_boundaries(split_patterns(core))
    cases = [contexts(rng, x, y) for x in ALPHABET for y in ALPHABET if rules.pairs[ord(x) + 1][ord(y) + 1]
             for _ in range(6)]
    assert len(cases) > 20_000
    solid = [chr(c - 1) for c in sorted(rules.space_then)]
    for _ in range(6000):
        before = "".join(rng.choice(POOL) for _ in range(rng.randrange(5)))
        after = "".join(rng.choice(POOL + "中文é") for _ in range(rng.randrange(5)))
        run = "".join(rng.choice(RUNS) for _ in range(rng.randrange(1, 6)))
        cases.append((before + run + rng.choice("\r\n"), rng.choice(solid) + after))
        cases.append((before + run, chr(rng.choice(sorted(rules.space_first)) - 1) + rng.choice(solid) + after))
    for left, right in cases:
        assert pre_tokens(core, left + right) == pre_tokens(core, left) + pre_tokens(core, right), (left, right)
    sample = cases[::5]
    whole = core.encode_batch([a + b for a, b in sample], add_special_tokens=False)
    apart = core.encode_batch([t for pair in sample for t in pair], add_special_tokens=False)
    for k, (pair, ids) in enumerate(zip(sample, whole)):
        assert ids.ids == apart[2 * k].ids + apart[2 * k + 1].ids, pair


def test_encode_with_guesses_is_the_native_encode(deepseek):
    assert END in deepseek.added_by_content
    guesses_agree(deepseek, END)


def test_a_step_that_matches_no_ascii_is_left_out_of_the_cut(deepseek):
    """DeepSeek's CJK step can match nothing in ASCII text, the only text the word cache cuts:
    without it the cut still gives DeepSeek's own pre-tokens."""
    from recon.tokenizers.fast.derive import matches_no_ascii
    from recon.tokenizers.fast.pretokenize import for_huggingface

    patterns = split_patterns(deepseek.core)
    assert [matches_no_ascii(p) for p in patterns] == [False, True, False]
    assert not matches_no_ascii(r"[a\u4e00]+") and not matches_no_ascii(r"x*|\u4e00")
    cut = for_huggingface(deepseek.core, idle=matches_no_ascii)
    rng = random.Random(29)
    for _ in range(2000):
        text = "".join(rng.choice(POOL) for _ in range(rng.randrange(1, 40)))
        assert cut(text) == pre_tokens(deepseek.core, text), text
