"""`recon serve` under bad input and load: every bad request gets an OpenAI-style 4xx JSON error,
a burst of 50 concurrent requests is answered or refused cleanly, stalled, trickling or vanished
clients don't wedge it. The server is the real one (real model) on 127.0.0.1; the client is raw
sockets where the bytes matter and the real `openai` SDK elsewhere."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recon.server.app import host_allowed
from recon.server.limits import Deadlines, Gate
from recon.server.responses import content_deltas, encode_events
from recon.server.schemas import (
    ApiError,
    parse_body,
    parse_chat_request,
    parse_completion_request,
)

from .test_serve import (
    CONCURRENCY,
    QUEUE,
    SERVE_OPTIONS,
    TIMEOUT,
    server_log,
    shared_server,
)

EXAMPLES = int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60))
MESSAGES = [{"role": "user", "content": "Hi"}]


# -- the pure parts, no server ------------------------------------------------------------------------
def test_gate_refuses_beyond_capacity_and_frees_places():
    async def run():
        gate = Gate(running=2, queued=0)
        async with gate.enter(), gate.enter():
            with pytest.raises(ApiError) as refused:
                async with gate.enter():
                    pass
            assert refused.value.status == 429 and refused.value.body()["error"]["code"] == "rate_limit_exceeded"
            assert refused.value.headers == {"Retry-After": "1"} and gate.inside == 2
        assert gate.inside == 0
        async with gate.enter():  # places come back
            assert gate.inside == 1

    asyncio.run(run())


def test_gate_tells_a_request_that_waited_too_long_503():
    async def run():
        gate = Gate(running=1, queued=1, queue_timeout=0.2)
        async with gate.enter():
            start = time.monotonic()
            with pytest.raises(ApiError) as late:
                async with gate.enter():
                    pass
            assert time.monotonic() - start >= 0.15 and gate.inside == 1
        error = late.value.body()["error"]
        assert late.value.status == 503 and error["code"] == "queue_timeout" and error["type"] == "server_error"
        async with gate.enter():  # the place it waited for was not taken by the timeout
            assert gate.inside == 1

    asyncio.run(run())


def test_events_end_with_done_or_with_an_error():
    assert b"".join(encode_events([{"n": 1}])) == b'data: {"n": 1}\n\ndata: [DONE]\n\n'
    lines: list[str] = []

    def broken():
        yield {"n": 1}
        raise KeyError("x")

    out = b"".join(encode_events(broken(), lines.append))
    assert out.startswith(b'data: {"n": 1}\n\ndata: {"error": {') and out.endswith(b"}}\n\n") and b"[DONE]" not in out
    assert json.loads(out.split(b"\n\n")[1][6:])["error"]["code"] == "internal_error" and lines == ["stream: KeyError: 'x'"]
    assert b"".join(encode_events([{"x": float("nan")}])).count(b'"internal_error"') == 1  # NaN is not JSON: an error


def test_a_stream_nobody_reads_is_dropped_after_the_timeout():
    """A send that cannot go out (the client stopped reading, the buffers are full) stalls; after
    the timeout the connection is dropped and the app's later sends return at once, so the
    handler ends and frees its place instead of blocking forever."""
    dropped: list[bool] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for k in range(100):
            await send({"type": "http.response.body", "body": b"x", "more_body": True})

    async def stalled_send(message):
        sent.append(message)
        if message["type"] == "http.response.body":
            await asyncio.sleep(3600)  # the client's window is closed

    async def receive():
        await asyncio.sleep(3600)

    scope = {"type": "http", "headers": [], "extensions": {"recon": {"started": 0.0, "abort": lambda: dropped.append(True)}}}
    start = time.monotonic()
    asyncio.run(asyncio.wait_for(Deadlines(app, timeout=0.2)(scope, receive, stalled_send), 10))
    assert 0.15 <= time.monotonic() - start < 5 and dropped == [True] and len(sent) == 2


def test_content_deltas_hold_back_half_characters(tokenizers):
    tok = tokenizers["smollm2"]
    ids = tok.encode("Hi 👋 there") + [tok.added_by_content["<|im_end|>"].id]
    content = tok.decode([i for i in ids if i not in tok.special_ids])
    deltas = content_deltas(tok.decode, ids, tok.special_ids, content)
    assert len(deltas) == len(ids) and "".join(deltas) == content
    assert all("\ufffd" not in d for d in deltas) and deltas[-1] == ""
    assert [d for d in deltas if "👋" in d] == ["👋"] and "👋" in deltas[3]  # released by the token completing it
    cut = ids[:3]  # a sample cut inside the emoji: its text ends in U+FFFD, and so do the deltas
    text = tok.decode(cut)
    assert text.endswith("\ufffd") and "".join(content_deltas(tok.decode, cut, tok.special_ids, text)) == text


@pytest.mark.parametrize("data", [b"", b"{", b"[1, 2]", b'"x"', b"null", b"\xff\xfe{}", b"[" * 100_000,
                                  b'{"temperature": NaN}', b'{"a": Infinity}'])
def test_bodies_that_are_not_a_json_object_are_400(data):
    with pytest.raises(ApiError) as e:
        parse_body(data)
    assert e.value.status == 400 and e.value.body()["error"]["code"] in ("invalid_json", "invalid_type")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
FIELDS = ["model", "messages", "n", "temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "logprobs",
          "top_logprobs", "stream", "stream_options", "return_token_ids", "return_tokens_as_token_ids", "stop", "tools",
          "prompt", "echo", "prompt_logprobs", "frequency_penalty", "response_format", "best_of"]
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "wizard"]) | JSON,
                                 "content": st.text(max_size=20) | JSON})
BODY = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8) | st.builds(
    lambda extra, msgs: {**extra, "messages": msgs}, st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6),
    st.lists(MESSAGE, min_size=0, max_size=3))


@settings(max_examples=EXAMPLES * 10, deadline=None)
@given(BODY)
def test_any_body_is_accepted_or_refused_with_an_openai_error(body):
    """Whatever JSON object arrives, validation either accepts it or raises ApiError (400/404,
    naming a field) — never another exception, which would be a 500."""
    for parse in (lambda b: parse_chat_request(b, served="smollm2"),
                  lambda b: parse_completion_request(b, served="smollm2", vocab_size=49152)):
        try:
            parse(body)
        except ApiError as e:
            error = e.body()["error"]
            assert e.status in (400, 404) and error["message"] and error["type"] == "invalid_request_error"
            assert e.status == 400 or error["code"] == "model_not_found"


# -- the real server ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    """The server tests/test_serve.py uses too: CONCURRENCY served at once, QUEUE waiting, a 3 s socket timeout."""
    return shared_server(*SERVE_OPTIONS)


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server, api_key="none", max_retries=0, timeout=120)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def read_response(s: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP response: (status, headers with Title-Case names, body). The body is
    Content-Length bytes (the connection may stay open: keep-alive), else all until the close."""
    reply = b""
    while b"\r\n\r\n" not in reply and (chunk := s.recv(65536)):
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.title(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
    length = int(headers["Content-Length"]) if "Content-Length" in headers else None
    while (length is None or len(body) < length) and (chunk := s.recv(65536)):
        body += chunk
    return int(lines[0].split()[1]), headers, body


def exchange(url: str, data: bytes, *, timeout: float = 60) -> tuple[int, dict, bytes]:
    """Send raw bytes, read one response: (status, headers, body)."""
    with socket.create_connection(_address(url), timeout=timeout) as s:
        s.sendall(data)
        return read_response(s)


def request(url: str, method: str, path: str, body: bytes | None = None, headers: str = "") -> tuple[int, dict, bytes]:
    framing = f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n" if body is not None else ""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}{headers}\r\n"
    return exchange(url, head.encode() + (body or b""))


def post(url: str, body, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    status, _, data = request(url, "POST", path, body if isinstance(body, bytes) else json.dumps(body).encode())
    return status, json.loads(data)


def assert_openai_error(payload: dict, *, param: str | None = None, code: str | None = None) -> None:
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str) and error["message"]
    assert param is None or error["param"] == param
    assert code is None or error["code"] == code


BAD_CHAT = [
    (b"{", 400, None, "invalid_json"),
    (b"[]", 400, None, "invalid_type"),
    (b"\xff\xfe\x00", 400, None, "invalid_json"),
    (b"[" * 200_000, 400, None, "invalid_json"),
    (b'{"messages": NaN}', 400, None, "invalid_json"),
    ({"messages": "hi"}, 400, "messages", None),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages[0].content[0]", None),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    ({"messages": [["user", "hi"]]}, 400, "messages[0]", None),
    ({"messages": MESSAGES, "temperature": -0.5}, 400, "temperature", "invalid_value"),
    ({"messages": MESSAGES, "temperature": "hot"}, 400, "temperature", None),
    ({"messages": MESSAGES, "top_p": 0}, 400, "top_p", None),
    ({"messages": MESSAGES, "max_tokens": 10**12}, 400, "max_tokens", "invalid_value"),
    ({"messages": MESSAGES, "max_completion_tokens": 5000}, 400, "max_completion_tokens", None),
    ({"messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens", None),
    ({"messages": MESSAGES, "max_tokens": 2.5}, 400, "max_tokens", "invalid_type"),
    ({"messages": MESSAGES, "n": 0}, 400, "n", None),
    ({"messages": MESSAGES, "n": True}, 400, "n", "invalid_type"),
    ({"messages": MESSAGES, "seed": 2**70}, 400, "seed", None),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    ({"messages": MESSAGES, "top_logprobs": 2}, 400, "top_logprobs", None),
    ({"messages": MESSAGES, "stream": "yes"}, 400, "stream", "invalid_type"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    ({"messages": MESSAGES, "stop": ["\n"]}, 400, "stop", "unsupported_parameter"),
    ({"messages": MESSAGES, "model": 5}, 400, "model", None),
    ({"messages": MESSAGES, "model": "gpt-4o"}, 404, "model", "model_not_found"),
    ({"messages": MESSAGES, "n": 16, "max_tokens": 200}, 400, "max_tokens", None),  # 3,200 tokens > the 2,048 per request
    ({"messages": [{"role": "user", "content": "hello " * 7000}], "max_tokens": 2000}, 400, "max_tokens", None),  # > context
]


@pytest.mark.parametrize("body, status, param, code", BAD_CHAT, ids=[f"chat{k}" for k in range(len(BAD_CHAT))])
def test_bad_chat_requests_get_openai_errors(server, body, status, param, code):
    got, payload = post(server, body)
    assert got == status
    assert_openai_error(payload, param=param, code=code)
    if body is BAD_CHAT[-1][0]:
        assert payload["error"]["message"].startswith("This model's maximum context length is 8192 tokens")


BAD_COMPLETIONS = [
    ({"prompt": []}, "prompt"),
    ({"prompt": [-1]}, "prompt[0][0]"),
    ({"prompt": [49152]}, "prompt[0][0]"),
    ({"prompt": [[1, 2], 3]}, "prompt[1]"),
    ({"prompt": [1.5]}, "prompt[0]"),
    ({"prompt": "x", "stream": True}, "stream"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "prompt_logprobs": "2"}, "prompt_logprobs"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": [[1]] * 300}, "prompt"),
    ({"prompt": "", "max_tokens": 0}, "prompt[0]"),
    ({"prompt": [[1] * 8000] * 5, "max_tokens": 0}, "prompt"),  # 40,000 tokens to score in one request
]


@pytest.mark.parametrize("body, param", BAD_COMPLETIONS, ids=[f"completion{k}" for k in range(len(BAD_COMPLETIONS))])
def test_bad_completion_requests_get_openai_errors(server, body, param):
    got, payload = post(server, body, "/v1/completions")
    assert got == 400
    assert_openai_error(payload, param=param)


@pytest.mark.parametrize("method, path, status, allow", [
    ("GET", "/v1/nowhere", 404, None), ("POST", "/v1/nowhere", 404, None), ("GET", "/", 404, None),
    ("GET", "/v1/chat/completions", 405, "POST"), ("PUT", "/v1/chat/completions", 405, "POST"),
    ("DELETE", "/v1/models", 405, "GET"), ("POST", "/v1/models", 405, "GET"), ("PATCH", "/v1/completions", 405, "POST"),
    ("GET", "/v1/models/gpt-4o", 404, None), ("BREW", "/v1/models", 501, None),
])
def test_unknown_routes_and_wrong_methods(server, method, path, status, allow):
    got, headers, body = request(server, method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None)
    assert got == status and headers.get("Allow") == allow
    assert_openai_error(json.loads(body), code="model_not_found" if "gpt-4o" in path else None)


@pytest.mark.parametrize("head, status, code", [
    ("Content-Length: 5000000\r\n", 413, "request_too_large"),  # refused from the header: the body is never sent
    ("", 411, "length_required"),
    ("Transfer-Encoding: chunked\r\n", 411, "length_required"),
    ("Content-Length: abc\r\n", 400, "invalid_content_length"),
    ("Content-Length: -5\r\n", 400, "invalid_content_length"),
    ("Content-Length: 2\r\nContent-Length: 3\r\n", 400, "invalid_content_length"),
])
def test_body_framing(server, head, status, code):
    got, _, body = exchange(server, f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n{head}\r\n".encode())
    assert got == status
    assert_openai_error(json.loads(body), code=code)


@pytest.mark.parametrize("host, ok", [(None, True), ("localhost:8000", True), ("127.0.0.1:1", True), ("127.1.2.3", True),
                                      ("[::1]:80", True), ("evil.example", False), ("localhost.evil.example:8000", False),
                                      ("", False), ("[bad", False)])
def test_host_header_on_a_loopback_server(host, ok):
    assert host_allowed(host, loopback_only=True) is ok
    assert host_allowed(host, loopback_only=False)


@pytest.mark.parametrize("headers, status, code", [
    ("Host: evil.example\r\nContent-Type: application/json\r\n", 403, "forbidden_host"),  # DNS rebinding
    ("Host: 127.0.0.1\r\nContent-Type: text/plain\r\n", 415, "unsupported_media_type"),  # a form, no preflight
    ("Host: 127.0.0.1\r\n", 415, "unsupported_media_type"),
])
def test_what_a_hostile_web_page_can_send_is_refused(server, headers, status, code):
    body = json.dumps({"messages": MESSAGES, "max_tokens": 1}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    got, _, data = exchange(server, head.encode() + body)
    assert got == status
    assert_openai_error(json.loads(data), code=code)


# each sent exactly up to where the server gives up, so that no unread bytes turn its close into a reset
@pytest.mark.parametrize("data, status", [(b"garbage\r\n\r\n", 400), (b"GET /" + b"a" * (65_537 - 5), 414),
                                          (b"GET /v1/models HTTP/1.1\r\n" + b"X-A: b\r\n" * 101, 431)])
def test_garbage_request_lines_and_huge_headers(server, data, status):
    got, _, body = exchange(server, data)
    assert got == status
    assert_openai_error(json.loads(body))


def test_sdk_sees_openai_errors(client):
    import openai

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="smollm2", messages=MESSAGES, temperature=-1, max_tokens=2)
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as streamed:
        client.chat.completions.create(model="smollm2", messages="hello", max_tokens=2, stream=True)
    assert streamed.value.param == "messages"


def test_fifty_concurrent_requests_are_answered_or_refused_cleanly(server, client):
    """A burst of 50: each gets a completion or a clean 429 with an OpenAI error. A 429 means all
    places were taken at that moment, and those requests are answered, so at least
    CONCURRENCY + QUEUE succeed whenever any is refused; and the server answers afterwards."""
    import openai

    def one(k: int):
        try:
            reply = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": f"Say {k}."}],
                                                   max_tokens=2, temperature=0)
            assert reply.choices[0].message.content is not None and 1 <= reply.usage.completion_tokens <= 2
            return 200
        except openai.RateLimitError as e:
            assert e.status_code == 429 and e.code == "rate_limit_exceeded" and e.response.headers["retry-after"] == "1"
            return 429

    with ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(one, range(50)))
    ok = statuses.count(200)
    assert ok + statuses.count(429) == 50 and ok >= min(50, CONCURRENCY + QUEUE)
    after = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, temperature=0)
    assert after.choices[0].finish_reason in ("stop", "length")


def test_stalled_and_vanished_clients_do_not_wedge_it(server, client):
    idle = [socket.create_connection(_address(server), timeout=30) for _ in range(20)]  # connect, say nothing
    half = socket.create_connection(_address(server), timeout=30)  # promise 100 bytes, send 10
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"messages")
    try:
        assert client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2).choices
        # a streaming client that reads the first event and resets the connection
        body = json.dumps({"messages": MESSAGES, "max_tokens": 4, "stream": True, "logprobs": True, "top_logprobs": 20}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.connect(_address(server))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        first = b""
        while b"data: " not in first:
            first += s.recv(256)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        reply = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2)
        assert reply.choices[0].message.content is not None
        # the half-sent request is answered once its deadline passes (2 s here), not left hanging
        answer = b""
        while chunk := half.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b'"code": "request_timeout"' in answer
    finally:
        for s in idle + [half]:
            s.close()


def test_connections_beyond_the_cap_get_503_and_it_recovers(server, client):
    """Beyond Limits.max_connections (256) a connection is answered 503 as soon as it opens."""
    held = []
    try:
        for _ in range(256 + 4):
            held.append(socket.create_connection(_address(server), timeout=10))
        reply = b""
        while chunk := held[-1].recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 503") and b'"code": "server_overloaded"' in reply
    finally:
        for s in held:
            s.close()
    for _ in range(100):  # the held threads see their sockets close and end
        if request(server, "GET", "/health")[0] == 200:
            break
    assert client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1).choices


def test_streaming_many_clients_at_once(server, client):
    """Concurrent streams: each is complete or refused, and the model lock keeps seeded sampling
    reproducible whatever the interleaving."""
    import openai

    def one(k: int) -> str:
        try:
            chunks = list(client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2, seed=4,
                                                         temperature=1.3, stream=True))
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        except openai.RateLimitError:
            return "429"

    results: list[str] = []
    threads = [threading.Thread(target=lambda k=k: results.append(one(k))) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = results.count("429")
    assert len(results) == 8 and (refused == 0 or 8 - refused >= CONCURRENCY + QUEUE)
    assert len({r for r in results if r != "429"}) == 1  # same seed, same text, however the requests interleave


def trickle(url: str, head: bytes, slow: bytes, *, every: float = 1.0) -> tuple[float, int, bytes]:
    """Send ``head`` at once, then ``slow`` a byte every ``every`` seconds until the server answers:
    (seconds from the first byte until the answer, bytes of ``slow`` sent, the answer). The slow
    bytes go out half a period off the whole seconds, so that none crosses the server's answer
    at a whole-second deadline (a byte arriving after the close would reset the connection)."""
    with socket.create_connection(_address(url), timeout=60) as s:
        start = time.monotonic()
        s.sendall(head)
        sent, answer = 0, b""
        time.sleep(every / 2)
        s.settimeout(every)
        for byte in slow:
            try:
                s.send(bytes([byte]))
                sent += 1
                answer = s.recv(65536)  # waits `every` for an answer, then sends on
                break
            except TimeoutError:
                continue
            except OSError:
                break
        seconds = time.monotonic() - start
        s.settimeout(60)
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:  # a last byte crossed the close; the answer is already here
            pass
    return seconds, sent, answer


def _slow_clients_meanwhile(server, client, head: bytes, slow: bytes, clients: int = 3) -> None:
    """``clients`` trickling at once, more than the server's places (CONCURRENCY + QUEUE); each is
    cut off with 408 at the deadline, and meanwhile the server answers others, without a 429:
    a request still arriving holds no place at the model."""
    results: list = []
    cut_at: list[float] = []

    def one():
        results.append(trickle(server, head, slow))
        cut_at.append(time.monotonic())

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert request(server, "GET", "/health")[0] == 200
    health_at = time.monotonic()
    reply = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1, temperature=0)
    assert reply.choices[0].message.content is not None
    for t in threads:
        t.join(timeout=120)
    assert len(results) == clients and health_at < min(cut_at)
    for seconds, sent, answer in results:
        assert answer.startswith(b"HTTP/1.1 408") and b'"code": "request_timeout"' in answer, answer[:200]
        assert TIMEOUT - 0.2 <= seconds < TIMEOUT + 15 and sent < len(slow)
    assert client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1).choices


def test_a_body_sent_a_byte_a_second_is_cut_off_at_the_deadline(server, client):
    body = json.dumps({"messages": MESSAGES, "max_tokens": 1}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    _slow_clients_meanwhile(server, client, head, body)


def test_headers_sent_a_byte_a_second_are_cut_off_at_the_deadline(server, client):
    """uvicorn alone would wait for ever: any byte cancels its keep-alive timer."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    _slow_clients_meanwhile(server, client, head[:1], head[1:] + b"X-Padding: " + b"a" * 100 + b"\r\n\r\n")


def test_nothing_it_was_sent_put_a_traceback_on_stderr(server):
    """Last in the module: everything above went to this server, and its stderr holds no traceback
    (only one-line `recon serve:` reports, if any)."""
    log = server_log(server)
    assert "Traceback" not in log and all(line.startswith("recon serve: ") for line in log.splitlines()), log[-2000:]
