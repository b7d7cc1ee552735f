"""The request that produced a response travels with it: ``{"request", "response"}`` lines, and
OpenAI Batch input files joined to their output by ``custom_id``, give each record the messages,
tools and template switches its prompt is rendered from. Shapes: the OpenAI Batch API's
documented input line (``custom_id``, ``method``, ``url``, ``body``) and the recorded Batch output
in ``tests/data/importers/openai_batch_output.jsonl``."""

from __future__ import annotations

import json

from recon.samples.importers import import_file
from recon.samples.records import read_records

from tests.conftest import DATA

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}]}


def test_a_request_beside_its_response_is_kept(tmp_path):
    request = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "tools": [WEATHER],
               "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.6}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "request": request, "response": CHAT}) + "\n"
                   + json.dumps({"id": "b", "request": {"messages": [{"role": "user", "content": "x"}],
                                                        "extra_body": {"chat_template_kwargs": {"thinking": True}}},
                                 "response": CHAT}) + "\n")
    result = import_file("openai", [src], tmp_path / "out.jsonl")
    assert result.records == 2 and result.errors == []
    a, b = read_records(tmp_path / "out.jsonl").records
    assert a.messages == request["messages"] and a.tools == [WEATHER] and a.chat_template_kwargs == {"enable_thinking": False}
    assert b.chat_template_kwargs == {"thinking": True} and b.tools is None


def test_batch_input_joins_its_output_by_custom_id(tmp_path):
    output = DATA / "importers" / "openai_batch_output.jsonl"
    ids = [json.loads(line)["custom_id"] for line in output.read_text().splitlines() if line.strip()]
    requests = tmp_path / "batch_input.jsonl"
    requests.write_text("".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                                            "body": {"model": "gpt-4o-mini", "tools": [WEATHER],
                                                     "messages": [{"role": "user", "content": f"question {cid}"}]}}) + "\n"
                                for cid in ids))
    result = import_file("openai", [output], tmp_path / "out.jsonl", requests=[requests])
    records = read_records(tmp_path / "out.jsonl").records
    assert records and all(r.messages == [{"role": "user", "content": f"question {r.id}"}] for r in records)
    assert all(r.tools == [WEATHER] for r in records)
    assert not [e for e in result.errors if e.path == str(requests)]


def test_bad_request_lines_name_file_line_and_field_and_the_rest_go_on(tmp_path):
    requests = tmp_path / "req.jsonl"
    requests.write_text("\n".join([json.dumps({"method": "POST", "body": {}}),  # no custom_id
                                   "{broken",
                                   json.dumps({"custom_id": "a", "body": {"messages": [{"role": "user", "content": "x"}]}}),
                                   json.dumps({"custom_id": "a", "body": {}})]) + "\n")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({**CHAT, "id": "a"}) + "\n")
    result = import_file("openai", [src], tmp_path / "out.jsonl", requests=[requests])
    problems = [(e.line, e.field) for e in result.errors]
    assert problems[0] == (1, "custom_id") and problems[1][0] == 2 and problems[2] == (4, "custom_id")
    assert "duplicate" in str(result.errors[2])
    (record,) = read_records(tmp_path / "out.jsonl").records
    assert record.messages == [{"role": "user", "content": "x"}]


def test_bad_tools_and_kwargs_are_reported_by_field(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [
        {"id": "a", "output_ids": [1], "tools": {"not": "a list"}},
        {"id": "b", "output_ids": [1], "chat_template_kwargs": ["x"]},
        {"id": "c", "output_ids": [1], "messages": [{"content": "no role"}]},
        {"id": "d", "output_ids": [1], "tools": [WEATHER], "chat_template_kwargs": {"thinking": True}},
    ]) + "\n")
    result = read_records(path)
    assert [(e.line, e.field) for e in result.errors] == [(1, "tools"), (2, "chat_template_kwargs"), (3, "messages[0].role")]
    (good,) = result.records
    assert good.to_dict()["tools"] == [WEATHER] and good.to_dict()["chat_template_kwargs"] == {"thinking": True}
