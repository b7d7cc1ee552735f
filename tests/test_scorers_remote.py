"""Scorers on a server, against responses of the shape each engine documents (the fixture says
where its shape came from), replayed by a small HTTP server the test starts on 127.0.0.1:
parsing, ``token_ids_logprob`` for the candidates, requests in flight at once, retries."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recon.errors import ReconError
from recon.recovery.remote import SGLangScorer, ServerScorer, parse_sglang_logprobs

from .conftest import DATA

SGLANG = json.loads((DATA / "servers" / "sglang_generate_prompt_logprobs.json").read_text())
IDS = SGLANG["request"]["input_ids"]


def test_sglang_generate_logprobs_parse_as_sequence_logprobs():
    parsed = parse_sglang_logprobs(SGLANG["response"], IDS, {1: [3575, 7042]})
    assert parsed.logprobs == [None, -6.3125, -0.15625, -0.9375, -0.28125, -0.046875, -0.5625]
    assert parsed.ranks == [None, None, 1, 1, 1, 1, 1]  # rank 1 where the token leads the top-k; unknown outside it
    assert parsed.top[1] == [(1433, -2.1875), (1085, -2.4375), (3575, -6.3125), (7042, -11.0)]  # asked-for ids added
    assert parsed.top[2] == [(282, -0.15625), (28, -2.5625)]  # not asked for at 2: top-k only
    with pytest.raises(ReconError, match="input_token_logprobs has 7 entries for 8 input ids"):
        parse_sglang_logprobs(SGLANG["response"], IDS + [2])
    with pytest.raises(ReconError, match=r"input_token_logprobs\[3\] is not the logprob of the input's token 5"):
        parse_sglang_logprobs(SGLANG["response"], IDS[:3] + [5] + IDS[4:])
    with pytest.raises(ReconError, match="no meta_info.input_token_logprobs"):
        parse_sglang_logprobs({"text": "hi", "meta_info": {}}, IDS)


class _Replay(BaseHTTPRequestHandler):
    """Answers every POST with the fixture; the first ``fail`` requests get 503; counts how many
    requests are in flight at once."""

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.bodies.append((self.path, body))
            server.now += 1
            server.most = max(server.most, server.now)
            failing = server.fail > 0
            server.fail -= failing
        time.sleep(0.2)  # long enough for the others to arrive
        with server.lock:
            server.now -= 1
        if failing:
            self.send_response(503)
            self.end_headers()
            return
        data = json.dumps(server.answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def replay():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    server.lock, server.bodies, server.now, server.most, server.fail = threading.Lock(), [], 0, 0, 0
    server.answer = SGLANG["response"]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_sglang_scorer_asks_for_the_candidates_and_keeps_requests_in_flight(replay):
    url = f"http://127.0.0.1:{replay.server_address[1]}"
    scorer = SGLangScorer(url, top_k=2, concurrency=4)
    one = scorer([IDS], alternatives={1: [3575, 7042]})[0]
    path, body = replay.bodies[0]
    assert path == "/generate" and body == SGLANG["request"]  # the documented request, exactly
    assert one.top[1][-2:] == [(3575, -6.3125), (7042, -11.0)]
    replay.bodies.clear()
    many = scorer([IDS] * 6)
    assert len(many) == 6 and all(m.logprobs == one.logprobs for m in many)
    assert replay.most >= 3  # several in flight at once (up to 4)
    assert all("token_ids_logprob" not in b for _, b in replay.bodies)  # several sequences: no per-position ids


def test_a_busy_server_is_retried_and_a_refusal_is_one_line(replay, monkeypatch):
    import recon.recovery.remote as remote

    monkeypatch.setattr(remote.time, "sleep", lambda s: None)  # no real backoff waits in the test
    url = f"http://127.0.0.1:{replay.server_address[1]}"
    replay.fail = 2
    assert SGLangScorer(url, concurrency=1, retries=3)([IDS])[0].logprobs[1] == -6.3125
    assert len(replay.bodies) == 3  # two 503s, then the answer
    replay.fail = 10
    with pytest.raises(ReconError, match=r"^http://127\.0\.0\.1:\d+/generate: HTTP 503$"):
        SGLangScorer(url, concurrency=1, retries=2)([IDS])
    with pytest.raises(ReconError, match=r"/v1/completions: no choices\[0\]\.prompt_logprobs"):
        replay.fail = 0
        ServerScorer(url + "/v1")([IDS])  # a vLLM client at an SGLang server: said plainly
