"""What a server computes for the scorers, counted on both sides and held to independent oracles.

* The scorers' own counts (`round_trips`, `tokens_sent`) against what `recon serve` counted
  receiving (`GET /counts`), on real sequences of data/heldout-t1.3.jsonl.
* The prefix-cache models (`recon.recovery.prefix_cache`) against a longest-common-prefix count
  done here with `os.path.commonprefix`, on sequences chosen so the answer is known: records of one
  prompt that share exactly the prompt, or the prompt and the first words of the answer.
* `recon serve` has no cache: the positions it ran equal the prompt tokens it scored.
* With a real vLLM engine (`-m vllm`), `tokens_sent` against the `usage.prompt_tokens` vLLM returns.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest

from recon.recovery.prefix_cache import BlockCache, RadixCache
from recon.recovery.remote import ServerScorer, SGLangScorer
from recon.recovery.scorers import COUNTERS, LocalScorer, counters, spent
from recon.samples.records import read_records

from .conftest import ROOT
from .test_serve import SERVE_OPTIONS, shared_server

BLOCK = 16  # vLLM's default block size, and the scorer's


def lcp(a: list[int], b: list[int]) -> int:
    """The oracle: how many leading ids two sequences share."""
    return len(os.path.commonprefix([a, b]))


def radix_oracle(sequences: list[list[int]]) -> list[int]:
    """New positions per sequence for an engine matching at token granularity: all but the longest
    prefix shared with any earlier sequence, at most all but the last position."""
    return [len(s) - min(max((lcp(s, t) for t in sequences[:i]), default=0), len(s) - 1)
            for i, s in enumerate(sequences)]


def block_oracle(sequences: list[list[int]], size: int = BLOCK) -> list[int]:
    """The same at whole blocks: the shared prefix (ending before the last position) rounded down."""
    return [len(s) - min(max((lcp(s, t) for t in sequences[:i]), default=0), len(s) - 1) // size * size
            for i, s in enumerate(sequences)]


@pytest.fixture(scope="module")
def records():
    return {r.id: r for r in read_records(ROOT / "data" / "heldout-t1.3.jsonl").records}


@pytest.fixture(scope="module")
def chosen(records) -> list[list[int]]:
    """Five real sequences (prompt + sampled ids) whose shared prefixes are known: p001-2 shares
    only the prompt with p001-0, p001-1 shares the prompt and "The capital of France is Paris",
    p001-0 comes again whole, p002-0 is another prompt."""
    seq = {k: records[k].prompt_ids + records[k].output_ids for k in ("p001-0", "p001-1", "p001-2", "p002-0")}
    prompt = len(records["p001-0"].prompt_ids)
    assert lcp(seq["p001-2"], seq["p001-0"]) == prompt  # the answers differ from their first id
    words = len(records["p001-0"].output_ids[:lcp(records["p001-0"].output_ids, records["p001-1"].output_ids)])
    assert prompt < lcp(seq["p001-1"], seq["p001-0"]) == prompt + words
    assert (prompt + words) % BLOCK == 0 and prompt % BLOCK != 0  # one case on a block boundary, one inside
    return [seq["p001-0"], seq["p001-2"], seq["p001-1"], seq["p001-0"], seq["p002-0"]]


# -- the cache models, by hand ------------------------------------------------------------------------------
def test_the_radix_model_is_the_longest_common_prefix(chosen, records):
    cache = RadixCache()
    got = [cache.send(s) for s in chosen]
    assert got == radix_oracle(chosen)
    prompt = len(records["p001-0"].prompt_ids)
    assert got[:4] == [len(chosen[0]), len(chosen[1]) - prompt, len(chosen[2]) - lcp(chosen[2], chosen[0]), 1]


def test_the_block_model_reuses_whole_blocks_only(chosen, records):
    cache = BlockCache(BLOCK)
    got = [cache.send(s) for s in chosen]
    assert got == block_oracle(chosen)
    prompt = len(records["p001-0"].prompt_ids)
    # p001-2 shares the prompt, which ends inside a block: the blocks before it only
    assert got[1] == len(chosen[1]) - prompt // BLOCK * BLOCK
    # p001-0 again: every full block but the one holding its last position
    assert got[3] == len(chosen[3]) - (len(chosen[3]) - 1) // BLOCK * BLOCK


def test_a_hand_checked_block_case():
    """40 ids, then 37 of them and 3 others: blocks [0, 16) and [16, 32) are cached and whole in
    both, [32, 48) is no block of the first (40 ids hold two full blocks): 40 - 32 = 8 new. Then
    the first 32 again: its last position is in the second block, so only the first is read: 16."""
    cache = BlockCache(16)
    first = list(range(100, 140))
    assert cache.send(first) == 40
    assert cache.send(first[:37] + [7, 8, 9]) == 8
    assert cache.send(first[:32]) == 16
    assert cache.send(first[:33]) == 1
    assert cache.send(first, read_limit=0) == 40  # vLLM 0.32 with prompt_logprobs: no lookup at all


def test_a_read_limit_caps_what_the_radix_cache_gives():
    cache = RadixCache()
    cache.send([5, 6, 7, 8])
    assert cache.cached([5, 6, 7, 9]) == 3
    assert cache.send([5, 6, 7, 9], read_limit=2) == 2
    assert cache.send([5, 6, 7, 9], read_limit=0) == 4  # SGLang with logprob_start_len 0
    assert cache.send([5, 6, 7, 9]) == 1  # never the last position


def test_old_prefixes_are_forgotten_past_the_capacity_recent_ones_kept():
    cache = RadixCache(capacity=40)
    cache.send(list(range(10)))
    for k in range(1, 5):
        cache.send([1000 * k + i for i in range(10)])
    assert cache.cached(list(range(10)) + [0]) == 0  # 40 positions later: gone
    cache.send([1000 * 4 + i for i in range(10)])
    assert cache.cached([1000 * 4 + i for i in range(10)] + [0]) == 10  # the last one sent: kept


# -- the counters ----------------------------------------------------------------------------------------------
def test_counters_reads_what_a_scorer_has():
    assert counters(ServerScorer("http://127.0.0.1:9/v1")) == {
        "round_trips": 0, "tokens_sent": 0, "positions_computed": 0, "positions_uncached": 0}
    assert set(counters(LocalScorer(model=None))) == set(COUNTERS) - {"positions_uncached"}


# -- live against `recon serve` --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    pytest.importorskip("torch", reason="the server runs the local model: the 'generate' extra")
    return shared_server(*SERVE_OPTIONS)  # http://127.0.0.1:PORT/v1, shared with tests/test_serve.py


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def served(server: str) -> dict:
    with urllib.request.urlopen(server.removesuffix("/v1") + "/counts", timeout=30) as reply:
        return json.loads(reply.read())


def route_delta(before: dict, after: dict, route: str) -> dict:
    return {k: after[route][k] - before[route][k] for k in before[route]}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_what_a_scorer_sends_is_what_the_server_received(server, chosen, kind):
    scorer = ServerScorer(server, concurrency=1) if kind == "vllm" else SGLangScorer(server.removesuffix("/v1"), concurrency=1)
    route = "completions" if kind == "vllm" else "generate"
    oracle = block_oracle(chosen) if kind == "vllm" else radix_oracle(chosen)
    for k, seq in enumerate(chosen):
        before, at_server = counters(scorer), served(server)
        scorer([seq])
        mine, theirs = spent(before, scorer), route_delta(at_server, served(server), route)
        assert mine["round_trips"] == theirs["requests"] == 1
        assert mine["tokens_sent"] == theirs["prompt_tokens"] == len(seq)
        assert theirs["positions_scored"] == theirs["prompt_tokens"]  # recon serve: no prefix cache
        # vLLM's shape asks for one sampled token too, which recon serve samples in a pass of its own
        assert theirs["positions_sampled"] == (len(seq) if kind == "vllm" else 0)
        # both engines skip reading their cache for prompt logprobs from position 0
        assert mine["positions_computed"] == len(seq)
        assert mine["positions_uncached"] == oracle[k]  # what a cache read would leave
    assert served(server)["prefix_cache"] is False


def test_one_call_of_many_sequences_is_charged_in_order(server, chosen):
    """Requests in flight together (concurrency 2) are charged as sent in the order given."""
    scorer = SGLangScorer(server.removesuffix("/v1"), concurrency=2)
    at_server = served(server)
    scorer(chosen[:3])
    theirs = route_delta(at_server, served(server), "generate")
    assert counters(scorer) == {"round_trips": 3, "tokens_sent": sum(map(len, chosen[:3])),
                                "positions_computed": sum(map(len, chosen[:3])),
                                "positions_uncached": sum(radix_oracle(chosen[:3]))}
    assert (theirs["requests"], theirs["prompt_tokens"]) == (3, sum(map(len, chosen[:3])))


def test_the_server_counts_sampling_and_scoring_positions(server, chosen):
    """Sampling runs the prompt once and each sampled token but the last; scoring runs every
    position of what it scores; a refused request counts nothing."""
    seq = chosen[0]
    n = len(seq)
    before = served(server)
    status, answer = post(server + "/completions", {"prompt": seq, "max_tokens": 2, "prompt_logprobs": 1,
                                                    "temperature": 0, "return_token_ids": True})
    assert status == 200
    m = len(answer["choices"][0]["token_ids"])
    assert route_delta(before, served(server), "completions") == {
        "requests": 1, "prompt_tokens": n, "positions_scored": n, "positions_sampled": n + m - 1,
        "positions_computed": n + (n + m - 1)}

    native = server.removesuffix("/v1")
    before = served(server)
    status, answer = post(native + "/generate", {"input_ids": seq, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                                                 "return_logprob": True})
    assert status == 200
    m = len(answer["output_ids"])
    assert route_delta(before, served(server), "generate") == {
        "requests": 1, "prompt_tokens": n, "positions_scored": n + m, "positions_sampled": n + m - 1,
        "positions_computed": (n + m) + (n + m - 1)}

    before = served(server)
    status, _ = post(native + "/generate", {"input_ids": [chosen[1], chosen[4]], "sampling_params": {"max_new_tokens": 0},
                                            "return_logprob": True, "logprob_start_len": 0})
    assert status == 200
    both = len(chosen[1]) + len(chosen[4])
    assert route_delta(before, served(server), "generate") == {
        "requests": 1, "prompt_tokens": both, "positions_scored": both, "positions_sampled": 0, "positions_computed": both}

    before = served(server)
    status, _ = post(native + "/generate", {"input_ids": seq, "sampling_params": {"max_new_tokens": 0},
                                            "return_logprob": True, "logprob_start_len": n})
    assert status == 400
    assert served(server) == before


def test_the_local_scorer_counts_calls_asks_and_runs(chosen):
    pytest.importorskip("torch", reason="the local model: the 'generate' extra")
    from recon.recovery.model import LocalModel

    scorer = LocalScorer(LocalModel("smollm2", threads=1), top_k=4)
    scorer([chosen[0]])
    first = counters(scorer)
    assert (first["round_trips"], first["tokens_sent"]) == (1, len(chosen[0]))
    # a position's distribution scores the next id: the last one's scores nothing asked for
    assert first["positions_computed"] == first["positions_run"] == len(chosen[0]) - 1
    scorer([chosen[0], chosen[2]])  # p001-0 again costs nothing; p001-1 only past what they share
    again = spent(first, scorer)
    assert (again["round_trips"], again["tokens_sent"]) == (1, len(chosen[0]) + len(chosen[2]))
    assert again["positions_computed"] == len(chosen[2]) - 1 - lcp(chosen[2], chosen[0])


# -- a real vLLM engine ----------------------------------------------------------------------------------------
@pytest.mark.vllm
def test_tokens_sent_are_the_prompt_tokens_vllm_counts(vllm_engine, chosen):
    from .vllm_cases import MODEL

    scorer = ServerScorer(vllm_engine.url, model=MODEL, concurrency=1)
    usage: list[int] = []
    plain = scorer._post

    def recorded(body):
        payload = plain(body)
        usage.append(payload["usage"]["prompt_tokens"])
        return payload

    scorer._post = recorded
    scorer(chosen)
    assert counters(scorer)["round_trips"] == len(usage) == len(chosen)
    assert counters(scorer)["tokens_sent"] == sum(usage) == sum(map(len, chosen))


def test_counts_want_the_api_key_as_every_route_but_health():
    """`GET /counts` sits behind the key like the routes it counts (security.md: only /health is open)."""
    from types import SimpleNamespace

    from recon.server.serve import make_server

    with make_server(SimpleNamespace(name="none"), "127.0.0.1", 0, api_key="k") as server:
        url = server.url.removesuffix("/v1") + "/counts"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": "Bearer k"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            counted = json.loads(reply.read())
    zero = {"requests": 0, "prompt_tokens": 0, "positions_scored": 0, "positions_sampled": 0, "positions_computed": 0}
    assert counted == {"completions": zero, "generate": zero, "prefix_cache": False}
