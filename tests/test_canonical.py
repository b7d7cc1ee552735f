"""The token-space check (recon.tokenizers.fast.canonical) says "these ids are the text's encoding" exactly when
the native encoder agrees, and its boundary rules are the native pre-tokenizer's."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import recon
from recon.tokenizers.bytelevel import piece_to_bytes
from recon.tokenizers.fast.pretokenize import ALPHABET, OTHER_SPACE, SPACE, ascii_classes, boundary_rules

from .test_pretokenize import MIXED, PLAIN, SETTINGS, TOKEN

CLASSES = ascii_classes()


@pytest.fixture(scope="module")
def smollm2(tokenizers):
    return tokenizers["smollm2"]


def pre_tokens(core, text: str) -> list[str]:
    return [piece_to_bytes(p).decode() for p, _ in core.pre_tokenizer.pre_tokenize_str(text)]


def cut_between(rules, left: str, right: str) -> bool:
    x, y = CLASSES[ord(left[-1])], CLASSES[ord(right[0])]
    if rules.pairs[x][y]:
        return True
    return x in (SPACE, OTHER_SPACE) and y == SPACE and len(right) > 1 and CLASSES[ord(right[1])] in rules.space_then


SIDE = st.one_of(PLAIN, st.lists(TOKEN, max_size=4).map("".join), st.text(ALPHABET, max_size=6))


@SETTINGS
@given(left=SIDE, x=st.sampled_from(ALPHABET), y=st.sampled_from(ALPHABET), right=SIDE)
def test_every_cut_the_rules_make_is_the_native_pre_tokenizers_whatever_surrounds_it(smollm2, left, x, y, right):
    rules = boundary_rules(smollm2.core)
    left, right = left + x, y + right
    if cut_between(rules, left, right):
        assert pre_tokens(smollm2.core, left + right) == pre_tokens(smollm2.core, left) + pre_tokens(smollm2.core, right)


def test_the_rules_hold_for_every_pair_of_characters_in_many_contexts(smollm2):
    """Every (x, y) the rules cut between, 40 random contexts each, and the whitespace-then-word
    rule for every character it allows."""
    rules, rng = boundary_rules(smollm2.core), random.Random(7)
    pool = ALPHABET + "  \n\n\t aeiou'st01 (),."
    cuts = 0
    for x in ALPHABET:
        for y in ALPHABET:
            for _ in range(40):
                left = "".join(rng.choice(pool) for _ in range(rng.randrange(6))) + x
                right = y + "".join(rng.choice(pool) for _ in range(rng.randrange(6)))
                if cut_between(rules, left, right):
                    cuts += 1
                    assert pre_tokens(smollm2.core, left + right) == \
                        pre_tokens(smollm2.core, left) + pre_tokens(smollm2.core, right), (left, right)
    assert cuts > 200_000  # most pairs are cuts: the check isn't vacuous
    for ws in [" ", "  ", "\n", "\n    ", "\t", " \t", "\r\n  "]:
        for y in (c for c in ALPHABET if CLASSES[ord(c)] in rules.space_then):
            left, right = "x" + ws, " " + y + "yz"
            assert cut_between(rules, left, right)
            assert pre_tokens(smollm2.core, left + right) == pre_tokens(smollm2.core, left) + pre_tokens(smollm2.core, right)


def test_only_known_pre_tokenizers_get_rules(tokenizers):
    assert boundary_rules(tokenizers["smollm2"].core) is not None
    assert boundary_rules(tokenizers["deepseek-v4"].core) is None  # its Split patterns: derived (test_canonical_deepseek)
    for name in ("smollm2", "qwen3.6", "cl100k", "deepseek-v4"):  # tiktoken ones: tests/test_canonical_tiktoken.py
        assert tokenizers[name].canonical_check() is not None
        assert tokenizers[name].encode_batch(["a b"], guesses=[[1, 2]]) == [tokenizers[name].encode("a b")]


def variants(tok, ids: list[int], rng: random.Random, end_text: str = "<|im_end|>") -> list[list[int]]:
    """Guesses for the text of ``ids``: the ids, a token split in two (same bytes), a token dropped,
    the end-of-turn token moved, an added token spelled by ordinary ones."""
    out = [ids]
    splittable = [k for k, i in enumerate(ids) if len(tok.token_bytes[i]) > 1]
    if splittable:
        k = rng.choice(splittable)
        data = tok.token_bytes[ids[k]]
        for cut in range(1, len(data)):
            a, b = tok.bytes_to_id.get(data[:cut]), tok.bytes_to_id.get(data[cut:])
            if a is not None and b is not None:
                out.append(ids[:k] + [a, b] + ids[k + 1 :])
                break
    if len(ids) > 1:
        out.append(ids[:-1])
    end = tok.encode(end_text)
    spelled = tok.encode(end_text, allow_special=False)
    out.append(ids + end)
    out.append(end + ids)
    out.append(ids + spelled)
    return out


@SETTINGS
@given(texts=st.lists(st.one_of(PLAIN, MIXED), min_size=1, max_size=6), seed=st.integers(0, 1 << 30))
def test_encode_with_guesses_is_the_native_encode(smollm2, texts, seed):
    tok, rng = smollm2, random.Random(seed)
    batch, guesses = [], []
    for text in texts:
        for guess in variants(tok, tok.encode(text), rng):
            batch.append(tok.decode(guess) if rng.random() < 0.8 else text)  # mostly the text the guess spells
            guesses.append(guess if rng.random() < 0.9 else None)
    expected = [tok.encode(t) for t in batch]
    assert tok.encode_batch(batch, guesses=guesses) == expected
    assert all(got is None or got == e for got, e in zip(tok.canonical_check().encode(batch, guesses), expected))
    confirmed = tok.canonical_check().confirm(batch, guesses)
    assert all(g == e for g, e, ok in zip(guesses, expected, confirmed) if ok)  # never a wrong yes


def test_canonical_samples_are_confirmed_and_the_rest_are_not(smollm2):
    """On real code: every canonical ASCII sample is confirmed on its ids, every re-segmented one
    refused, before and after the stretches are learned, and with a tiny store that keeps clearing."""
    tok = recon.load_tokenizer("smollm2")  # its own tables, learned from nothing
    rng = random.Random(3)
    package = Path(recon.__file__).parent
    source = sorted(package.glob("audit/*.py")) + [package / "tokenizers" / "fast" / "wordcache.py"]
    text = "".join(open(path).read() for path in source)
    texts = [t for t in (text[i : i + 400] for i in range(0, len(text) - 400, 170)) if t.isascii()]
    assert len(texts) > 150
    ids = [tok.encode(t) + tok.encode("<|im_end|>") for t in texts]
    texts = [t + "<|im_end|>" for t in texts]
    resegmented = [variants(tok, i, rng)[1] for i in ids]
    check = tok.canonical_check()
    for _ in range(2):
        assert check.confirm(texts, ids) == [True] * len(texts)
        assert check.confirm(texts, resegmented) == [r == i for r, i in zip(resegmented, ids)]
        # a re-segmented sample's encoding: its ids with the odd stretch encoded again, no text encoded
        spelled = [tok.decode(r) == t for r, t in zip(resegmented, texts)]
        assert sum(spelled) > 100
        assert check.encode(texts, resegmented) == [i if ok else None for i, ok in zip(ids, spelled)]
    # over the limit, a store keeps what the last batch used if that is half the limit or less
    def held(store):
        return set(np.frombuffer(store.keys(), np.uint64).tolist())

    packed, longs = held(check._runs), set(check._long)
    assert len(packed) == len(check._runs)
    assert packed and longs
    check.max_packed, check.max_runs = len(packed) - 1, len(longs) - 1
    assert check.confirm(texts[:3], ids[:3]) == [True] * 3
    kept_packed, kept_longs = held(check._runs), set(check._long)
    assert 0 < len(kept_packed) <= check.max_packed // 2 and kept_packed < packed
    assert len(kept_longs) <= check.max_runs // 2 and kept_longs < longs
    check.max_packed = check.max_runs = 10
    assert check.confirm(texts, ids) == [True] * len(texts)
    assert len(check._runs) + len(check._long) == 0  # this batch used more than half: nothing kept


def test_a_guess_that_spells_another_text_or_holds_unknown_ids_is_refused(smollm2):
    tok = smollm2
    ids = tok.encode("hello world")
    check = tok.canonical_check()
    assert check.confirm(["hello world", "hello world!", "hello world"], [ids, ids, ids + [tok.vocab_size + 5]]) == \
        [True, False, False]
    assert check.confirm(["x"], [[-1]]) == [False]
    he = tok.encode("h\u00e9")
    assert check.confirm(["h\u00e9"], [he]) == [True]  # tokens outside ASCII: checked by their bytes
    assert check.confirm(["h\u00e8"], [he]) == [False]  # bytes that spell another text
    half = tok.bytes_to_id[b"\xc3"]  # a sample cut inside a character: it decodes to U+FFFD, not its bytes
    assert tok.decode([half]) == "\ufffd" and tok.encode("\ufffd") != [half]
    assert check.confirm(["\ufffd"], [[half]], ["\ufffd"]) == [False]
    assert tok.encode_batch(["\ufffd"], guesses=[[half]], decoded=["\ufffd"]) == [tok.encode("\ufffd")]
    assert check.confirm(["\ud800"], [he]) == [False]  # a lone surrogate: no ids spell it
    assert check.confirm(["", "a"], [[], None]) == [False, False]


def test_stretches_learned_together_are_learned_as_one_by_one(smollm2):
    tok = recon.load_tokenizer("smollm2")
    check = tok.canonical_check()
    assert check._glued.glues and tok.decode([check._glued.glues[0][1]]) == "0"  # Digits: a cut around every digit
    words = [" return", "self", " FakeProxyHandler", "(", "):", "\n   ", " x", "'s", "0", "12", "<|im_end|>", "a<|im_"]
    stretches = [tok.encode(w) for w in words] + [tok.encode(" ret") + tok.encode("urn")]  # the last: not canonical
    assert check._learn(stretches) == [tok.encode(tok.decode(s)) == s for s in stretches]
    assert check._learn(stretches)[-1] is False
    glue, glue_id = check._glued.glues[0][:2]
    glued = tok.encode("0".join(words[:3]))
    data = [w.encode() for w in words[:3]]
    assert check._glued.unglue(glued, data, glue_id) == [tok.encode(w) for w in words[:3]]
    assert check._glued.unglue(glued, [b"ab", *data[1:]], glue_id) is None  # the glue is not where the texts say


def test_decoded_texts_stand_for_the_spelling_and_non_ascii_ones_are_spelled_by_their_bytes(smollm2):
    tok = smollm2
    texts = ["hello world", "h\u00e9llo w\u00f6rld", "x = 1\n", "hello world"]
    guesses = [tok.encode(t) for t in texts]
    guesses[3] = tok.encode(" ret") + tok.encode("urn")  # spells " return", not the text
    decoded = tok.decode_batch(guesses)
    check = tok.canonical_check()
    assert check.confirm(texts, guesses, decoded) == [True, True, True, False]
    assert check.confirm(texts, guesses, [None, None, decoded[2], None]) == [True, True, True, False]
    assert tok.encode_batch(texts, guesses=guesses, decoded=decoded) == [tok.encode(t) for t in texts]
    odd = [guesses[0] + [tok.vocab_size + 7], [-3] + guesses[2]]  # ids no token holds: never confirmed
    assert check.confirm([texts[0], texts[2]], odd, [texts[0], texts[2]]) == [False, False]


@pytest.mark.parametrize("name", ["smollm2", "qwen3.6", "cl100k", "deepseek-v4", "kimi-k2.5"])
def test_texts_with_added_tokens_anywhere_give_the_native_ids(name, tokenizers, kimi):
    """Added tokens held by the ids, spelled by ordinary tokens, cut in half, next to each other
    and to text that begins or ends like one: encode_batch with the ids as guesses (the quick
    count of added tokens' first characters, or the cache's own extraction) equals the native
    encode of the text, and a guess is confirmed only where it is that encoding."""
    tok = kimi if name == "kimi-k2.5" else tokenizers[name]
    rng = random.Random(23)
    contents = sorted(t.content for t in tok.added_tokens)
    pool = [c for c in contents if len(c) > 1][:60] + ["<|", "|>", "<", "[", "]", "｜", "<t", "</"]
    words = ["hello", " world", "\n", "  ", "x", "1", "é", " 中文"]
    texts, guesses = [], []
    for _ in range(400):
        parts = [rng.choice(pool) if rng.random() < 0.4 else rng.choice(words) for _ in range(rng.randrange(1, 7))]
        text = "".join(parts)
        ids = tok.encode(text)
        texts.append(text)
        guesses.append(ids)
        spelled = [i for p in parts for i in (tok.encode(p, allow_special=False))]  # specials spelled out
        texts.append(tok.decode(spelled))
        guesses.append(spelled)
    expected = [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, guesses=guesses, decoded=tok.decode_batch(guesses)) == expected
    confirmed = tok.canonical_check().confirm(texts, guesses, tok.decode_batch(guesses))
    assert confirmed == [g == e for g, e in zip(guesses, expected)]
    assert 50 < sum(confirmed) < len(texts)  # both kinds are there
