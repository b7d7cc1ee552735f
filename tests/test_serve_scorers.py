"""The server scorers live against `recon serve` (started on 127.0.0.1 by the test), checked
against an independent oracle: the model's own forward pass in this process (`LocalScorer`).

`recon serve` answers SGLang's native `POST /generate` (the shape of
tests/data/servers/sglang_generate_prompt_logprobs.json, read off SGLang's scheduler and
tokenizer manager) and vLLM's `prompt_logprobs` on `/v1/completions` (vLLM's
`_make_logprob_dict`); `SGLangScorer` and `ServerScorer`, made by `make_scorer` as
`recon recover --scorer URL --scorer-api sglang|vllm` makes them, must read the same numbers the
local model computes, ids asked for far outside the top-k included, and recovery through the
server must find the same ids as recovery with the local scorer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from recon.audit.profiles import load_profile
from recon.errors import ReconError
from recon.recovery.recover import recover
from recon.recovery.scorers import LocalScorer, make_scorer
from recon.samples.records import read_records

from .conftest import DATA, ROOT
from .test_serve import SERVE_OPTIONS, shared_server

pytest.importorskip("torch", reason="the server and the oracle run the local model: the 'generate' extra")

FIXTURE = json.loads((DATA / "servers" / "sglang_generate_prompt_logprobs.json").read_text())
TOL = 1e-4  # nats: the server's pass and the oracle's differ in float32 rounding only (about 1e-5)


@pytest.fixture(scope="module")
def server():
    return shared_server(*SERVE_OPTIONS)  # http://127.0.0.1:PORT/v1, shared with tests/test_serve.py


@pytest.fixture(scope="module")
def native(server):
    return server.removesuffix("/v1")  # SGLang's routes have no /v1


@pytest.fixture(scope="module")
def model():
    from recon.recovery.model import LocalModel

    return LocalModel("smollm2", threads=1)


@pytest.fixture(scope="module")
def tok(tokenizers):
    return tokenizers["smollm2"]


def post(url: str, body, headers: dict | None = None) -> tuple[int, dict | list]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def a_real_sequence() -> list[int]:
    """Prompt + sampled ids of a held-out t=1.3 sample whose text does not round-trip."""
    rec = next(r for r in read_records(ROOT / "data" / "heldout-t1.3.jsonl").records if r.id == "p021-2")
    return rec.prompt_ids + rec.output_ids


def far_outside(model, seq: list[int], positions: list[int]) -> dict[int, list[int]]:
    """At each position, ids ranked about 50th, 800th and 3,000th by the model: far outside any top-k."""
    full = model.token_logprobs([seq], top_k=3001)[0]
    return {p: [full.top[p][50][0], full.top[p][800][0], full.top[p][3000][0]] for p in positions}


def test_generate_answers_the_recorded_sglang_shape(native, model):
    """The fixture's own request: every field of the recorded answer, in the same nesting (null
    first entries, [logprob, id, text] triples, the asked ids in the order asked), and the
    numbers are the local model's."""
    status, reply = post(native + "/generate", FIXTURE["request"])
    recorded = FIXTURE["response"]
    assert status == 200 and set(reply) == set(recorded) and set(reply["meta_info"]) == set(recorded["meta_info"])
    meta, want = reply["meta_info"], recorded["meta_info"]
    assert reply["text"] == "" and reply["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (7, 0)
    for key in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
        assert meta[key] == want[key] == []
    ids = FIXTURE["request"]["input_ids"]
    assert [row[1] for row in meta["input_token_logprobs"]] == [row[1] for row in want["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0] == [None, ids[0], None]
    assert meta["input_top_logprobs"][0] is None and meta["input_token_ids_logprobs"][0] is None
    asked = FIXTURE["request"]["token_ids_logprob"]
    oracle = LocalScorer(model, top_k=2)([ids], alternatives={i: asked for i in range(1, len(ids))})[0]
    for i in range(1, len(ids)):
        lp, tid, text = meta["input_token_logprobs"][i]
        assert tid == ids[i] and text is None and lp == pytest.approx(oracle.logprobs[i], abs=TOL)
        top = meta["input_top_logprobs"][i]
        assert len(top) == 2 and [t for _, t, _ in top] == [t for t, _ in oracle.top[i][:2]]
        assert [v for v, _, _ in top] == pytest.approx([v for _, v in oracle.top[i][:2]], abs=TOL)
        by_id = meta["input_token_ids_logprobs"][i]
        assert [t for _, t, _ in by_id] == [t for _, t, _ in want["input_token_ids_logprobs"][i]] == asked
        assert [v for v, _, _ in by_id] == pytest.approx([v for _, v in oracle.top[i][2:]], abs=TOL)


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_scorers_read_the_local_models_numbers(api, server, model, tok):
    """make_scorer's scorer against the server, one sequence with alternatives asked far outside
    the top-k (SGLang's token_ids_logprob) and two sequences at once (requests in flight)."""
    seq = a_real_sequence()
    positions = [len(seq) - 12, len(seq) - 6, len(seq) - 2]
    asked = far_outside(model, seq, positions)
    scorer = make_scorer(server, tok, api=api, top_k=5, concurrency=3)  # 3: one at the model, two in its queue
    got = scorer([seq], alternatives=asked)[0]
    oracle = LocalScorer(model, top_k=5)([seq], alternatives=asked)[0]
    assert got.logprobs[0] is None and len(got.logprobs) == len(seq)
    assert got.logprobs[1:] == pytest.approx(oracle.logprobs[1:], abs=TOL)
    for i in range(1, len(seq)):
        assert [t for t, _ in got.top[i][:5]] == [t for t, _ in oracle.top[i][:5]]
        assert [v for _, v in got.top[i][:5]] == pytest.approx([v for _, v in oracle.top[i][:5]], abs=TOL)
    for p, ids in asked.items():
        extra = dict(got.top[p][5:])
        if api == "sglang":  # asked for by id: seen, at the local model's logprob
            assert set(ids) <= set(extra)
            assert [extra[t] for t in ids] == pytest.approx([v for _, v in oracle.top[p][5:]], abs=TOL)
        else:  # vLLM's top-k only (and the sequence's own token): the alternatives are not seen
            assert not set(ids) & set(extra)
    if api == "vllm":  # vLLM reports every token's rank
        assert got.ranks == oracle.ranks
    other = tok.encode("The capital of France is Paris, a city of light.")
    both = scorer([seq, other])
    assert both[0].logprobs[1:] == pytest.approx(oracle.logprobs[1:], abs=TOL)
    assert both[1].logprobs[1:] == pytest.approx(LocalScorer(model)([other])[0].logprobs[1:], abs=TOL)


def test_prompt_logprobs_are_at_temperature_1_as_both_engines_report_them(native, server, model, tok):
    """SGLang scores prompts untempered (temp_scaled_logprobs off) and its generated tokens at the
    sampling temperature; vLLM scores prompts from the raw logits. So a sampling temperature
    changes /generate's output logprobs only, and /v1/completions' prompt_logprobs not at all."""
    ids = tok.encode("Once upon a time, there was a little")
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.3, "sampling_seed": 3}}
    status, hot = post(native + "/generate", body)
    assert status == 200 and 1 <= len(hot["output_ids"]) <= 4
    cold = post(native + "/generate", {**body, "sampling_params": {"max_new_tokens": 0}})[1]
    hot_input, cold_input = ([r[0] for r in a["meta_info"]["input_token_logprobs"]] for a in (hot, cold))
    assert hot_input[0] is cold_input[0] is None and hot_input[1:] == pytest.approx(cold_input[1:], abs=TOL)
    full = ids + hot["output_ids"]
    untempered = LocalScorer(model, top_k=3)([full])[0]
    tempered = LocalScorer(model, top_k=3)([full], temperature=1.3)[0]
    meta = hot["meta_info"]
    assert [r[0] for r in meta["input_token_logprobs"][1:]] == pytest.approx(untempered.logprobs[1:len(ids)], abs=TOL)
    assert [r[1] for r in meta["output_token_logprobs"]] == hot["output_ids"]
    assert [r[0] for r in meta["output_token_logprobs"]] == pytest.approx(tempered.logprobs[len(ids):], abs=TOL)
    assert [[t for _, t, _ in top] for top in meta["output_top_logprobs"]] == [[t for t, _ in top] for top in tempered.top[len(ids):]]
    assert hot["text"] == tok.decode([i for i in hot["output_ids"] if i not in tok.special_ids])
    completions = [post(server + "/completions", {"prompt": ids, "max_tokens": 1, "echo": True, "prompt_logprobs": 2,
                                                  "temperature": t})[1]["choices"][0]["prompt_logprobs"] for t in (0, 1.3)]
    assert completions[0] == completions[1]
    entry = completions[0][3]
    assert next(iter(entry)) == str(ids[3])  # vLLM: the prompt's own token first, then the top-k
    assert entry[str(ids[3])]["logprob"] == pytest.approx(untempered.logprobs[3], abs=TOL)


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_a_server_scorer_refuses_another_temperature(api, tok):
    """Neither engine tempers prompt logprobs, so a scorer asked for t=1.3 says so instead of
    quietly answering at 1 (before any request: nothing listens on port 9)."""
    scorer = make_scorer("http://127.0.0.1:9/v1", tok, api=api)
    with pytest.raises(ReconError, match=r"prompt logprobs are at temperature 1, not 1\.3; .*--scorer local"):
        scorer([[1, 2, 3]], temperature=1.3)


def test_generate_greedy_batch_and_text(native, model, tok):
    """A batch (a list of id lists, or of strings) gets a list of answers; greedy generation is
    the local model's own greedy continuation; a flat token_ids_logprob is asked at every prompt."""
    prompts = [tok.encode("The capital of France is"), tok.encode("One, two, three,")]
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 3, "temperature": 0}, "return_logprob": True,
            "logprob_start_len": 1, "token_ids_logprob": [28, 29]}
    status, replies = post(native + "/generate", body)
    assert status == 200 and isinstance(replies, list) and len(replies) == 2
    for ids, reply in zip(prompts, replies):
        greedy = model.sample([ids], temperature=0, top_p=1.0, max_new_tokens=3, seed=0)[0].output_ids
        assert reply["output_ids"] == greedy and reply["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        rows = reply["meta_info"]["input_token_logprobs"]
        assert [r[1] for r in rows] == ids[1:] and rows[0][0] is None  # SGLang: null at logprob_start_len too
        asked = reply["meta_info"]["output_token_ids_logprobs"]
        assert [[t for _, t, _ in r] for r in asked] == [[28, 29]] * len(greedy)
    status, by_text = post(native + "/generate", {"text": ["The capital of France is"], "return_logprob": True,
                                                 "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 0}})
    assert status == 200 and len(by_text) == 1
    assert by_text[0]["meta_info"]["input_token_logprobs"] == [[None, prompts[0][-1], " is"]]  # -1: the last token only


@pytest.mark.parametrize("body, param, code", [
    ({"sampling_params": {"max_new_tokens": 0}}, "input_ids", "invalid_value"),
    ({"input_ids": [1, 2], "text": "hi"}, "input_ids", "invalid_value"),
    ({"input_ids": [1, 2, 49152]}, "input_ids[2]", "invalid_value"),
    ({"input_ids": [[1, 2], []]}, "input_ids[1][0]", "invalid_value"),
    ({"input_ids": "1 2 3"}, "input_ids", "invalid_type"),
    ({"input_ids": [1, 2], "token_ids_logprob": [True]}, "token_ids_logprob[0]", "invalid_value"),
    ({"input_ids": [[1, 2]], "token_ids_logprob": [[3], [4]]}, "token_ids_logprob", "invalid_value"),
    ({"input_ids": [1, 2], "top_logprobs_num": -1}, "top_logprobs_num", "invalid_value"),
    ({"input_ids": [1, 2], "top_logprobs_num": "5"}, "top_logprobs_num", "invalid_type"),
    ({"input_ids": [1, 2], "sampling_params": {"top_k": 5}}, "sampling_params.top_k", "unsupported_parameter"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5000}}, "sampling_params.max_new_tokens", "invalid_value"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "sampling_params.temperature", "invalid_value"),
    ({"input_ids": [1, 2], "sampling_params": [{}]}, "sampling_params", "invalid_type"),
    ({"input_ids": [1, 2], "stream": True}, "stream", "unsupported_parameter"),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len", "invalid_value"),
    ({"input_ids": [1] * 300, "return_logprob": True, "token_ids_logprob": list(range(4000))}, "token_ids_logprob",
     "invalid_value"),
])
def test_generate_refuses_bad_input_with_openai_errors(native, body, param, code):
    status, reply = post(native + "/generate", body)
    assert status == 400 and set(reply) == {"error"}
    error = reply["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    assert param.split("[")[0].split(".")[-1] in error["message"] or param in error["message"]


def test_generate_is_behind_the_same_gate_and_key(tok):
    """The key the other routes want, and the body checks, come before the model: a server over
    a stand-in model (no weights) answers them all."""
    from recon.server.serve import make_server

    stand_in = SimpleNamespace(name="smollm2", tokenizer=tok)
    with make_server(stand_in, "127.0.0.1", 0, api_key="sk-test") as server:
        url = server.url.removesuffix("/v1") + "/generate"
        status, reply = post(url, {"input_ids": [1, 2]})
        assert status == 401 and reply["error"]["code"] == "invalid_api_key"
        status, reply = post(url, b"{not json", headers={"Authorization": "Bearer sk-test"})
        assert status == 400 and reply["error"]["code"] == "invalid_json"
        status, reply = post(url, {"input_ids": []}, headers={"Authorization": "Bearer sk-test"})
        assert status == 400 and reply["error"]["param"] == "input_ids"
        request = urllib.request.Request(url, headers={"Authorization": "Bearer sk-test"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405 and refused.value.headers["Allow"] == "POST"


def test_recovery_through_the_server_finds_the_local_scorers_ids(native, model, tok):
    """Held-out samples that do not round-trip, recovered at temperature 1 (what a server scores
    at) with the local scorer and with SGLang's /generate, which sees every candidate through
    token_ids_logprob: the same ids, the same confidence."""
    bound = load_profile("chatml").bind(tok)
    wanted = {("heldout-t1.3", "p021-2"), ("heldout-t0.7", "p006-3")}
    records = [r for name in ("heldout-t1.3", "heldout-t0.7")
               for r in read_records(ROOT / "data" / f"{name}.jsonl").records if (r.dataset, r.id) in wanted]
    assert len(records) == 2
    local = list(recover(records, bound, LocalScorer(model), temperature=1.0, progress=False))
    served = list(recover(records, bound, make_scorer(native, tok, api="sglang", concurrency=3), temperature=1.0,
                          progress=False))
    for mine, theirs in zip(local, served):
        assert theirs.error is None and theirs.ids == mine.ids and theirs.changed
        assert theirs.confidence == pytest.approx(mine.confidence, abs=1e-3)
