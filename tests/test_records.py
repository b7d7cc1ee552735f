"""The sample format: streaming reads, every bad record reported with file/line/field, good ones kept."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recon.samples.records import Record, iter_records, read_records, write_records

from .conftest import ROOT
from .test_cli import recon

DATA_FILE = ROOT / "data" / "smollm2-t0.7.jsonl"


def _good(tok, rid: str, text: str) -> dict:
    return {"id": rid, "output_ids": tok.encode(text) + [2],
            "response": {"reasoning_content": None, "content": text, "tool_calls": None, "finish_reason": "stop", "logprobs": None}}


def bad_file(tmp_path, tok):
    lines = [
        json.dumps(_good(tok, "g1", "Paris is the capital of France.")),                    # 1 good
        '{"id": "x1", "output_ids": [1, 2,',                                                # 2 malformed JSON
        json.dumps({"id": "x2", "output_ids": ["12", "7"]}),                               # 3 ids as strings
        json.dumps({"id": "x3", "output_ids": [12.0, 7]}),                                 # 4 floats
        json.dumps({"id": "x4", "output_ids": [5, -3]}),                                   # 5 negative
        json.dumps({"id": "x5", "output_ids": [5, 49152]}),                                # 6 beyond the vocabulary
        json.dumps({"id": "x6", "output_ids": []}),                                        # 7 empty output
        json.dumps({"id": "x7", "meta": {"note": "nothing"}}),                              # 8 neither field
        json.dumps(_good(tok, "g1", "A duplicate id.")),                                    # 9 duplicate id
        json.dumps({"id": "x9", "response": {"content": None, "reasoning": None}}),         # 10 empty response
        json.dumps({"output_ids": [5]}),                                                    # 11 no id
        json.dumps({"id": "x11", "response": {"content": "hi", "tool_calls": [{"function": {"name": "f"}}]}}),  # 12 no arguments
        "[1, 2, 3]",                                                                        # 13 not an object
        "",                                                                                 # 14 blank: skipped
        json.dumps({**_good(tok, "g2", "def f(x):\n    return x"), "reasoning": None}),     # 15 good
        json.dumps({"id": "g3", "response": {"reasoning": "think first", "content": "then answer"}}),  # 16 good, "reasoning"
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_kind_of_bad_record_is_reported_and_good_ones_kept(tmp_path, tokenizers):
    tok = tokenizers["smollm2"]
    path = bad_file(tmp_path, tok)
    result = read_records(path, vocab_size=tok.vocab_size)
    assert [r.id for r in result.records] == ["g1", "g2", "g3"]
    assert result.records[2].response.reasoning_content == "think first"
    assert all(r.dataset == "mixed" for r in result.records)
    found = {(e.line, e.field) for e in result.errors}
    assert found == {
        (2, ""), (3, "output_ids"), (4, "output_ids"), (5, "output_ids"), (6, "output_ids"), (7, "output_ids"),
        (8, "output_ids"), (9, "id"), (10, "response"), (11, "id"), (12, "response.tool_calls[0].function.arguments"), (13, ""),
    }
    messages = {e.line: str(e) for e in result.errors}
    assert messages[3] == f"{path}, line 3, field output_ids: item 0 is '12' (str), not an int"
    assert "item 0 is 12.0 (float)" in messages[4]
    assert "item 1 is -3, outside the vocabulary (0..49151)" in messages[5]
    assert "item 1 is 49152, outside the vocabulary (0..49151)" in messages[6]
    assert messages[7].endswith("field output_ids: empty")
    assert "neither output_ids nor response" in messages[8]
    assert "duplicate id 'g1' in dataset 'mixed' (an earlier line has it)" in messages[9]
    assert result.summary().startswith("3 good records, 12 bad")


def test_truncated_gzip_keeps_the_records_before_the_cut(tmp_path, tokenizers):
    tok = tokenizers["smollm2"]
    records = [Record(f"r{k}", "d", tok.encode(f"sample number {k} " * 20) + [2]) for k in range(400)]
    whole = tmp_path / "d.jsonl.gz"
    write_records(records, whole)
    data = whole.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    result = read_records(cut)
    assert 0 < len(result.records) < 400
    assert [r.output_ids for r in result.records] == [r.output_ids for r in records[: len(result.records)]]
    assert len(result.errors) == 1 and "file is cut or corrupt here" in result.errors[0].problem
    assert result.errors[0].line == len(result.records) + 1
    assert read_records(whole).records == records


def test_write_then_read_round_trips_and_parquet_reads_the_same(tmp_path, tokenizers):
    tok = tokenizers["smollm2"]
    source = bad_file(tmp_path, tok)
    good = read_records(source).records
    out = tmp_path / "clean.jsonl"
    write_records(good, out)
    again = read_records(out).records
    assert again == good
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    parquet = tmp_path / "clean.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    from_parquet = read_records(parquet).records
    assert [(r.id, r.output_ids, r.response) for r in from_parquet] == [(r.id, r.output_ids, r.response) for r in good]


def test_reading_streams(tmp_path, tokenizers):
    tok = tokenizers["smollm2"]
    path = tmp_path / "big.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for k in range(3):
            f.write(json.dumps({"id": str(k), "output_ids": tok.encode("hello")}) + "\n")
    stream = iter_records(path)
    first = next(stream)  # a generator: the first record arrives before the file is read through
    assert first.id == "0" and first.dataset == "big"


def test_validate_cli_reports_each_problem_then_a_summary(tmp_path, tokenizers):
    path = bad_file(tmp_path, tokenizers["smollm2"])
    run = recon("validate", str(path), "--tokenizer", "smollm2")
    assert run.returncode == 0
    assert run.stdout.strip() == "3 good records, 12 bad (output_ids: 6, (line): 2, id: 2, response: 1, response.tool_calls[0].function.arguments: 1)"
    assert len(run.stderr.strip().splitlines()) == 12 and "Traceback" not in run.stderr


def test_seen_ids_stay_exact_across_flushes():
    from recon.samples.records import SeenIds

    seen = SeenIds()
    seen.FLUSH = 1000
    assert all(seen.add("d", str(k)) for k in range(5000))
    assert not any(seen.add("d", str(k)) for k in range(0, 5000, 7))
    assert seen.add("other", "0") and not seen.add("other", "0")
    keys = seen.sorted_keys()
    assert len(keys) == 5001 and (keys[1:] > keys[:-1]).all()  # no key lost, none twice
    assert all((run[1:] > run[:-1]).all() for run in seen._runs)


def test_seen_ids_runs_stay_bounded_and_few():
    """The newest keys merge into the last run while it stays within RUN keys, so no merge copies
    more than that and a look-up is one binary search per RUN keys; every key is found again."""
    import numpy as np

    from recon.samples.records import SeenIds

    seen = SeenIds()
    seen.FLUSH, seen.RUN = 100, 800
    rng = np.random.default_rng(5)
    keys = rng.integers(-(2**63), 2**63 - 1, size=6000, dtype=np.int64).tolist()
    for start in range(0, len(keys), 250):
        assert all(seen.add_keys(keys[start : start + 250]))
        sizes = [len(run) for run in seen._runs]
        assert max(sizes) <= 800 and min(sizes[:-1], default=800) > 800 - 250
    assert not any(seen.add_keys(keys[::3]))
    assert (seen.sorted_keys() == np.sort(np.array(keys))).all()


def test_seen_ids_in_bulk_agree_with_one_at_a_time():
    from recon.samples.records import SeenIds

    names = [str(k % 3000) for k in range(7000)]  # repeats within a batch and across batches
    one, bulk = SeenIds(), SeenIds()
    one.FLUSH = bulk.FLUSH = 1000
    singles = [one.add("d", name) for name in names]
    batched = [ok for start in range(0, len(names), 900)
               for ok in bulk.add_keys([SeenIds.key("d", name) for name in names[start : start + 900]])]
    assert batched == singles and sum(batched) == 3000


def test_write_records_leaves_nothing_half_written(tmp_path):
    good = read_records(DATA_FILE).records[:3]

    def failing():
        yield from good
        raise RuntimeError("the model stopped")

    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        write_records(failing(), out)
    assert list(tmp_path.iterdir()) == []  # neither an empty result nor a .partial file
    out.write_text("earlier result\n")
    with pytest.raises(RuntimeError):
        write_records(failing(), out)
    assert out.read_text() == "earlier result\n"  # a failed run keeps what was there
    assert write_records(good, out) == 3 and len(read_records(out).records) == 3


def test_integers_past_64_bits_stay_integers_and_lines_parse_alike_whichever_parser(tmp_path):
    from recon.samples.io import iter_json_lines

    path = tmp_path / "big.jsonl"
    path.write_text('{"id": "a", "output_ids": [1, 2], "meta": {"big": 123456789012345678901234, "x": 1.5}}\n'
                    '{"id": "b", "output_ids": [3], "meta": {"ok": 1234567890123456789}}\n'
                    '{"id": "c", "output_ids": [4], "meta": {"t": true, "s": "\\u00e9\\ud83d\\ude00"}}\n')
    objs = [obj for _, obj in iter_json_lines(path)]
    assert objs[0]["meta"]["big"] == 123456789012345678901234 and type(objs[0]["meta"]["big"]) is int
    assert type(objs[1]["meta"]["ok"]) is int
    assert objs == [json.loads(line) for line in path.read_text().splitlines()]


def test_integers_past_64_bits_stay_integers(tmp_path):
    """The fast JSON reader would make them floats; such lines are read by Python's ``json``,
    which keeps them ints (the oracle: ``json.loads`` of the same line)."""
    lines = ['{"id":"a","output_ids":[1,2],"meta":{"seed":123456789012345678901234}}',
             '{"id":"b","output_ids":[1,18446744073709551616]}', '{"id":"c","output_ids":[1,1844674407370955161]}']
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got = read_records([path]).records
    assert [(r.output_ids, r.meta) for r in got] == [(json.loads(line)["output_ids"], json.loads(line).get("meta", {}))
                                                     for line in lines]
    assert all(type(i) is int for r in got for i in r.output_ids)
