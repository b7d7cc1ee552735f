"""Importers on real-shaped server responses, and back; pairing ground truth with API text."""

from __future__ import annotations

import json
from pathlib import Path

from recon.samples.importers import from_chat_completion, from_sglang, iter_import, pair_files
from recon.samples.render import to_openai_chat, to_sglang, to_vllm_chat
from recon.samples.io import RecordError
from recon.samples.records import Record, parse_record, read_records, write_records

from .conftest import ROOT
from .test_cli import recon

SERVERS = Path(__file__).parent / "data" / "servers"


def split(items):
    items = list(items)
    good = [i for i in items if not isinstance(i, RecordError)]
    return good, [i for i in items if isinstance(i, RecordError)]


def test_sglang_native_generate(tokenizers):
    good, bad = split(iter_import("sglang", SERVERS / "sglang_generate.jsonl"))
    assert [r.id for r in good] == ["3f2a9c0e1b7d4e6f8a1b2c3d4e5f6a7b", "b1", "b2"]
    first = good[0]
    assert first.output_ids[-1] == 2 and tokenizers["smollm2"].decode(first.output_ids[:-1]) == first.response.content
    assert first.response.finish_reason == "stop" and [t.token_id for t in first.response.logprobs] == first.output_ids
    assert good[1].response.finish_reason == "length" and good[1].response.logprobs is None
    assert [(e.line, e.field) for e in bad] == [(3, "meta_info")]


def test_vllm_with_token_ids_reasoning_and_tool_calls(tokenizers):
    good, bad = split(iter_import("vllm", SERVERS / "vllm_chat.jsonl"))
    call = good[0]
    assert call.id == "chatcmpl-9d1c2b3a4f5e6d7c" and call.prompt_ids == [0, 128803, 2]
    assert call.response.reasoning_content.startswith("The user wants the weather")
    assert call.response.tool_calls[0].name == "get_weather" and json.loads(call.response.tool_calls[0].arguments)["city"] == "Paris"
    assert [t.token_id for t in call.response.logprobs] == call.output_ids  # "token_id:N" parsed
    assert call.output_ids[-1] == tokenizers["deepseek-v4"].encode("<｜end▁of▁sentence｜>")[0]
    assert [r.id for r in good[1:]] == ["chatcmpl-n2-0", "chatcmpl-n2-1"]  # n=2: one record per choice
    assert [(e.line, e.field) for e in bad] == [(3, "output_ids")]


def test_openai_openrouter_and_batch_output(tokenizers):
    good, bad = split(iter_import("openai", SERVERS / "openai_chat.jsonl"))
    plain, router = good
    assert plain.output_ids is None and plain.response.content == "Here you go 😀"
    data = b"".join(bytes(t.bytes) for t in plain.response.logprobs)
    assert data.decode() == plain.response.content  # true bytes even where a token is half an emoji
    assert any("\ufffd" in t.token for t in plain.response.logprobs)
    assert router.response.reasoning_content == "I need the weather tool." and router.response.tool_calls[0].id == "functions.get_weather:0"
    assert [(e.line, e.field) for e in bad] == [(3, "")]
    (batch,) = [r for r in iter_import("openai", SERVERS / "openai_batch.jsonl")]
    assert batch.id == "request-1" and batch.response.content == plain.response.content


def bundled_records(n: int = 40) -> list[Record]:
    return read_records(ROOT / "data" / "smollm2-t1.3.jsonl").records[:n]


def test_renderers_invert_importers_on_real_samples():
    for rec in bundled_records():
        back = parse_record(from_chat_completion(to_vllm_chat(rec), rec.id)[0], path="-", line=1, default_dataset=rec.dataset)
        assert (back.output_ids, back.prompt_ids, back.response) == (rec.output_ids, rec.prompt_ids, rec.response)
        plain = parse_record(from_chat_completion(to_openai_chat(rec), rec.id)[0], path="-", line=1, default_dataset=rec.dataset)
        assert plain.output_ids is None and plain.response == rec.response
        sg = parse_record(from_sglang(to_sglang(rec))[0], path="-", line=1, default_dataset=rec.dataset)
        assert sg.output_ids == rec.output_ids and sg.response.content == rec.response.content
        assert sg.response.finish_reason == rec.response.finish_reason
        assert [t.token_id for t in sg.response.logprobs] == rec.output_ids


def test_pair_ground_truth_with_api_text(tmp_path):
    records = bundled_records(12)
    truth = [Record(r.id, r.dataset, r.output_ids, prompt_ids=r.prompt_ids) for r in records[:10]]
    api_lines = [to_openai_chat(r) for r in records[2:12]]
    write_records(truth, tmp_path / "truth.jsonl")
    (tmp_path / "api.jsonl").write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in api_lines))
    run = recon("import", "openai", str(tmp_path / "api.jsonl"), "--out", str(tmp_path / "api-records.jsonl"))
    assert run.returncode == 0 and "wrote 10 records" in run.stdout
    result = pair_files(tmp_path / "truth.jsonl", tmp_path / "api-records.jsonl", tmp_path / "paired.jsonl")
    assert result.paired == 8
    assert result.only_ground_truth == sorted(r.id for r in records[:2])
    assert result.only_api == sorted(r.id for r in records[10:12])
    paired = read_records(tmp_path / "paired.jsonl").records
    assert [(p.output_ids, p.response) for p in paired] == [(r.output_ids, r.response) for r in records[2:10]]
    run = recon("pair", str(tmp_path / "truth.jsonl"), str(tmp_path / "api-records.jsonl"), "--out", str(tmp_path / "p2.jsonl"))
    assert "wrote 8 paired records" in run.stdout and f"unmatched, only in ground truth: {records[0].id}, {records[1].id}" in run.stdout
