"""`recon serve` started on 127.0.0.1 by the test; the client and the vLLM importer against it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from recon.client import chat
from recon.errors import ReconError
from recon.importers import from_chat_completion
from recon.records import parse_record, read_records

from .conftest import ROOT
from .test_cli import recon

pytest.importorskip("torch", reason="the server runs the local model: the 'generate' extra")

MESSAGES = [{"role": "user", "content": "Name three colours, with an emoji each."}]


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [sys.executable, "-m", "recon.cli", "serve", "--port", "0", "--threads", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=os.environ.copy(),
    )
    line = proc.stdout.readline()
    match = re.search(r"on (http://127\.0\.0\.1:\d+/v1)", line)
    assert match, f"server did not start: {line!r}"
    yield match.group(1)
    proc.terminate()
    proc.wait(timeout=30)


def test_models_route(server):
    with urllib.request.urlopen(server + "/models", timeout=30) as reply:
        assert json.loads(reply.read())["data"][0]["id"] == "smollm2"


def test_chat_completion_with_token_ids_imports_exactly(server, tokenizers):
    tok = tokenizers["smollm2"]
    body = {"messages": MESSAGES, "max_tokens": 24, "temperature": 1.3, "seed": 7, "n": 2,
            "return_token_ids": True, "logprobs": True, "return_tokens_as_token_ids": True}
    reply = chat(server, body)
    assert len(reply["choices"]) == 2 and reply["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in reply["choices"])
    records = [parse_record(r, path=server, line=1, default_dataset="served") for r in from_chat_completion(reply, "q1")]
    for rec in records:
        assert [t.token_id for t in rec.response.logprobs] == rec.output_ids
        assert tok.decode([i for i in rec.output_ids if i not in tok.special_ids]) == rec.response.content
        assert rec.response.finish_reason == ("stop" if rec.output_ids[-1] == 2 else "length")
    rendered = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    rendered += "<|im_start|>user\n" + MESSAGES[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    assert records[0].prompt_ids == tok.encode(rendered)
    again = chat(server, body)  # same seed, same request: same samples
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in reply["choices"]]


def test_plain_request_returns_text_only(server):
    reply = chat(server, {"messages": MESSAGES, "max_tokens": 8, "temperature": 0})
    choice = reply["choices"][0]
    assert "token_ids" not in choice and "prompt_token_ids" not in reply and choice["logprobs"] is None
    assert isinstance(choice["message"]["content"], str)


def test_bad_requests_get_400_with_a_message(server):
    with pytest.raises(ReconError, match=r"HTTP 400: .*'messages' must be a non-empty list"):
        chat(server, {"messages": []})
    with pytest.raises(ReconError, match=r"HTTP 400: .*'temperature' must be a number in \[0.0, 2.0\]"):
        chat(server, {"messages": MESSAGES, "temperature": "hot"})


def test_collect_cli_against_the_server(server, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\nCount to three.\n")
    out = tmp_path / "collected.jsonl"
    run = recon("collect", str(prompts), "--url", server, "--out", str(out), "--max-tokens", "12", "--dataset", "local")
    assert run.returncode == 0, run.stderr
    result = read_records(out, vocab_size=49152)
    assert not result.errors and [r.id for r in result.records] == ["p0001", "p0002"]
    assert all(r.output_ids and r.prompt_ids and r.response.content is not None for r in result.records)


def test_unreachable_server_is_one_line():
    run = recon("collect", str(ROOT / "data" / "prompts.jsonl"), "--url", "http://127.0.0.1:9/v1", "--out", "/tmp/never.jsonl")
    assert run.returncode == 2 and "cannot reach the server" in run.stderr and "Traceback" not in run.stderr
