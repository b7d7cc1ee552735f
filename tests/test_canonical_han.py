"""Runs of Han tokens confirmed by their adjacent pairs and the skeleton
(recon.tokenizers.fast.hanruns) give exactly the native encoder's ids, for all five tokenizers:
on CJK and mixed-script text with canonical ids, random splits of tokens, ids of the text cut
and encoded in pieces, and greedy longest-match ids (tokens across pre-token boundaries)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recon.tokenizers.fast.hanruns import FIRST_H, LAST_H, pure_han

from .test_pretokenize import SETTINGS

NAMES = ["smollm2", "deepseek-v4", "qwen3.6", "cl100k", "kimi-k2.5"]
#: Han characters (common and rare ones of H, and Han-script ones outside it: 〇々, Extension A,
#: a compatibility ideograph NFC changes), CJK punctuation, kana, Hangul, fullwidth forms, and the
#: ASCII the patterns single out
HAN = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广罗导愿阿伯俱乐部毛泽东加拿大新加坡各种各样众所周知龘龥鿿〇々㐀豈"
OTHER = "，。、「」『』！？：；（）…—・ー のテキストですカタカナ한국어 문장ＡＢ１２\u3000 é"
ASCII = "  \n\n\r\t aeiouAEIOU'sStTdD019 (),.!?-_#\""
END = {"cl100k": "<|endoftext|>", "deepseek-v4": "<｜end▁of▁sentence｜>"}


@pytest.fixture(scope="module")
def toks(tokenizers, kimi):
    return {**{n: tokenizers[n] for n in NAMES if n != "kimi-k2.5"}, "kimi-k2.5": kimi}


def test_pure_han_table(toks):
    """pure_han marks exactly the tokens whose bytes are whole characters of U+4E00..U+9FA5."""
    for name, tok in toks.items():
        table = pure_han(tok.token_bytes, tok.added_ids)
        expected = []
        for i, data in enumerate(tok.token_bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = ""
            expected.append(bool(text) and i not in tok.added_ids and all(FIRST_H <= ord(c) <= LAST_H for c in text))
        assert table.tolist() == expected, name


def test_every_tokenizer_checks_pairs(toks):
    for name, tok in toks.items():
        check = tok.canonical_check()
        assert check is not None and check.pairs is not None, name


def greedy(tok, text: str) -> list[int]:
    """Longest-match ids of ``text``'s bytes: valid ids that spell it, often across pre-tokens."""
    data, ids, at = text.encode(), [], 0
    table = tok.bytes_to_id
    while at < len(data):
        for size in range(min(48, len(data) - at), 0, -1):
            token = table.get(data[at : at + size])
            if token is not None and token not in tok.added_ids:
                ids.append(token)
                at += size
                break
        else:
            raise AssertionError("a byte with no token")
    return ids


def split_some(tok, ids: list[int], rng: random.Random) -> list[int]:
    """``ids`` with a few tokens split in two tokens that spell the same bytes."""
    out = list(ids)
    table = tok.bytes_to_id
    for _ in range(rng.randrange(1, 4)):
        spots = [k for k, i in enumerate(out) if len(tok.token_bytes[i]) > 1 and i not in tok.added_ids]
        if not spots:
            break
        k = rng.choice(spots)
        data = tok.token_bytes[out[k]]
        cuts = [c for c in range(1, len(data)) if data[:c] in table and data[c:] in table]
        if cuts:
            c = rng.choice(cuts)
            out[k : k + 1] = [table[data[:c]], table[data[c:]]]
    return out


def texts_strategy():
    alphabet = st.sampled_from(HAN * 3 + OTHER + ASCII)
    return st.lists(st.text(alphabet, min_size=1, max_size=60), min_size=1, max_size=8)


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(texts=texts_strategy(), seed=st.integers(0, 2**32 - 1))
def test_guesses_give_the_native_encoding(toks, name, texts, seed):
    tok = toks[name]
    rng = random.Random(seed)
    end = END.get(name, "<|im_end|>")
    texts = [t + end if rng.random() < 0.5 else t for t in texts]
    native = [tok.encode(t) for t in texts]
    guesses = []
    for text, ids in zip(texts, native):
        way = rng.randrange(4)
        if way == 0:
            guesses.append(list(ids))
        elif way == 1:
            guesses.append(split_some(tok, ids, rng))
        elif way == 2:  # cut in pieces, each encoded alone
            cuts = sorted(rng.sample(range(1, len(text)), min(3, len(text) - 1))) if len(text) > 1 else []
            bounds = [0, *cuts, len(text)]
            guesses.append([i for a, b in zip(bounds, bounds[1:]) for i in tok.encode(text[a:b])])
        else:
            body = text[: -len(end)] if text.endswith(end) else text
            guesses.append(greedy(tok, body) + (tok.encode(end) if body != text else []))
    assert tok.encode_batch(texts, guesses=guesses) == native
    # (and the same again, with every pair now known)
    assert tok.encode_batch(texts, guesses=guesses) == native


@pytest.mark.parametrize("name", NAMES)
def test_long_han_runs(toks, name):
    """Clauses of Han characters, as translated catalogs hold them, canonical and split."""
    tok = toks[name]
    rng = random.Random(5)
    texts = ["".join(rng.choice(HAN[:400]) for _ in range(rng.randrange(5, 80))) + rng.choice("，。、\n ")
             for _ in range(300)]
    texts = ["".join(texts[k : k + 5]) for k in range(0, 300, 5)]
    native = [tok.encode(t) for t in texts]
    guesses = [split_some(tok, ids, rng) if k % 3 == 0 else list(ids) for k, ids in enumerate(native)]
    check = tok.canonical_check()
    before = check.pairs.tested
    assert tok.encode_batch(texts, guesses=guesses) == native
    assert check.pairs.tested > before  # the pairs did the work
