"""`recon serve` started on 127.0.0.1 by the test; the client, the vLLM importer and the real
`openai` SDK (non-streaming and streaming, logprobs with top_logprobs, vLLM's id fields) against it.
A second server, in this process (`make_server` in a thread, same real model), checks what needs
a hand inside: the API key, the queue deadline (the test holds the model lock), and an error in
the middle of a stream."""

from __future__ import annotations

import atexit
import inspect
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from recon.cli import build_parser
from recon.errors import ReconError
from recon.samples.importers import from_chat_completion
from recon.samples.records import parse_record, read_records
from recon.server.client import chat

from .conftest import ROOT
from .test_cli import recon

pytest.importorskip("torch", reason="the server runs the local model: the 'generate' extra")
openai = pytest.importorskip("openai", reason="the SDK tests need the 'dev' extra")

MESSAGES = [{"role": "user", "content": "Name three colours, with an emoji each."}]


def start_server(*options: str, log=subprocess.DEVNULL) -> tuple[subprocess.Popen, str]:
    """`recon serve` on a free loopback port; returns the process and its base URL once it listens."""
    proc = subprocess.Popen(
        # one torch thread: on 2 shared cores, two threads spin against each other and run up to 10x slower
        [sys.executable, "-m", "recon.cli", "serve", "--port", "0", "--threads", "1", *options],
        stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=os.environ.copy(),
    )
    line = proc.stdout.readline()
    match = re.search(r"on (http://127\.0\.0\.1:\d+/v1)", line)
    if not match:
        proc.kill()
        raise AssertionError(f"server did not start: {line!r}")
    return proc, match.group(1)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


#: small limits, so that tests/test_fuzz_serve.py can fill the queue; 2 s for a request to arrive
CONCURRENCY, QUEUE, TIMEOUT = 1, 2, 2
SERVE_OPTIONS = ("--max-concurrency", str(CONCURRENCY), "--max-queue", str(QUEUE), "--timeout", str(TIMEOUT))
_running: dict[tuple[str, ...], str] = {}
_logs: dict[str, tuple[str, int]] = {}


def shared_server(*options: str) -> str:
    """One server per set of options for the whole session: loading the model is the slow part,
    and this module and the fuzz module use the same one. Its stderr goes to a file
    (:func:`server_log`)."""
    if options not in _running:
        log = tempfile.NamedTemporaryFile("w+", prefix="recon-serve-", suffix=".log", delete=False)
        proc, url = start_server(*options, log=log)
        atexit.register(stop_server, proc)
        atexit.register(os.unlink, log.name)
        _running[options], _logs[url] = url, (log.name, os.path.getsize(log.name))
    return _running[options]


def server_log(url: str) -> str:
    """What the shared server at ``url`` has written on stderr since it started listening
    (loading the model writes progress bars before that)."""
    name, start = _logs[url]
    with open(name, "rb") as f:
        f.seek(start)
        return f.read().decode("utf-8", "replace")


@pytest.fixture(scope="module")
def server():
    return shared_server(*SERVE_OPTIONS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key="none", max_retries=0, timeout=120)


def test_binds_loopback_unless_told_otherwise():
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    from recon.server.serve import make_server

    assert inspect.signature(make_server).parameters["host"].default == "127.0.0.1"
    with pytest.raises(ReconError, match="not a loopback address"):  # refused before the model is touched
        make_server(None, "0.0.0.0", 0)


def test_serve_errors_are_one_line_and_come_before_the_model_loads(server):
    run = recon("serve", "--max-concurrency", "0")
    assert run.returncode == 2 and run.stderr == "recon: error: --max-concurrency must be positive\n"
    port = urlsplit(server).port
    run = recon("serve", "--port", str(port))  # the test server has it
    assert run.returncode == 2 and run.stderr == f"recon: error: cannot listen on 127.0.0.1:{port} (Address already in use)\n"
    run = recon("serve", "--host", "0.0.0.0", "--port", str(port), env={"RECON_API_KEY": ""})
    assert run.returncode == 2 and run.stderr == ("recon: error: --host 0.0.0.0 is not a loopback address; anyone who can "
                                                  "reach it could use the model: give --api-key KEY (or set RECON_API_KEY)\n")
    for flag, variable in ((["--api-key", "k"], ""), ([], "k")):  # with a key, either way, it goes on to the taken port
        run = recon("serve", "--host", "0.0.0.0", "--port", str(port), *flag, env={"RECON_API_KEY": variable})
        assert run.returncode == 2 and run.stderr == f"recon: error: cannot listen on 0.0.0.0:{port} (Address already in use)\n"
    run = recon("serve", "--queue-timeout", "0")
    assert run.returncode == 2 and run.stderr == "recon: error: --queue-timeout must be positive\n"


def test_models_route(server):
    with urllib.request.urlopen(server + "/models", timeout=30) as reply:
        assert json.loads(reply.read())["data"][0]["id"] == "smollm2"
    with urllib.request.urlopen(server + "/models/smollm2", timeout=30) as reply:
        assert json.loads(reply.read())["max_model_len"] == 8192


def test_chat_completion_with_token_ids_imports_exactly(server, tokenizers):
    tok = tokenizers["smollm2"]
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 1.3, "seed": 7, "n": 2,
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
    reply = chat(server, {"messages": MESSAGES, "max_tokens": 2, "temperature": 0})
    choice = reply["choices"][0]
    # null unless asked for, as vLLM writes them (tests/data/vllm/chat_plain.json)
    assert choice["token_ids"] is None and reply["prompt_token_ids"] is None and choice["logprobs"] is None
    assert isinstance(choice["message"]["content"], str)


def test_bad_requests_get_400_with_a_message(server):
    with pytest.raises(ReconError, match=r"HTTP 400: 'messages' must be a non-empty list"):
        chat(server, {"messages": []})
    with pytest.raises(ReconError, match=r"HTTP 400: 'temperature' must be a number in \[0.0, 2.0\], got \"hot\""):
        chat(server, {"messages": MESSAGES, "temperature": "hot"})


def test_sdk_stream_equals_non_stream_with_top_logprobs_and_ids(client, tokenizers):
    tok = tokenizers["smollm2"]
    args = dict(model="smollm2", messages=[{"role": "user", "content": "Say hi with an emoji."}], max_tokens=16,
                temperature=1.3, seed=11, logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True})
    whole = client.chat.completions.create(**args)
    choice = whole.choices[0]
    ids = choice.token_ids  # vLLM's field, kept by the SDK as an extra attribute
    assert ids and len(ids) <= 16 and whole.usage.completion_tokens == len(ids)
    assert tok.decode([i for i in ids if i not in tok.special_ids]) == choice.message.content
    assert whole.prompt_token_ids[-4:] == tok.encode("<|im_start|>assistant\n")
    entries = choice.logprobs.content
    assert [e.token for e in entries] == [tok.id_to_bytes(i).decode("utf-8", "replace") for i in ids]
    assert [bytes(e.bytes) for e in entries] == [tok.id_to_bytes(i) for i in ids]
    for e in entries:  # the sampled token's logprob comes from the same distribution as its top 2
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= -9999
        assert e.logprob <= e.top_logprobs[0].logprob + 1e-4 and e.logprob <= 0

    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].prompt_token_ids == whole.prompt_token_ids
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in body) == choice.message.content
    assert [i for c in body for i in (getattr(c.choices[0], "token_ids", None) or [])] == ids
    streamed = [e for c in body if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in streamed] == \
           [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in entries]
    assert body[-1].choices[0].finish_reason == choice.finish_reason
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == len(ids)


def test_completions_scores_a_prompt_like_vllm(client, tokenizers):
    """prompt_logprobs (vLLM) and echo + logprobs (OpenAI legacy) over token ids, one forward pass."""
    tok = tokenizers["smollm2"]
    ids = tok.encode("The capital of France is Paris.")
    reply = client.completions.create(model="smollm2", prompt=ids, max_tokens=0, echo=True, logprobs=2,
                                      extra_body={"prompt_logprobs": 2, "return_token_ids": True})
    choice = reply.choices[0]
    assert choice.text == tok.decode(ids) and choice.prompt_token_ids == ids  # (vLLM: null without return_token_ids)
    scores = choice.prompt_logprobs
    assert len(scores) == len(ids) and scores[0] is None
    for i in range(1, len(ids)):
        own = scores[i][str(ids[i])]
        best = [v for v in scores[i].values() if v["rank"] == 1]
        assert own["decoded_token"] == tok.id_to_bytes(ids[i]).decode("utf-8", "replace")
        assert own["rank"] >= 1 and len(best) == 1 and best[0]["logprob"] >= own["logprob"]
        assert own["rank"] > 1 or own["logprob"] == best[0]["logprob"]
    legacy = choice.logprobs
    assert legacy.token_logprobs[0] is None and legacy.top_logprobs[0] is None
    assert legacy.token_logprobs[1:] == [scores[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]
    assert legacy.tokens == [tok.id_to_bytes(i).decode() for i in ids] and legacy.text_offset[0] == 0
    assert "".join(legacy.tokens) == choice.text
    # the teacher-forced scores agree with what sampling reported for the same tokens
    sampled = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                             seed=5, logprobs=True, extra_body={"return_token_ids": True})
    full = sampled.prompt_token_ids + sampled.choices[0].token_ids
    rescored = client.completions.create(model="smollm2", prompt=full, max_tokens=0, extra_body={"prompt_logprobs": 0})
    again = [rescored.choices[0].prompt_logprobs[i][str(full[i])]["logprob"] for i in range(len(sampled.prompt_token_ids), len(full))]
    assert again == pytest.approx([e.logprob for e in sampled.choices[0].logprobs.content], abs=2e-3)


def test_completions_continue_a_string_prompt(client, tokenizers):
    tok = tokenizers["smollm2"]
    reply = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=2, temperature=0,
                                      logprobs=1, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert 1 <= len(choice.token_ids) <= 2 and choice.prompt_token_ids == tok.encode("Once upon a time")
    assert choice.text == tok.decode([i for i in choice.token_ids if i not in tok.special_ids])
    assert len(choice.logprobs.tokens) == len(choice.token_ids) and all(not math.isnan(x) for x in choice.logprobs.token_logprobs)


def test_collect_cli_against_the_server(server, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\nCount to three.\n")
    out = tmp_path / "collected.jsonl"
    run = recon("collect", str(prompts), "--url", server, "--out", str(out), "--max-tokens", "2", "--dataset", "local")
    assert run.returncode == 0, run.stderr
    result = read_records(out, vocab_size=49152)
    assert not result.errors and [r.id for r in result.records] == ["p0001", "p0002"]
    assert all(r.output_ids and r.prompt_ids and r.response.content is not None for r in result.records)


def test_unreachable_server_is_one_line():
    run = recon("collect", str(ROOT / "data" / "prompts.jsonl"), "--url", "http://127.0.0.1:9/v1", "--out", "/tmp/never.jsonl")
    assert run.returncode == 2 and "cannot reach the server" in run.stderr and "Traceback" not in run.stderr


# -- a server in this process: the API key, the queue deadline, an error mid-stream --------------------
KEY = "sk-recon-test"


@pytest.fixture(scope="module")
def local():
    """`make_server` in a thread over the real model: one place at the model, two in the queue,
    1 s to wait there, 2 s for a request to arrive, and an API key."""
    from recon.recovery.model import LocalModel
    from recon.server.serve import Limits, make_server

    limits = Limits(max_concurrency=1, max_queue=2, queue_timeout=1, timeout=2)
    server = make_server(LocalModel("smollm2", threads=1), "127.0.0.1", 0, limits, api_key=KEY).start()
    yield server
    server.stop()


def raw_post(url: str, body: dict, key: str | None = KEY, path: str = "/chat/completions") -> tuple[int, dict, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key is not None else {})}
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_api_key_is_required_on_v1_but_not_on_health(local):
    for key, message in ((None, "no API key"), ("sk-wrong", "Incorrect API key provided.")):
        status, headers, data = raw_post(local.url, {"messages": MESSAGES, "max_tokens": 1}, key=key)
        error = json.loads(data)["error"]
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error" and message in error["message"]
    request = urllib.request.Request(local.url + "/models")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    with urllib.request.urlopen(local.url.removesuffix("/v1") + "/health", timeout=30) as reply:
        assert json.loads(reply.read()) == {"status": "ok"}
    status, _, data = raw_post(local.url, {"messages": MESSAGES, "max_tokens": 1, "temperature": 0})
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] is not None


def test_api_key_with_the_openai_sdk(local):
    wrong = openai.OpenAI(base_url=local.url, api_key="sk-wrong", max_retries=0, timeout=120)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=local.url, api_key=KEY, max_retries=0, timeout=120)
    assert [m.id for m in right.models.list()] == ["smollm2"]
    reply = right.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, temperature=0)
    assert 1 <= reply.usage.completion_tokens <= 2
    assert list(right.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1, stream=True))


def test_a_request_queued_past_the_deadline_gets_503(local):
    """The test holds the model lock: the first request takes the one place and waits on the
    lock inside; the second waits in the queue, and after 1 s is told 503 (OpenAI's error,
    Retry-After) instead of waiting on; the first is answered once the lock is free."""
    gate, lock = local.app.api.state.gate, local.app.api.state.lock
    first: list = []
    with lock:
        runner = threading.Thread(target=lambda: first.append(raw_post(local.url, {"messages": MESSAGES, "max_tokens": 1})))
        runner.start()
        for _ in range(1000):  # until the first request is inside
            if gate.inside == 1:
                break
            time.sleep(0.01)
        assert gate.inside == 1
        start = time.monotonic()
        status, headers, data = raw_post(local.url, {"messages": MESSAGES, "max_tokens": 1})
        waited = time.monotonic() - start
        assert status == 503 and headers["retry-after"] == "1"
        error = json.loads(data)["error"]
        assert error["code"] == "queue_timeout" and error["type"] == "server_error" and "1 s in the queue" in error["message"]
        assert 0.9 <= waited < 30
        assert runner.is_alive()  # the first is still waiting for the model
    runner.join(timeout=120)
    assert first[0][0] == 200 and gate.inside == 0


def test_an_error_mid_stream_ends_it_with_an_error_event(local, monkeypatch, capsys):
    from recon.server import responses

    real = responses.chat_chunks

    def broken(*args, **kwargs):
        chunks = real(*args, **kwargs)
        yield next(chunks)  # the role chunk
        yield next(chunks)  # the first token
        raise RuntimeError("boom")

    monkeypatch.setattr(responses, "chat_chunks", broken)
    body = {"messages": MESSAGES, "max_tokens": 4, "stream": True, "temperature": 0}
    status, headers, data = raw_post(local.url, body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in data.decode().split("\n\n") if e]
    assert len(events) == 3 and "[DONE]" not in events  # two chunks, then the error, then the end: no [DONE]
    assert [json.loads(e)["object"] for e in events[:2]] == ["chat.completion.chunk"] * 2
    assert json.loads(events[2]) == {"error": {"message": "internal error while streaming: RuntimeError",
                                               "type": "server_error", "param": None, "code": "internal_error"}}
    sdk = openai.OpenAI(base_url=local.url, api_key=KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.APIError, match="internal error while streaming"):
        list(sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, stream=True))
    err = capsys.readouterr().err
    assert err.count("recon serve: stream: RuntimeError: boom\n") == 2 and "Traceback" not in err
    monkeypatch.undo()  # and the server goes on serving
    assert sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1).choices
