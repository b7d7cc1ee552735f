"""The word cache encodes exactly as the native encoder, on every real tokenizer, or stands aside."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import recon
from recon.samples.records import read_records
from recon.tokenizers.fast.wordcache import WordCache, split_words

from .conftest import ROOT

EXAMPLES = int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60))

# text built from the pieces where pre-tokenizers disagree: runs of spaces next to newlines and
# tabs, digits, apostrophes, CJK, combining marks, odd Unicode spaces, and special-token text
PIECES = st.sampled_from([
    " ", "  ", "\n", "\t", "\r\n", " \n", "\u00a0", "\u3000", "\x1c", "a", "Word", "ing", "'s", "'T", "7", "123456",
    "½", "日本", "中文", "한국", "é", "e\u0301", "\u0301", ".", ",", "!?", "()", "$", "🤖", "👩\u200d💻", "<", "|>",
    "<|im_end|>", "<|im_start|>", "<think>", "</think>", "<|endoftext|>", "<｜end▁of▁sentence｜>",
])
TEXTS = st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=30).map("".join)


@pytest.fixture(scope="module")
def all_tokenizers(tokenizers, kimi):
    return {**tokenizers, "kimi-k2.5": kimi}


@pytest.fixture(scope="module")
def bundled_texts(tokenizers):
    records = read_records(sorted((ROOT / "data").glob("smollm2-t*.jsonl"))).records
    return tokenizers["smollm2"].decode_batch([r.output_ids for r in records])


def native(tok, texts, allow_special):
    return [tok.encode(t, allow_special=allow_special) for t in texts]  # single encode: never the cache


@given(TEXTS)
@settings(max_examples=EXAMPLES, deadline=None)
def test_split_words_keeps_every_character_and_cuts_only_before_a_space_after_non_whitespace(text):
    words = split_words(text)
    assert "".join(words) == text
    for left, right in zip(words, words[1:]):
        assert right.startswith(" ") and left and not left[-1].isspace()
    assert len(words) == 1 + sum(1 for i, c in enumerate(text) if c == " " and i and not text[i - 1].isspace())


@pytest.mark.parametrize("name", ["smollm2", "deepseek-v4", "qwen3.6", "cl100k", "kimi-k2.5"])
@pytest.mark.parametrize("allow_special", [True, False])
def test_every_real_tokenizer_has_an_exact_word_cache(name, allow_special, all_tokenizers, bundled_texts):
    tok = all_tokenizers[name]
    cache = tok.word_cache(allow_special)
    assert cache is not None
    texts = bundled_texts + [t + "<|im_end|>" + t for t in bundled_texts[:20]]
    assert tok.encode_batch(texts, allow_special=allow_special) == native(tok, texts, allow_special)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(TEXTS, min_size=1, max_size=8))
    def agrees(batch):
        assert tok.encode_batch(batch, allow_special=allow_special) == native(tok, batch, allow_special)

    agrees()


def test_the_cache_learns_each_word_once_and_stays_bounded(tokenizers, bundled_texts):
    tok = tokenizers["smollm2"]
    cache = WordCache(lambda t: tok._encode_batch(t, True), tok.token_lengths,
                      [{"<|im_end|>": tok.piece_to_id("<|im_end|>")}], max_words=500)
    want = native(tok, bundled_texts, True)
    assert cache.encode_batch(bundled_texts) == want
    assert 500 < cache.misses < cache.lookups and len(cache.words) == 1  # it started over (keeping <|im_end|>)
    assert cache.encode_batch(bundled_texts[:3]) == want[:3] and len(cache.words) < 500  # and stays exact
    big = WordCache(lambda t: tok._encode_batch(t, True), tok.token_lengths)
    big.encode_batch(bundled_texts)
    misses = big.misses
    assert big.encode_batch(bundled_texts) == want and big.misses == misses  # the second pass only looks up


def test_a_tokenizer_the_cut_is_not_exact_for_gets_no_cache(tmp_path):
    # a normalizer that lowercases: the cache's structural check refuses it, and encoding stays exact
    from tokenizers import Tokenizer as Core
    from tokenizers import models, normalizers, pre_tokenizers

    core = Core(models.BPE({"a": 0, "b": 1, " ": 2, "ab": 3}, [("a", "b")]))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.save(str(tmp_path / "tokenizer.json"))
    tok = recon.load_tokenizer(tmp_path / "tokenizer.json")
    assert tok.word_cache() is None
    assert tok.encode_batch(["AB ab", "b a"]) == [[3, 3], [1, 0]]


def test_the_cache_can_be_switched_off(monkeypatch, tokenizers):
    tok = recon.load_tokenizer("smollm2")
    monkeypatch.setenv("RECON_WORD_CACHE", "0")
    assert tok.word_cache() is None
    assert tok.encode_batch(["hello world"]) == tokenizers["smollm2"].encode_batch(["hello world"])


def test_glued_words_are_cut_back_at_their_byte_boundaries(tokenizers):
    tok = tokenizers["smollm2"]
    cache = WordCache(lambda t: tok._encode_batch(t, True), tok.token_lengths)
    words = [" naïve", " 🤖", " café,", " 2026"]
    shares = cache._cut_ids(words, tok.encode("".join(words)))
    assert shares == [(w, tok.encode(w)) for w in words]
    assert tok.encode(" abc") == [43239]  # one token across where " ab" and "c" would meet:
    assert cache._cut_ids([" ab", "c"], tok.encode(" abc")) is None  # not a cut, so nothing is learned from it


def test_a_full_cache_keeps_the_keys_its_last_batch_used(tokenizers, bundled_texts):
    tok = tokenizers["smollm2"]
    cache = tok._make_word_cache(True)
    cache.max_words = 400
    want = native(tok, bundled_texts, True)
    sizes, shed = [], 0
    for k in range(0, 60, 3):  # small batches: the cache fills, then sheds all but the last batch's keys
        batch = bundled_texts[k : k + 3]
        before = len(cache.words)
        assert cache.encode_batch(batch) == want[k : k + 3]
        used = {w for t in batch for w in cache._keys(t)}
        if len(cache.words) < before:
            shed += 1
            assert set(cache.words) == used | set(cache._tokens)  # exactly this batch's keys stayed
        sizes.append(len(cache.words))
    assert shed >= 2 and max(sizes) <= 400 + 300  # it shed, more than once, and stayed bounded
    assert cache.encode_batch(bundled_texts[:60]) == want[:60]


@settings(max_examples=200, deadline=None)
@given(texts=st.sets(st.text(alphabet="<|ab>", max_size=5), max_size=12))
def test_special_tokens_that_begin_others_are_found(texts):
    """The specials a tiktoken word cache leaves to the core (one begins another: tiktoken tries
    them in no fixed order), found from sorted neighbours; oracle: every pair compared."""
    from recon.tokenizers.fast.wordcache import prefixes_of_others

    assert prefixes_of_others(texts) == sorted(a for a in texts if any(b != a and b.startswith(a) for b in texts))
