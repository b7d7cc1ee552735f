"""Runs of CJK tokens (Han, kana, Hangul) confirmed by their adjacent pairs and the skeleton
(recon.tokenizers.fast.cjkruns) give exactly the native encoder's ids, for all five tokenizers:
on Chinese, Japanese, Korean and mixed-script text with CJK punctuation at the runs' edges and
ASCII between, with canonical ids, random splits of tokens, ids of the text cut and encoded in
pieces, and greedy longest-match ids (tokens across pre-token boundaries)."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recon.tokenizers.fast.cjkruns import DEEPSEEK_V4_GROUPS, KIMI_GROUPS, ONE_GROUP, group_table

from .test_pretokenize import SETTINGS

NAMES = ["smollm2", "deepseek-v4", "qwen3.6", "cl100k", "kimi-k2.5"]
#: Han characters (common and rare ones of H, and Han-script ones outside it: 〇々, Extension A,
#: a compatibility ideograph NFC changes), CJK punctuation, kana, Hangul, fullwidth forms, and the
#: ASCII the patterns single out
HAN = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广罗导愿阿伯俱乐部毛泽东加拿大新加坡各种各样众所周知龘龥鿿〇々㐀豈"
KANA = "のテキストですカタカナがをはにへとでもやかよねゎゐゑヴヵヶーぁゔゕゖァヺ"
HANGUL = "한국어문장입니다이의가는를에서하고있다됩니까똠뷁"
OTHER = "，。、「」『』！？：；（）…—・ー\u3000ＡＢ１２ é々〆〇"
ASCII = "  \n\n\r\t aeiouAEIOU'sStTdD019 (),.!?-_#\""
END = {"cl100k": "<|endoftext|>", "deepseek-v4": "<｜end▁of▁sentence｜>"}


@pytest.fixture(scope="module")
def toks(tokenizers, kimi):
    """The five tokenizers, each with a fresh canonical check that confirms runs by their pairs
    (``RECON_CJK_PAIRS=1``: by default only where it pays, SmolLM2's); their own checks back after."""
    out = {**{n: tokenizers[n] for n in NAMES if n != "kimi-k2.5"}, "kimi-k2.5": kimi}
    kept = {n: tok.__dict__.pop("_canonical", None) for n, tok in out.items()}
    before = os.environ.get("RECON_CJK_PAIRS")
    os.environ["RECON_CJK_PAIRS"] = "1"
    try:
        for tok in out.values():
            tok.canonical_check()
    finally:
        if before is None:
            del os.environ["RECON_CJK_PAIRS"]
        else:
            os.environ["RECON_CJK_PAIRS"] = before
    yield out
    for n, tok in out.items():
        tok.__dict__.pop("_canonical", None)
        if kept[n] is not None:
            tok.__dict__["_canonical"] = kept[n]


def test_pairs_on_by_default_only_where_they_pay(tokenizers, kimi):
    """SmolLM2 (90 tokens of whole CJK characters, pairs tested in one call) and Kimi (Han runs
    isolated, pairs tested in C on the ranks, recon.tokenizers.fast.rankpairs) check runs by
    pairs; DeepSeek-V4, Qwen3.6 and cl100k keep the usual check."""
    from recon import kernel
    from recon.tokenizers.fast.cjkruns import pairs_pay

    assert pairs_pay(lambda: GROUP_TABLES["smollm2"](tokenizers["smollm2"]), True)
    assert not pairs_pay(lambda: GROUP_TABLES["deepseek-v4"](tokenizers["deepseek-v4"]), True)
    assert not pairs_pay(lambda: GROUP_TABLES["qwen3.6"](tokenizers["qwen3.6"]), False)
    if os.environ.get("RECON_CJK_PAIRS") is None:
        for name, tok in (("qwen3.6", tokenizers["qwen3.6"]), ("cl100k", tokenizers["cl100k"]), ("kimi", kimi)):
            kept = tok.__dict__.pop("_canonical", None)
            try:
                on = tok.canonical_check().pairs is not None
            finally:
                tok.__dict__.pop("_canonical", None)
                if kept is not None:
                    tok.__dict__["_canonical"] = kept
            assert on == (name == "kimi" and kernel.COMPILED), name


GROUP_TABLES = {name: (lambda tok, name=name: group_table(tok.token_bytes, GROUPS[name], tok.added_ids))
                for name in NAMES}


GROUPS = {"smollm2": ONE_GROUP, "qwen3.6": ONE_GROUP, "cl100k": ONE_GROUP, "kimi-k2.5": KIMI_GROUPS,
          "deepseek-v4": DEEPSEEK_V4_GROUPS}


def test_group_table(toks):
    """group_table marks exactly the tokens whose bytes are whole characters of one group."""
    for name, tok in toks.items():
        groups = GROUPS[name]
        table = group_table(tok.token_bytes, groups, tok.added_ids)
        assert (tok.canonical_check().pairs.table == table).all(), name
        expected = []
        for i, data in enumerate(tok.token_bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = ""
            of = {next((g for g, ranges in enumerate(groups, 1) if any(lo <= ord(c) <= hi for lo, hi in ranges)), 0)
                  for c in text}
            expected.append(of.pop() if text and i not in tok.added_ids and len(of) == 1 else 0)
        assert table.tolist() == expected, name
        assert (table > 0).sum() > 50, name


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
    script = st.sampled_from([HAN * 3 + OTHER + ASCII, KANA * 2 + HAN + OTHER + ASCII, HANGUL * 3 + OTHER + ASCII,
                              HAN + KANA + HANGUL + OTHER + ASCII * 2])
    return st.lists(script.flatmap(lambda a: st.text(st.sampled_from(a), min_size=1, max_size=60)), min_size=1, max_size=8)


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
@pytest.mark.parametrize("script", ["han", "kana", "hangul"])
def test_long_runs(toks, name, script):
    """Clauses of one script, as translated catalogs hold them, canonical and split, with CJK
    punctuation and ASCII at their edges."""
    tok = toks[name]
    rng = random.Random(5)
    letters = {"han": HAN[:400], "kana": KANA + HAN[:40], "hangul": HANGUL}[script]
    texts = ["".join(rng.choice(letters) for _ in range(rng.randrange(5, 80))) + rng.choice(["，", "。", "、", "\n", " ", "%s", "）"])
             for _ in range(300)]
    texts = ["".join(texts[k : k + 5]) for k in range(0, 300, 5)]
    native = [tok.encode(t) for t in texts]
    guesses = [split_some(tok, ids, rng) if k % 3 == 0 else list(ids) for k, ids in enumerate(native)]
    check = tok.canonical_check()
    before = check.pairs.tested
    assert tok.encode_batch(texts, guesses=guesses) == native
    assert check.pairs.tested > before  # the pairs did the work
    assert tok.encode_batch(texts, guesses=guesses) == native


@pytest.mark.parametrize("name", NAMES)
def test_catalog_text(toks, name):
    """Real translated text (the gettext catalogs benchmarks/cjk_data.py reads, where the
    machine has them): every record's canonical ids confirmed, split ones repaired."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from itertools import islice

    from cjk_data import texts as catalog_texts

    texts = list(islice(catalog_texts(), 0, None, 37))[:400]  # (catalog by catalog: every language)
    if not texts:
        pytest.skip("no CJK gettext catalogs on this machine")
    tok = toks[name]
    rng = random.Random(7)
    native = [tok.encode(t) for t in texts]
    guesses = [split_some(tok, ids, rng) if k % 4 == 0 else list(ids) for k, ids in enumerate(native)]
    assert tok.encode_batch(texts, guesses=guesses) == native


@pytest.mark.parametrize("name", ["smollm2", "qwen3.6", "cl100k", "kimi-k2.5"])
def test_equivalent_characters_cut_alike(toks, name):
    """Every character the boundary rules treat as an ASCII one (recon.tokenizers.fast.equivalents)
    is pre-tokenized as that character is: a text and the same text with each such character
    replaced by its ASCII stand-in (one of each kind, many contexts) cut into pieces at the same
    places, by the pre-tokenizer (tokenizers' own; tiktoken's pattern through regex)."""
    import regex

    from recon.tokenizers.fast.equivalents import EQUIVALENTS

    tok = toks[name]
    kind = "punctuation" if name == "kimi-k2.5" else "letters"
    assert tok._equivalents() == EQUIVALENTS[kind]
    chars = {}
    for lo, hi, c in EQUIVALENTS[kind]:
        for code in range(lo, hi + 1, max(1, (hi - lo) // 40)):
            chars[chr(code)] = c
    rng = random.Random(3)
    contexts = ASCII + "，。 \n中カ한"
    pieces = _pieces(tok)
    for char, stand_in in chars.items():
        for _ in range(6):
            left = "".join(rng.choice(contexts) for _ in range(rng.randrange(0, 4)))
            right = "".join(rng.choice(contexts) for _ in range(rng.randrange(0, 4)))
            text = left + char + right
            assert _lengths(pieces(text)) == _lengths(pieces(left + stand_in + right)), (name, text)


def _pieces(tok):
    """The native pre-tokenizer's pieces of a text."""
    core = tok.core
    if hasattr(core, "pre_tokenizer"):  # (its pieces are byte-level: their offsets are in characters)
        return lambda text: [text[a:b] for _, (a, b) in core.pre_tokenizer.pre_tokenize_str(text)]
    import regex

    pattern = regex.compile(core._pat_str, regex.V1 if "&&" in core._pat_str else regex.V0)
    return lambda text: pattern.findall(text)


def _lengths(pieces):
    return [len(p) for p in pieces]


TIKTOKEN = ["qwen3.6", "cl100k", "kimi-k2.5"]


@pytest.mark.parametrize("name", TIKTOKEN)
def test_rank_pairs_are_the_cores_own(toks, name):
    """The pair test run in C on the ranks (recon.tokenizers.fast.rankpairs) answers what the
    core's own ``_encode_single_piece`` answers: on every adjacent pair of the catalogs' text
    encoded and split, and on random pairs of CJK tokens, ASCII tokens and byte pieces."""
    import numpy as np

    from recon.tokenizers.fast.rankpairs import rank_pairs

    tok = toks[name]
    core, table = tok.core, tok.token_bytes
    test = rank_pairs(table, core._mergeable_ranks.values())
    rng = random.Random(11)
    texts = [HAN * 2, KANA * 3 + HAN[:200], HANGUL * 4, HAN[:300] + OTHER + ASCII + KANA, *_catalog(60)]
    pairs = []
    for text in texts:
        ids = tok.encode(text)
        ids = split_some(tok, ids, rng) + greedy(tok, text)
        pairs += [(a, b) for a, b in zip(ids, ids[1:]) if a not in tok.added_ids and b not in tok.added_ids]
    cjk = [i for i in range(len(table)) if table[i][:1] and 0xE3 <= table[i][0] <= 0xED and i not in tok.added_ids]
    short = [i for i in range(len(table)) if 0 < len(table[i]) <= 2 and i not in tok.added_ids]
    for _ in range(20000):
        pairs.append((rng.choice(cjk), rng.choice(cjk + short)))
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    want = [core._encode_single_piece(table[x] + table[y]) == [x, y] for x, y in pairs]
    assert test(a, b, np.zeros(len(a), bool)).tolist() == want
    assert 0 < sum(want) < len(want)


def _catalog(n: int) -> list[str]:
    import sys
    from itertools import islice
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from cjk_data import texts as catalog_texts

    return list(islice(catalog_texts(), 0, None, 97))[:n]


@pytest.mark.parametrize("name", ["qwen3.6", "kimi-k2.5"])
def test_runs_by_id_are_runs_by_bytes(toks, name):
    """Where runs are read off per-id tables (recon.tokenizers.fast.cjkids), every run token is
    one the byte-level reading puts in a run of the same group (and is whole characters), and
    the two agree on space-opened tokens and on the characters at the tokens' edges."""
    import numpy as np

    check = toks[name].canonical_check().pairs
    assert check.by_id
    texts = [HAN + KANA + " " + HANGUL + " 한국 어" + OTHER, *_catalog(80)]
    ids = [toks[name].encode(t) for t in texts]
    flat = np.array([i for s in ids for i in s], np.int64)
    starts = np.concatenate(([0], np.cumsum([len(s) for s in ids])[:-1])).astype(np.int64)
    fast = check.groups_of(flat, starts)
    check.by_id = False
    try:
        slow = check.groups_of(flat, starts)
    finally:
        check.by_id = True
    run = fast[0] > 0
    assert run.sum() > 1000
    assert (slow[0][run] == fast[0][run]).all() and slow[2][run].all() and slow[3][run].all()
    assert (slow[1][run] == fast[1][run]).all()
    # where the table knows a token's first or last character (whole in the token), the bytes
    # say the same (they know more: a piece's character, completed by its neighbours)
    if slow[4] is not None:
        for k in (4, 5):
            known = fast[k] >= 0
            assert known.mean() > 0.9 and (fast[k][known] == slow[k][known]).all()


WHITE = "  \n\n\t\u3000\r"


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(text=st.text(st.sampled_from(HAN[:60] + "々〇㐀豈龘鿿" + KANA[:12] + HANGUL[:6] + WHITE + "，。・ー" + "ab1'%s"),
                    min_size=1, max_size=120), seed=st.integers(0, 2**32 - 1))
def test_runs_between_whitespace_and_other_han(toks, name, text, seed):
    """Runs next to whitespace (the patterns' lookahead reads it at a text's end: the skeleton
    is not cut after it), next to Han-script characters outside the groups (Kimi's Han class
    runs on through them: no certain cut) and next to other scripts: canonical, split and
    greedy ids give the native encoding."""
    tok = toks[name]
    rng = random.Random(seed)
    native = tok.encode(text)
    guesses = [list(native), split_some(tok, native, rng), greedy(tok, text)]
    assert tok.encode_batch([text] * 3, guesses=guesses) == [native] * 3


def test_whole_runs_with_a_failing_pair_are_encoded_again(toks, monkeypatch):
    """Kimi: a Han run between characters outside its class is a pre-token of its own; one whose
    ids split a token into two Han tokens fails a pair, and the sample's encoding is its ids with
    that run encoded again (not the whole sample): the native encoding, every time."""
    from recon.tokenizers.fast.canonical import CanonicalCheck

    tok = toks["kimi-k2.5"]
    table = tok.bytes_to_id
    two = [t for t in tok.token_bytes[:150000] if len(t) == 6 and t.decode("utf-8", "replace")[:1] in HAN
           and t.decode("utf-8", "replace")[1:] in HAN and t[:3] in table and t[3:] in table]
    assert len(two) > 50
    rng = random.Random(2)
    texts, guesses = [], []
    for _ in range(60):
        words = [rng.choice(two).decode() for _ in range(rng.randrange(1, 4))]
        text = "，".join(words) + rng.choice(["。", "\n", "%s", " ok"])
        ids = tok.encode(text)
        k = rng.choice([j for j, i in enumerate(ids) if tok.token_bytes[i] in two] or [None])
        if k is not None:
            data = tok.token_bytes[ids[k]]
            ids = ids[:k] + [table[data[:3]], table[data[3:]]] + ids[k + 1:]
        texts.append(text)
        guesses.append(ids)
    fixed = []
    by_runs = CanonicalCheck._by_runs

    def spy(self, *args):
        got = by_runs(self, *args)
        fixed.extend(got[1].values() if got is not None else [])
        return got

    monkeypatch.setattr(CanonicalCheck, "_by_runs", spy)
    assert tok.encode_batch(texts, guesses=guesses) == [tok.encode(t) for t in texts]
    assert fixed
