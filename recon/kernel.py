"""The per-id loops an audit runs over every id of every record: compiled where the install
built ``recon/_kernel.c``, else the Python twins below, which give the same answers (and are
what the tests hold the compiled ones to).

Why: on cold data each id is validated, looked up, copied into a chunk's array, cut into
stretches and each stretch looked up, and in Python (or NumPy, a pass each) every one of those
touches costs an interpreter step (together about half of an audit's time on cold data). The extension is built by ``pip install`` where a C compiler is present; without one the
install still succeeds (the extension is optional) and these twins run; ``RECON_KERNEL=0`` runs
them on purpose. :data:`COMPILED` says which ran.
"""

from __future__ import annotations

import binascii
import os
import re
from itertools import chain
from typing import Sequence

import numpy as np


def ids_ok_py(value: object, vocab_size: int) -> bool:
    """Whether ``value`` is a non-empty list of ints (not bools) in ``0..vocab_size-1`` (any id
    ``>= 0`` where ``vocab_size`` is negative: not known)."""
    return (type(value) is list and bool(value) and set(map(type, value)) == {int} and min(value) >= 0
            and (vocab_size < 0 or max(value) < vocab_size))


def join_py(ids: Sequence[int], table: list, text: bool) -> bytes | str | None:
    """The bytes ``table`` holds for each id, joined (decoded as UTF-8, invalid bytes replaced,
    where ``text``); None where ``ids`` is not a list or tuple of ints indexing a bytes entry."""
    if type(ids) not in (list, tuple) or not set(map(type, ids)) <= {int} or min(ids, default=0) < 0:
        return None
    try:
        data = b"".join(map(table.__getitem__, ids))
    except (IndexError, TypeError):  # past the table, or an entry that is not bytes (None)
        return None
    return data.decode("utf-8", "replace") if text else data


def join_each_py(lists: list, table: list, text: bool) -> list[bytes | str | None]:
    """:func:`join_py` of each item of ``lists``."""
    if type(lists) is not list or type(table) is not list:
        raise TypeError("join_each: expected lists")
    return [join_py(ids, table, text) for ids in lists]


def flatten_py(lists: list) -> bytes:
    """Every id of every list (or tuple) in ``lists``, in order, as native int64 bytes; TypeError
    for an item that is not an int, OverflowError past int64."""
    if any(type(ids) not in (list, tuple) for ids in lists) or \
            not set(map(type, chain.from_iterable(lists))) <= {int}:
        raise TypeError("flatten: expected lists or tuples of ints")
    return np.fromiter(chain.from_iterable(lists), np.int64).tobytes()


def count_in_py(texts: list[str], needles: list[str]) -> bytes:
    """Per text: how often the needles occur in it (``str.count`` each, summed), as native int64 bytes."""
    if any(type(n) is not str for n in needles) or any(type(t) is not str for t in texts):
        raise TypeError("count_in: expected lists of str")
    return np.array([sum(map(text.count, needles)) for text in texts], dtype=np.int64).tobytes()


def slices_py(flat, starts, sizes) -> list[list[int]]:
    """``flat[starts[k] : starts[k] + sizes[k]]`` for each k, as lists of ints (all three int64
    arrays or buffers; IndexError for a slice outside ``flat``)."""
    flat, starts, sizes = (np.frombuffer(memoryview(a).cast("B"), np.int64) for a in (flat, starts, sizes))
    if len(starts) != len(sizes):
        raise ValueError("slices: expected int64 buffers, as many sizes as starts")
    if len(starts) and ((starts < 0).any() or (sizes < 0).any() or (starts > len(flat) - sizes).any()):
        raise IndexError("slices: a slice runs outside the ids")
    return [flat[a : a + n].tolist() for a, n in zip(starts.tolist(), sizes.tolist())]


def ascii_texts_py(table: list) -> list[str | None]:
    """For each item of ``table``: its text where it is non-empty bytes of ASCII only, else None."""
    if type(table) is not list:
        raise TypeError("ascii_texts: expected a list")
    return [data.decode("ascii") if type(data) is bytes and data and data.isascii() else None for data in table]


class KeySetPy:
    """A set of uint64 keys: ``add(keys)`` and ``find(keys)`` (bytes, 1 where a key is held) take
    any buffer of native uint64 (a NumPy array); ``keys()``, ``len()``. (A Python set of ints inside.)"""

    def __init__(self):
        self._keys: set[int] = set()

    def _ints(self, keys) -> list[int]:
        view = memoryview(keys).cast("B")
        if len(view) % 8:
            raise ValueError("KeySet: expected a buffer of uint64 keys")
        return np.frombuffer(view, np.uint64).tolist()

    def add(self, keys) -> None:
        self._keys.update(self._ints(keys))

    def find(self, keys) -> bytes:
        return bytes(map(self._keys.__contains__, self._ints(keys)))

    def keys(self) -> bytes:
        """Every key held, as native uint64 bytes, in no order."""
        return np.array(list(self._keys), dtype=np.uint64).tobytes()

    def __len__(self) -> int:
        return len(self._keys)


def cut_table(first, last, added, ends_space, space_word) -> np.ndarray:
    """:func:`cut`'s table: per id, ``first | last << 8`` (the classes of its first and last
    character) with flags in bits 16-18 (an added token; ends with whitespace; a word a space
    may open)."""
    return (np.asarray(first, np.uint32) | np.asarray(last, np.uint32) << 8 | np.asarray(added, np.uint32) << 16
            | np.asarray(ends_space, np.uint32) << 17 | np.asarray(space_word, np.uint32) << 18)


def cut_py(flat, starts, table, rules, bits: int, pack: int) -> tuple[bytes, bytes, bytes]:
    """The ids of a batch of samples cut into stretches (``flat``: every sample's ids, int64;
    ``starts``: where each begins, strictly increasing from 0): before each sample's first id, and
    between ids a and b where ``rules[last(a), first(b)]`` (a square table of 0/1 bytes), where a
    or b is an added token, or where a ends with whitespace and b starts a word a space may open
    (``table``: :func:`cut_table`, a uint32 per id). Returns each stretch's first index and size
    (int64) and its key (uint64): a stretch of 2..``pack`` ids packed into one int, id + 1 in each
    ``bits`` bits from the low end, else 0; all as bytes."""
    flat, starts = np.asarray(flat, np.int64), np.asarray(starts, np.int64)
    table = np.frombuffer(memoryview(table).cast("B"), np.uint32)
    rules = np.frombuffer(memoryview(rules).cast("B"), np.uint8)
    classes = int(round(len(rules) ** 0.5))
    if len(memoryview(table).cast("B")) % 4 or classes * classes != len(rules) or classes > 256 \
            or bits < 1 or pack < 1 or bits * pack > 64:
        raise ValueError("cut: expected a uint32 entry per id, a square rules table of at most 256 classes, "
                         "bits * pack <= 64")
    first, last, flags = table & 0xFF, (table >> 8) & 0xFF, table >> 16
    if np.any(first >= classes) or np.any(last >= classes):
        raise ValueError("cut: the class of some id is not in the rules")
    if np.any(rules > 1):
        raise ValueError("cut: the rules must be 0 or 1")
    if len(flat) and (flat.min() < 0 or flat.max() >= len(table)):
        raise ValueError("cut: an id is not in the table")
    if (len(starts) == 0) != (len(flat) == 0) or (len(starts) and starts[0] != 0) \
            or np.any(np.diff(starts) <= 0) or (len(starts) and starts[-1] >= len(flat)):
        raise ValueError("cut: starts must increase from 0 and stay inside the ids")
    fresh = np.zeros(len(flat), dtype=bool)
    fresh[starts] = True
    a, b = flat[:-1], flat[1:]
    fresh[1:] |= (rules.reshape(classes, classes)[last[a], first[b]].astype(bool) | (((flags[a] | flags[b]) & 1) > 0)
                  | (((flags[a] & 2) > 0) & ((flags[b] & 4) > 0)))
    at = np.flatnonzero(fresh).astype(np.int64)
    size = np.diff(np.append(at, len(flat))).astype(np.int64)
    keys = np.zeros(len(at), dtype=np.uint64)
    packed = (size >= 2) & (size <= pack)
    for j in range(pack):
        inside = packed & (size > j)
        keys[inside] |= (flat[at[inside] + j] + 1).astype(np.uint64) << np.uint64(bits * j)
    return at.tobytes(), size.tobytes(), keys.tobytes()


def unsettled_py(flat, starts, table, rules, bits: int, pack: int, single, runs) -> tuple[bytes, ...]:
    """The stretches :func:`cut_py` cuts that are not known to be their own text's encoding, in
    order, as int64 bytes: (first index, length, sample, key, kind, first row). Known are an added token alone,
    a lone id whose ``single[id]`` (int8 per id) is 1, a packed stretch whose key ``runs`` (a
    KeySet) holds. The rest, by kind: 0 a lone id whose ``single[id]`` is 0, 1 a lone id whose
    ``single[id]`` is neither, 2 a packed stretch not in ``runs``, 3 one of more than ``pack`` ids.
    First row: the row that first lists the same ids (itself, the first time; kind 0 always itself)."""
    at, size, keys = (np.frombuffer(part, kind) for part, kind in
                      zip(cut_py(flat, starts, table, rules, bits, pack), (np.int64, np.int64, np.uint64)))
    flat = np.asarray(flat, np.int64)
    single = np.frombuffer(memoryview(single).cast("B"), np.int8)
    table = np.frombuffer(memoryview(table).cast("B"), np.uint32)
    if len(single) != len(table):
        raise ValueError("unsettled: expected one int8 in single per id of the table")
    kind = np.full(len(at), -1, dtype=np.int64)
    lone = (size == 1) & ((table[flat[at]] >> 16) & 1 == 0)
    known = single[flat[at]]
    kind[lone & (known == 0)] = 0
    kind[lone & (known != 0) & (known != 1)] = 1
    packed = np.flatnonzero(keys)
    kind[packed[np.frombuffer(runs.find(keys[packed]), dtype=bool) == 0]] = 2
    kind[size > pack] = 3
    sample = np.searchsorted(np.asarray(starts, np.int64), at, side="right") - 1
    listed = kind >= 0
    at, size, sample, keys, kind = (part[listed].astype(np.int64) for part in (at, size, sample, keys.astype(np.int64), kind))
    first, seen, data = np.arange(len(at), dtype=np.int64), {}, flat.tobytes()
    for row, (a, n, k, key) in enumerate(zip(at.tolist(), size.tolist(), kind.tolist(), keys.tolist())):
        if k >= 1:  # (a lone id's key is the id; a longer stretch's its ids' bytes)
            same = key if k == 2 else data[a * 8 : (a + n) * 8] if k == 3 else int(flat[a])
            first[row] = seen.setdefault((k, same), row)
    return tuple(part.tobytes() for part in (at, size, sample, keys, kind, first))


def unglue_check_py(ids: list, stretches: list, lengths, glue_id: int, glue_size: int) -> bytes | None:
    """``ids``, one encoding of the texts of ``stretches`` (lists of ids) glued together with a glue
    of ``glue_size`` bytes between each two, cut back apart where the glues lie (by bytes; ``lengths``:
    each id's byte length, int64): per stretch 1 where the ids between its glues are exactly the
    stretch, else 0; None where the ids don't come apart there (a token across a glue's edge, a
    glue place not held by ``glue_id`` alone, ids left over, an id with no length)."""
    length = np.frombuffer(memoryview(lengths).cast("B"), np.int64).tolist()

    def size_of(some) -> int | None:
        if any(type(i) is not int or not 0 <= i < len(length) for i in some):
            return None
        return sum(length[i] for i in some)

    same, at = [], 0
    for k, want in enumerate(stretches):
        bytes_ = size_of(want) if type(want) is list else None
        if bytes_ is None:
            return None
        got, start = 0, at
        while got < bytes_ and at < len(ids):
            if size_of([ids[at]]) is None:
                return None
            got += length[ids[at]]
            at += 1
        if got != bytes_:
            return None
        same.append(ids[start:at] == want)
        if k + 1 < len(stretches):
            if at >= len(ids) or ids[at] != glue_id or not 0 <= glue_id < len(length) or length[glue_id] != glue_size:
                return None
            at += 1
    return bytes(same) if at == len(ids) else None


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


def bpe_table_py(data: bytes, offsets: bytes, include: bytes) -> dict[bytes, int]:
    """The ids whose ``include`` byte is 1 (``offsets``: native int64, n + 1; token i is
    ``data[offsets[i]:offsets[i + 1]]``) by their bytes, the first of equal bytes kept (the
    compiled one: the same as an int32 hash table, opaque to the caller)."""
    at = np.frombuffer(offsets, np.int64)
    if len(at) < 1 or len(include) != len(at) - 1:
        raise ValueError("bpe_table: expected int64 offsets and a byte per id")
    table: dict[bytes, int] = {}
    for i, keep in enumerate(include):
        if keep:
            table.setdefault(data[at[i] : at[i + 1]], i)
    return table


def bpe_pairs_py(a: bytes, b: bytes, data: bytes, offsets: bytes, table: dict[bytes, int]) -> bytes:
    """Per pair (``a[k]``, ``b[k]``, native int64 ids): 1 where tiktoken's single-piece encode of
    a's bytes then b's (a piece that is a token is that token; else merge, again and again, the
    leftmost adjacent parts whose joined bytes have the lowest rank, the rank being the id, among
    ``table``'s) is exactly [a, b], else 0."""
    at = np.frombuffer(offsets, np.int64).tolist()
    n = len(at) - 1
    out = bytearray()
    for x, y in zip(np.frombuffer(a, np.int64).tolist(), np.frombuffer(b, np.int64).tolist()):
        if not (0 <= x < n and 0 <= y < n) or at[x] == at[x + 1] or at[y] == at[y + 1]:
            out.append(0)
            continue
        left, piece = data[at[x] : at[x + 1]], data[at[x] : at[x + 1]] + data[at[y] : at[y + 1]]
        if piece in table:
            out.append(0)
            continue
        parts = list(range(len(piece) + 1))  # where each part starts, then the end
        while True:
            ranks = [table.get(piece[parts[k] : parts[k + 2]]) for k in range(len(parts) - 2)]
            best = min((r for r in ranks if r is not None), default=None)
            if best is None:
                break
            del parts[ranks.index(best) + 1]
        out.append(int(parts == [0, len(left), len(piece)] and table.get(left) == x and table.get(piece[len(left):]) == y))
    return bytes(out)


def digit_run_py(data: bytes, n: int) -> bool:
    """Whether ``data`` holds ``n`` ASCII digits in a row (a run of zeros once every digit is one)."""
    return b"0" * n in bytes(data).translate(_DIGITS_AS_ZERO)


#: A whole ranks file of well-formed lines: ``BASE64 RANK`` each.
RANKS_FILE = re.compile(rb"(?:[A-Za-z0-9+/]+={0,2} [0-9]{1,10}\r?\n)*(?:[A-Za-z0-9+/]+={0,2} [0-9]{1,10}\r?\n?)?")


def parse_ranks_py(data: bytes) -> tuple[dict[bytes, int], int] | None:
    """A tiktoken ranks file whose every line is ``BASE64 RANK`` (:data:`RANKS_FILE`) as
    ({token bytes: rank}, lines); None for any other (or base64 that doesn't decode)."""
    if not RANKS_FILE.fullmatch(data):
        return None
    parts = data.split()  # token, rank, token, rank... (each line is exactly one of each)
    try:
        return dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2]))), len(parts) // 2
    except (ValueError, binascii.Error):  # (a padding error, say)
        return None


try:
    if os.environ.get("RECON_KERNEL") == "0":  # the twins on purpose (to compare, or to debug)
        raise ImportError("RECON_KERNEL=0")
    from recon._kernel import KeySet, ascii_texts, count_in, cut, digit_run, flatten, ids_ok, join, join_each
    from recon._kernel import bpe_pairs, bpe_table, unglue_check, unsettled
    from recon._kernel import parse_ranks as _parse_ranks
    from recon._kernel import slices as _slices

    COMPILED = True
except ImportError:  # built without a C compiler: the same answers, slower
    ids_ok, join, flatten, count_in, _slices = ids_ok_py, join_py, flatten_py, count_in_py, slices_py
    ascii_texts, digit_run, KeySet, join_each, cut = ascii_texts_py, digit_run_py, KeySetPy, join_each_py, cut_py
    unsettled, unglue_check = unsettled_py, unglue_check_py
    bpe_table, bpe_pairs = bpe_table_py, bpe_pairs_py
    _parse_ranks = parse_ranks_py
    COMPILED = False


def parse_ranks(data: bytes) -> tuple[dict[bytes, int], int] | None:
    """:func:`parse_ranks_py`'s answer, from one C pass where the file is plain (every line's
    base64 whole quanta); the regex and ``binascii`` otherwise (odd padding the C pass leaves
    to them)."""
    got = _parse_ranks(data)
    return got if got is not None else parse_ranks_py(data)


def slices(flat: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> list[list[int]]:
    """``flat[starts[k] : starts[k] + sizes[k]].tolist()`` for each k (arrays of ints)."""
    return _slices(*(np.ascontiguousarray(a, dtype=np.int64) for a in (flat, starts, sizes)))
