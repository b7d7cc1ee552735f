"""Untrusted input files: tiktoken ranks files, tokenizer.json / tokenizer_config.json, and sample files
(JSONL, .jsonl.gz, Parquet) through `recon tokens`, `validate`, `audit`, `reconstruct` and `export`.

What every test here holds a file to: a clear error naming the file (and line or field), exit code 2
where nothing usable is left, no traceback, and for sample files: every non-blank input line is either a
good record or a reported bad line (good + distinct bad lines == input lines), nothing silently dropped.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import recon.samples.io
from recon import TokenizerLoadError, load_tokenizer, specials
from recon.samples.io import iter_raw_lines, read_spans
from recon.cli import main

from .conftest import ROOT, qwen_ranks_path

EXAMPLES = int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def run(capsys, *args: str) -> tuple[int, str, str]:
    """``recon ARGS`` in this process: (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_line_error(capsys, *args: str) -> str:
    code, _, err = run(capsys, *args)
    assert code == 2 and err.startswith("recon: error: ") and err.count("\n") == 1, err
    return err[len("recon: error: "):].rstrip("\n")


# -- tiktoken ranks files ------------------------------------------------------------------------------------
N_RANKS = 300
RANKS = qwen_ranks_path().read_bytes().splitlines()[:N_RANKS]
DECLARED = {str(N_RANKS + k): {"content": f"<|special_{k}|>", "special": True} for k in range(4)}


def tiktoken_dir(directory: Path, lines: list[bytes], declared: object = None, config: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiktoken.model").write_bytes(b"\n".join(lines) + b"\n")
    cfg = {"added_tokens_decoder": DECLARED if declared is None else declared} if config is None else config
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg))
    return directory


def test_small_tiktoken_dir_loads(tmp_path):
    tok = load_tokenizer(tiktoken_dir(tmp_path, RANKS), family="kimi")
    assert tok.vocab_size == N_RANKS + 4 and tok.encode("<|special_2|>") == [N_RANKS + 2]


def _with_line(k: int, line: bytes) -> list[bytes]:
    return RANKS[:k] + [line] + RANKS[k + 1:]


RANKS_CASES = {
    "not base64": (_with_line(41, b"not*base64 41"), r"tiktoken\.model, line 42: expected 'BASE64 RANK', got 'not\*base64 41'"),
    "one field": (_with_line(9, b"IQ=="), r"line 10: expected 'BASE64 RANK'"),
    "three fields": (_with_line(9, RANKS[9] + b" 7"), r"line 10: expected 'BASE64 RANK'"),
    "rank not a number": (_with_line(9, RANKS[9].split()[0] + b" ten"), r"line 10: expected 'BASE64 RANK'"),
    "negative rank": (_with_line(9, RANKS[9].split()[0] + b" -9"), r"line 10: expected 'BASE64 RANK'"),
    "rank with underscores": (_with_line(9, RANKS[9].split()[0] + b" 1_0"), r"line 10: expected 'BASE64 RANK'"),
    "rank 10**30": (_with_line(9, RANKS[9].split()[0] + b" 1" + b"0" * 30), r"line 10: expected 'BASE64 RANK'"),
    "rank far past the others": (_with_line(9, RANKS[9].split()[0] + b" 4000000000"),
                                 r"tiktoken\.model: ranks: id 4000000000 is far beyond the 300 tokens"),
    "duplicate rank": (_with_line(9, RANKS[9].split()[0] + b" 3"), r"line 10: duplicate rank or token \(rank 3\)"),
    "duplicate token": (_with_line(9, RANKS[3].split()[0] + b" 9"), r"line 10: duplicate rank or token \(rank 9\)"),
    "invalid UTF-8 and NUL bytes": (_with_line(9, b"\xff\xfe\x00 9"), r"line 10: expected 'BASE64 RANK'"),
    "byte-order mark": ([b"\xef\xbb\xbf" + RANKS[0]] + RANKS[1:], r"line 1: expected 'BASE64 RANK'"),
    "empty file": ([b""], r"tiktoken\.model: no ranks in this file"),
}


@pytest.mark.parametrize("case", sorted(RANKS_CASES))
def test_bad_ranks_file_is_one_line_naming_file_and_line(case, tmp_path, capsys):
    lines, expected = RANKS_CASES[case]
    directory = tiktoken_dir(tmp_path / "tok", lines)
    message = one_line_error(capsys, "tokens", str(directory), "--family", "kimi")
    assert message.startswith(str(directory / "tiktoken.model")) and re.search(expected, message), message


def test_crlf_and_blank_lines_in_a_ranks_file_are_fine(tmp_path):
    directory = tmp_path / "tok"
    tiktoken_dir(directory, RANKS)
    (directory / "tiktoken.model").write_bytes(b"\r\n".join(RANKS[:100]) + b"\r\n\r\n" + b"\r\n".join(RANKS[100:]) + b"\r\n")
    tok = load_tokenizer(directory, family="kimi")
    assert tok.vocab_size == N_RANKS + 4 and tok.decode(tok.encode("hello world")) == "hello world"


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, N_RANKS - 1), st.one_of(
    st.binary(max_size=30),
    st.builds(lambda k, r: RANKS[k].split()[0] + b" " + str(r).encode(), st.integers(0, N_RANKS - 1), st.integers(-5, 2**40)),
    st.sampled_from(RANKS),
)), min_size=1, max_size=4))
def test_any_damage_to_a_ranks_file_loads_or_names_the_line(edits, tmp_path):
    lines = list(RANKS)
    for k, line in edits:
        lines[k] = line
    directory = tiktoken_dir(tmp_path / "tok", lines)
    try:
        tok = load_tokenizer(directory, family="kimi")
    except TokenizerLoadError as e:
        assert str(e).startswith(str(directory)) and "\n" not in str(e)
        assert re.search(r"tiktoken\.model(, line \d+:|: )", str(e)), str(e)
        return
    assert tok.vocab_size <= N_RANKS + 4 + recon.tokenizers.load.MAX_ID_GAP
    assert tok.decode(tok.encode("<|special_1|>")) == "<|special_1|>"


# -- tokenizer_config.json ---------------------------------------------------------------------------------
CONFIG_CASES = {
    "entry not an object": ({"300": "<|x|>"}, r"added_tokens_decoder\['300'\]: missing or empty 'content'"),
    "content not a string": ({"300": {"content": 5}}, r"added_tokens_decoder\['300'\]: missing or empty 'content'"),
    "empty content": ({"300": {"content": ""}}, r"missing or empty 'content'"),
    "special not a boolean": ({"300": {"content": "<|x|>", "special": "yes"}}, r"'special' must be true or false"),
    "key not an integer": ({"three hundred": {"content": "<|x|>"}}, r"\['three hundred'\]: the key is not an integer id"),
    "key of 5000 digits": ({"9" * 5000: {"content": "<|x|>"}}, r"the key is not an integer id"),
    "negative key": ({"-1": {"content": "<|x|>"}}, r"\['-1'\]: negative id"),
    "key 10**30": ({str(10**30): {"content": "<|x|>"}},
                   r"added_tokens_decoder: id 1000000000000000000000000000000 is far beyond the 300 tokens"),
    "key on an ordinary rank": ({"7": {"content": "<|x|>"}}, r"declared at id 7, which is the ordinary token"),
    "content declared twice": ({"300": {"content": "<|x|>"}, "301": {"content": "<|x|>"}}, r"'<\|x\|>' is declared twice \(ids 300 and 301\)"),
    "decoder a list": ([{"content": "<|x|>"}], r"added_tokens_decoder: expected an object of id -> token"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_added_tokens_decoder_is_one_line_naming_the_field(case, tmp_path, capsys):
    declared, expected = CONFIG_CASES[case]
    directory = tiktoken_dir(tmp_path / "tok", RANKS, declared)
    message = one_line_error(capsys, "tokens", str(directory), "--family", "kimi")
    assert message.startswith(str(directory / "tokenizer_config.json")) and re.search(expected, message), message


@pytest.mark.parametrize("content, expected", [
    (b'{"added_tokens_decoder": {"300": ', r"not valid JSON \(line 1, column \d+"),
    (b"[1, 2]", r"expected a JSON object at the top level"),
    (b"[" * 100_000 + b"]" * 100_000, r"nested too deeply"),
    (b'{"added_tokens_decoder": {"300": {"content": "\xff"}}}', r"cannot read"),
    (b'{"auto_map": 5}', r"auto_map: expected an object or a list, got int"),
    (b'{"tokenizer_class": ["x"]}', r"tokenizer_class: expected a string, got list"),
])
def test_broken_config_file_is_one_line(content, expected, tmp_path, capsys):
    directory = tiktoken_dir(tmp_path / "tok", RANKS)
    (directory / "tokenizer_config.json").write_bytes(content)
    message = one_line_error(capsys, "tokens", str(directory), "--family", "kimi")
    assert message.startswith(str(directory / "tokenizer_config.json")) and re.search(expected, message), message


def test_config_with_a_byte_order_mark_is_read(tmp_path):
    directory = tiktoken_dir(tmp_path / "tok", RANKS)
    path = directory / "tokenizer_config.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_tokenizer(directory, family="kimi").encode("<|special_3|>") == [N_RANKS + 3]


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 2**70), st.floats(allow_nan=False), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
ENTRY = st.one_of(JSON, st.fixed_dictionaries({"content": st.one_of(st.text(max_size=8), JSON)},
                                              optional={"special": st.one_of(st.booleans(), JSON)}))
KEY = st.one_of(st.integers(-3, 400).map(str), st.integers(0, 2**80).map(str), st.text(max_size=4))


@FUZZ
@given(declared=st.one_of(st.dictionaries(KEY, ENTRY, max_size=5), JSON))
def test_any_added_tokens_decoder_loads_or_is_refused_cleanly(declared, tmp_path):
    directory = tiktoken_dir(tmp_path / "tok", RANKS, declared)
    try:
        tok = load_tokenizer(directory, family="kimi")
    except TokenizerLoadError as e:
        assert str(e).startswith(str(directory / "tokenizer_config.json")) and "\n" not in str(e), str(e)
        return
    for token_id, token in tok.declared.items():  # loaded: every declared token is at its declared id
        assert tok.added_by_content[token.content].id == token_id
        assert tok.encode(token.content) == [token_id]
    assert len(specials.discover(tok)) == len(tok.added_tokens)


# -- tokenizer.json --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_tokenizer_json() -> dict:
    """A real byte-level BPE tokenizer.json (the tokenizers library's own format), small."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from recon.tokenizers.bytelevel import bytes_to_piece

    vocab = {bytes_to_piece(bytes([b])): b for b in range(256)}
    vocab.update({"Ġt": 256, "he": 257, "Ġthe": 258})
    core = Tokenizer(models.BPE(vocab, [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(["<|end|>"])
    return json.loads(core.to_str())


def _tokenizer_json(tmp_path: Path, data: object, raw: bytes | None = None) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(raw if raw is not None else json.dumps(data).encode())
    return path


def test_small_tokenizer_json_loads(small_tokenizer_json, tmp_path):
    tok = load_tokenizer(_tokenizer_json(tmp_path, small_tokenizer_json))
    assert tok.encode(" the<|end|>") == [258, 259] and tok.vocab_size == 260


def _edited(data: dict, path: tuple, value: object) -> dict:
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize("path, value, expected", [
    (("model", "vocab"), {}, r"not a tokenizer\.json the tokenizers library can read|model\.vocab: the vocabulary is empty"),
    (("model", "vocab", "Ġthe"), 4_000_000_000, r"model\.vocab: id 4000000000 is far beyond the 260 tokens"),
    (("model", "vocab", "Ġthe"), -1, r"not a tokenizer\.json the tokenizers library can read"),
    (("model", "vocab", "Ġthe"), 10**30, r"not a tokenizer\.json the tokenizers library can read"),
    (("model", "type"), "Mystery", r"not a tokenizer\.json the tokenizers library can read"),
    (("model", "merges"), [["Ġ", "zz"]], r"not a tokenizer\.json the tokenizers library can read"),
    (("added_tokens",), "x", r"not a tokenizer\.json the tokenizers library can read"),
    (("added_tokens", 0, "id"), "x", r"not a tokenizer\.json the tokenizers library can read"),
    (("truncation",), [{"\n": None}], r"not a tokenizer\.json the tokenizers library can read \(unknown variant"),
    (("normalizer",), [""], r"tokenizers fails on this file when encoding \(PanicException: index out of bounds"),
])
def test_bad_tokenizer_json_is_one_line(small_tokenizer_json, tmp_path, capsys, path, value, expected):
    tj = _tokenizer_json(tmp_path, _edited(small_tokenizer_json, path, value))
    message = one_line_error(capsys, "tokens", str(tj))
    assert message.startswith(str(tj)) and re.search(expected, message), message


def test_a_rust_panic_is_one_line_on_stderr(small_tokenizer_json, tmp_path):
    """tokenizers panics on first use of this file; Rust prints its own backtrace straight to fd 2.
    recon sets that aside: stderr is the one line, even with RUST_BACKTRACE=1."""
    tj = _tokenizer_json(tmp_path, _edited(small_tokenizer_json, ("normalizer",), [""]))
    done = subprocess.run([sys.executable, "-m", "recon.cli", "tokens", str(tj)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "RUST_BACKTRACE": "1"})
    assert done.returncode == 2
    assert done.stderr.startswith(f"recon: error: {tj}: tokenizers fails on this file when encoding (PanicException: ")
    assert done.stderr.count("\n") == 1 and "panicked" not in done.stderr


@pytest.mark.parametrize("raw, expected", [
    (b'{"model": {"type": "BPE", "vocab": {', r"not valid JSON \(line 1"),
    (b"[" * 100_000, r"nested too deeply|not valid JSON"),
    (b'{"version": "1.0", "model": "\xff\xfe"}', r"cannot read"),
    (b"", r"not valid JSON"),
])
def test_broken_tokenizer_json_is_one_line(tmp_path, capsys, raw, expected):
    tj = _tokenizer_json(tmp_path, None, raw)
    message = one_line_error(capsys, "tokens", str(tj))
    assert message.startswith(str(tj)) and re.search(expected, message), message


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,)) if k != "vocab" else [prefix + (k,), prefix + (k, "Ġthe")]
    elif isinstance(node, list):
        for k, v in enumerate(node[:2]):
            out += _paths(v, prefix + (k,))
    return out


@FUZZ
@given(data=st.data())
def test_any_edit_of_a_tokenizer_json_loads_or_is_refused_cleanly(small_tokenizer_json, tmp_path, data):
    where = data.draw(st.sampled_from(_paths(small_tokenizer_json)))
    value = data.draw(JSON)
    tj = _tokenizer_json(tmp_path, _edited(small_tokenizer_json, where, value))
    try:
        tok = load_tokenizer(tj)
    except TokenizerLoadError as e:
        assert str(e).startswith(str(tj)) and "\n" not in str(e), str(e)
        return
    try:  # a native panic is a BaseException: made an assertion so hypothesis shrinks and shows the case
        ids = tok.encode(" the cat")
        text = tok.decode(ids)
    except BaseException as e:
        raise AssertionError(f"{where} = {value!r}: {type(e).__name__}: {e}") from None
    assert all(0 <= i < tok.vocab_size for i in ids) and isinstance(text, str)
    assert len(specials.discover(tok)) == len(tok.added_tokens)


# -- sample files ---------------------------------------------------------------------------------------------
REAL = (ROOT / "data" / "smollm2-t0.7.jsonl").read_bytes().splitlines()[:12]
ERROR = re.compile(r"^(?P<path>.+?), line (?P<line>\d+)(, field (?P<field>[^:]+))?: (?P<problem>.+)$")
COMMANDS = ["validate", "audit", "reconstruct", "export"]


def _real(k: int, **change) -> bytes:
    obj = json.loads(REAL[k % len(REAL)])
    obj.update(change)
    return json.dumps(obj).encode()


def corrupt_corpus() -> tuple[list[bytes], dict[int, str]]:
    """Real records with bad lines between them: (lines, {bad line number: field it names or ""})."""
    good = [_real(k, id=f"g{k}") for k in range(16)]
    bad = [
        (b'{"id": "x1", "output_ids": [1, 2,', ""),
        (_real(1, id="x2", output_ids=[504, 1.5]), "output_ids"),
        (_real(1, id="x3", output_ids=[True, 2]), "output_ids"),
        (_real(1, id="x4", output_ids=["504"]), "output_ids"),
        (_real(1, id="x5", output_ids=[[504]]), "output_ids"),
        (_real(1, id="x6", output_ids=[-1, 2]), "output_ids"),
        (_real(1, id="x7", output_ids=[49152]), "output_ids"),
        (_real(1, id="x8", output_ids=[10**30]), "output_ids"),
        (_real(2, id="g1"), "id"),  # duplicate id
        (_real(1, id="x9", response={"content": 7}), "response.content"),
        (_real(1, id="x10", prompt_ids=[1, -2]), "prompt_ids"),
        (b'{"id": "x11", "output_ids": [504, 2], "note": "caf\xe9"}', ""),  # Latin-1, not UTF-8
        (b'{"id": "x12", "response": {"content": "\\ud800"}}', "response.content"),
        (b"[" * 50_000 + b"]" * 50_000, ""),
        (b'{"id": "x13", "output_ids": [1' + b"0" * 5000 + b"]}", ""),
        (b"\x00\x01\x02", ""),
        (b'"just a string"', ""),
    ]
    lines: list[bytes] = []
    expected: dict[int, str] = {}
    for k, (line, field) in enumerate(bad):
        lines.append(good[k] if k < len(good) else b"")  # blank lines are not records
        lines.append(line)
        expected[len(lines)] = field
    lines += good[len(bad):] + [b"   "]
    lines[0] = b"\xef\xbb\xbf" + lines[0]  # a BOM on line 1 is skipped
    return lines, expected


def _write(path: Path, lines: list[bytes], newline: bytes = b"\n") -> Path:
    data = newline.join(lines) + newline
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def _good_count(command: str, code: int, out: str, path_out: Path) -> int:
    if command == "validate":
        return int(re.search(r"(\d+) good records", out).group(1))
    if command == "audit":
        return json.loads(out)["samples"]
    if command == "reconstruct":
        return sum(1 for _ in open(path_out, encoding="utf-8"))
    return pq.read_table(path_out).num_rows


def _args(command: str, data: Path, out: Path) -> list[str]:
    if command == "validate":
        return ["validate", str(data), "--tokenizer", "smollm2", "--max-errors", "10000"]
    common = ["--tokenizer", "smollm2", "--profile", "chatml"]
    if command == "audit":
        return ["audit", str(data), *common, "--workers", "1", "--json"]
    if command == "reconstruct":
        return ["reconstruct", str(data), *common, "--out", str(out)]
    return ["export", str(data), *common, "--workers", "1", "--out", str(out)]


def check_accounting(capsys, command: str, data: Path, tmp_path: Path) -> tuple[int, dict[int, set[str]]]:
    """Run ``command`` over ``data``: every stderr line is 'file, line N[, field F]: problem', and returns
    (good records, {reported line: fields})."""
    out_path = tmp_path / ("out.jsonl" if command == "reconstruct" else "out.parquet")
    code, out, err = run(capsys, *_args(command, data, out_path))
    assert code == 0, err
    reported: dict[int, set[str]] = {}
    for line in err.splitlines():
        m = ERROR.match(line)
        assert m and m["path"] == str(data), line
        reported.setdefault(int(m["line"]), set()).add(m["field"] or "")
    return _good_count(command, code, out, out_path), reported


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("form", ["jsonl", "crlf", "gz"])
def test_corrupt_sample_file_every_line_accounted_for(command, form, tmp_path, capsys):
    lines, expected = corrupt_corpus()
    data = _write(tmp_path / ("mixed.jsonl.gz" if form == "gz" else "mixed.jsonl"), lines,
                  b"\r\n" if form == "crlf" else b"\n")
    good, reported = check_accounting(capsys, command, data, tmp_path)
    non_blank = sum(1 for line in lines if line.strip())
    assert good + len(reported) == non_blank
    assert {line: fields for line, fields in reported.items()} == {line: {f} for line, f in expected.items()}
    assert good == 16


def test_invalid_utf8_line_is_reported_and_later_lines_read(tmp_path, capsys):
    lines = [_real(0, id="a"), b'{"id": "b", "output_ids": [504, 2], "x": "\xc3\x28"}', _real(2, id="c")]
    code, out, err = run(capsys, "validate", str(_write(tmp_path / "u.jsonl", lines)))
    assert code == 0 and "2 good records, 1 bad" in out
    assert err == f"{tmp_path / 'u.jsonl'}, line 2: not valid UTF-8 (byte {lines[1].index(0xC3)} of the line)\n"


def test_truncated_gzip_reads_up_to_the_damage(tmp_path, capsys):
    lines = [_real(k, id=f"r{k}") for k in range(200)]
    full = gzip.compress(b"\n".join(lines) + b"\n")
    cut = full[: len(full) // 2]
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(cut)
    readable = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")  # complete lines before the cut
    for command in COMMANDS:
        good, reported = check_accounting(capsys, command, path, tmp_path)
        assert good == readable and list(reported) == [readable + 1]
    _, _, err = run(capsys, "validate", str(path))
    assert f"line {readable + 1}: file is cut or corrupt here (Compressed file ended before the end-of-stream marker" in err


def test_not_gzip_at_all(tmp_path, capsys):
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(b"\n".join(REAL[:3]))
    code, out, err = run(capsys, "validate", str(path))
    assert code == 2 and "0 good records, 1 bad" in out
    assert err.startswith(f"{path}, line 1: file is cut or corrupt here (Not a gzipped file")


def test_a_50_mb_line_is_read_and_an_oversized_line_is_skipped(tmp_path, capsys, monkeypatch):
    big = json.dumps({"id": "big", "response": {"content": "x" * 50_000_000}}).encode()
    path = _write(tmp_path / "big.jsonl", [_real(0, id="a"), big, _real(1, id="b")])
    code, out, err = run(capsys, "validate", str(path))
    assert code == 0 and "3 good records, 0 bad" in out and err == ""
    monkeypatch.setattr(recon.samples.io, "MAX_LINE_BYTES", 1_000_000)
    code, out, err = run(capsys, "validate", str(path))
    assert code == 0 and "2 good records, 1 bad" in out
    assert err == f"{path}, line 2: line longer than 1000000 bytes; skipped\n"
    spanned = read_spans([(str(path), n, item) for n, item in iter_raw_lines(path, spans=True)])  # (what local workers read)
    assert [(n, type(item).__name__) for _, n, item in spanned] == [(1, "bytes"), (2, "RecordError"), (3, "bytes")]
    assert [item for _, _, item in spanned if type(item) is bytes] == [_real(0, id="a") + b"\n", _real(1, id="b") + b"\n"]
    path.write_bytes(b"x" * 3_000_000)  # no newline at all
    code, out, err = run(capsys, "validate", str(path))
    assert code == 2 and "0 good records, 1 bad" in out and "line 1: line longer than" in err


def test_all_bad_file_exits_2_without_traceback(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [b"{", b'{"id": 5.5}', b"\xff"])
    for args, needle in [
        (["validate", str(path)], f"{path}, line 3: not valid UTF-8"),
        (["audit", str(path), "--tokenizer", "smollm2", "--profile", "chatml", "--workers", "1"],
         f"no usable records in {path} (3 bad; first: {path}, line 1: not valid JSON"),
        (["export", str(path), "--tokenizer", "smollm2", "--profile", "chatml", "--out", str(tmp_path / "e.parquet")],
         "no usable records"),
    ]:
        done = subprocess.run([sys.executable, "-m", "recon.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr and needle in done.stderr, done.stderr


# -- Parquet ---------------------------------------------------------------------------------------------
def _parquet(path: Path, rows: list[dict], ids_type: pa.DataType = pa.int64()) -> Path:
    schema = pa.schema([("id", pa.string()), ("output_ids", pa.list_(ids_type)),
                        ("response", pa.struct([("content", pa.string())]))])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_parquet_bad_rows_are_reported_by_row(tmp_path, capsys):
    rows = [
        {"id": "a", "output_ids": [504, 2]},
        {"id": "b", "output_ids": [-1, 2]},
        {"id": "c", "output_ids": [49152]},
        {"id": None, "output_ids": [504]},
        {"id": "a", "output_ids": [504]},
        {"id": "d", "output_ids": None, "response": None},
        {"id": "e", "response": {"content": "Paris."}},
    ]
    path = _parquet(tmp_path / "s.parquet", rows)
    for command in COMMANDS:
        good, reported = check_accounting(capsys, command, path, tmp_path)
        assert good == 2 and reported == {2: {"output_ids"}, 3: {"output_ids"}, 4: {"id"}, 5: {"id"}, 6: {"output_ids"}}


def test_parquet_ids_as_floats_and_a_broken_file(tmp_path, capsys):
    path = _parquet(tmp_path / "f.parquet", [{"id": "a", "output_ids": [504.0, 2.0]}], pa.float64())
    code, out, err = run(capsys, "validate", str(path))
    assert code == 2 and err == f"{path}, line 1, field output_ids: item 0 is 504.0 (float), not an int\n"
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(path.read_bytes()[:-30])
    code, out, err = run(capsys, "validate", str(cut))
    assert code == 2 and err.startswith(f"{cut}, line 1: not a readable Parquet file")


# -- property: any mix of lines, any command ----------------------------------------------------------------
IDS = st.lists(st.one_of(st.integers(0, 49151), st.integers(-3, 2**70), st.floats(), st.booleans(), st.text(max_size=3),
                         st.lists(st.integers(0, 5), max_size=2)), max_size=6)
RESPONSE = st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "content": st.one_of(st.text(max_size=20), JSON), "reasoning_content": st.one_of(st.text(max_size=10), JSON),
    "tool_calls": st.one_of(JSON, st.lists(st.fixed_dictionaries({"function": st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=5), JSON), "arguments": st.one_of(st.text(max_size=10), JSON)})}), max_size=2)),
    "logprobs": st.one_of(JSON, st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries(
        {"token": st.one_of(st.text(max_size=4), JSON)},
        optional={"bytes": st.one_of(JSON, st.lists(st.integers(-1, 300), max_size=4)), "token_id": JSON}), max_size=3)})),
}))
RECORD = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.sampled_from(["a", "b", "c"]), JSON), "dataset": st.one_of(st.just("d"), JSON),
    "output_ids": st.one_of(IDS, JSON), "response": RESPONSE, "prompt_ids": st.one_of(IDS, JSON),
    "messages": JSON, "meta": JSON,
})
TEXT = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(["<|im_end|>", "<|im_start|>", "<think>", " ", "\n", "é😀"])),
                max_size=5).map("".join)
VALID = st.fixed_dictionaries(  # well-formed records with odd contents: they must audit without crashing
    {"id": st.text(min_size=1, max_size=4)},
    optional={"output_ids": st.lists(st.integers(0, 49151), min_size=1, max_size=12),
              "response": st.fixed_dictionaries({"content": TEXT}, optional={"reasoning_content": TEXT}),
              "prompt_ids": st.lists(st.integers(0, 49151), max_size=3)},
)
LINE = st.one_of(
    st.sampled_from(REAL),
    VALID.map(lambda r: json.dumps(r).encode()),
    RECORD.map(lambda r: json.dumps(r).encode()),
    RECORD.map(lambda r: json.dumps(r).encode()).flatmap(lambda b: st.integers(0, len(b)).map(lambda k: b[:k])),
    st.binary(max_size=20),
    st.just(b'{"id": "s", "response": {"content": "\\udfff"}}'),
)


@FUZZ
@given(lines=st.lists(LINE, min_size=1, max_size=8), crlf=st.booleans(), bom=st.booleans())
def test_any_sample_file_every_line_accounted_for(lines, crlf, bom, tmp_path_factory):
    from recon.audit.engine import audit_files
    from recon.errors import ReconError
    from recon.samples.records import read_records

    tmp = tmp_path_factory.mktemp("fuzz")
    lines = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines]
    if bom:
        lines[0] = b"\xef\xbb\xbf" + lines[0]
    path = _write(tmp / "fuzz.jsonl", lines, b"\r\n" if crlf else b"\n")
    first = lines[0].removeprefix(b"\xef\xbb\xbf")  # one BOM at the very start is skipped
    non_blank = sum(1 for line in [first, *lines[1:]] if line.strip())
    result = read_records(path, vocab_size=49152)
    for e in result.errors:
        assert ERROR.match(str(e)) and e.path == str(path) and 1 <= e.line <= len(lines)
    # a local worker reads its lines from where the reader says they are: the same bytes, line by
    # line, as Python's own split of the file at "\n"
    want = re.findall(rb"[^\n]*\n|[^\n]+\Z", path.read_bytes())
    spanned = read_spans([(str(path), n, item) for n, item in iter_raw_lines(path, spans=True)])
    assert [item for _, _, item in spanned] == want and [n for _, n, _ in spanned] == list(range(1, len(want) + 1))
    assert len(result.records) + result.bad_records == non_blank
    event(f"{'some' if result.records else 'no'} good records, {'some' if result.errors else 'no'} bad")
    try:  # the good records audit and export without crashing; nothing left out
        run_ = audit_files([path], tokenizer="smollm2", profile="chatml", workers=1, export_path=tmp / "e.parquet")
    except ReconError as e:
        assert not result.records and "no usable records" in str(e)
        return
    assert run_.summary["samples"] == len(result.records) == pq.read_table(tmp / "e.parquet").num_rows


# -- profile YAML files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("content, expected", [
    (b"mine:\n  end: !!python/object/apply:os.system ['touch MARKER']\n", r", line 2: not valid YAML \(could not determine a constructor"),
    (b"mine:\n  end: '<|im_end|>'\n  call: [1, 2]\n", r"mine\.call: expected a string, got list"),
    (b"mine:\n  end: '<|im_end|>'\n  reasoning_close: 5\n", r"mine\.reasoning_close: expected a string, got int"),
    (b"mine:\n  end: '<|im_end|>'\n  tools_begin: null\n", r"mine\.tools_begin: expected a string, got NoneType"),
    (b"mine:\n  end: '\xff'\n", r"cannot read"),
    (b"mine: [unclosed\n", r"not valid YAML"),
])
def test_bad_profile_yaml_is_one_line_and_runs_nothing(content, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mine.yaml"
    path.write_bytes(content)
    data = _write(tmp_path / "s.jsonl", REAL[:2])
    message = one_line_error(capsys, "audit", str(data), "--tokenizer", "smollm2", "--profile", str(path), "--workers", "1")
    assert message.startswith(str(path)) and re.search(expected, message), message
    assert not (tmp_path / "MARKER").exists()
