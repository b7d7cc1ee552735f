"""Recovering sampled ids: teacher-forced scores from the real SmolLM2 model, recovery of real
non-canonical samples, the export policy and the CLI."""

from __future__ import annotations

import math

import pytest

from recon.records import read_records

from .conftest import ROOT

DATA = ROOT / "data"

torch = pytest.importorskip("torch", reason="recovery scores with the local model (the 'generate' extra)")


@pytest.fixture(scope="module")
def model():
    from recon.generate import LocalModel

    return LocalModel("smollm2", threads=2)


@pytest.fixture(scope="module")
def hot():
    return read_records(DATA / "smollm2-t1.3.jsonl").records


def test_token_logprobs_match_the_logprobs_stored_at_sampling(model, hot):
    """generate stores log_softmax of the raw (temperature-1) logits of each sampled token;
    teacher forcing prompt + output gives the same numbers (to the stored 4 decimals)."""
    records = [hot[0], hot[5], hot[17]]
    seqs = [r.prompt_ids + r.output_ids for r in records]
    scored = model.token_logprobs(seqs, top_k=3)
    assert len(scored) == 3
    for rec, seq, s in zip(records, seqs, scored):
        assert len(s.logprobs) == len(s.ranks) == len(s.top) == len(seq)
        assert s.logprobs[0] is None and s.ranks[0] is None and s.top[0] == []
        n = len(rec.prompt_ids)
        stored = [e.logprob for e in rec.response.logprobs]
        assert len(stored) == len(rec.output_ids)
        diffs = [abs(s.logprobs[n + k] - lp) for k, lp in enumerate(stored) if lp > -9000]
        assert max(diffs) < 2e-4
        for i in range(1, len(seq)):
            best_id, best_lp = s.top[i][0]
            assert s.ranks[i] >= 1 and best_lp >= s.logprobs[i] - 1e-5
            assert (s.ranks[i] == 1) == (best_id == seq[i])
    # batched (right-padded) scores equal one-at-a-time scores
    alone = model.token_logprobs([seqs[1]])[0]
    assert max(abs(a - b) for a, b in zip(alone.logprobs[1:], scored[1].logprobs[1:])) < 1e-4


def test_token_logprobs_at_a_temperature(model, hot):
    seq = hot[3].prompt_ids + hot[3].output_ids
    t1, t13 = model.token_logprobs([seq, seq], top_k=1)[0], model.token_logprobs([seq], top_k=1, temperature=1.3)[0]
    assert t13.ranks == t1.ranks
    # a flatter distribution: the most likely token loses probability, the least likely gain
    assert all(b[0][1] <= a[0][1] + 1e-6 for a, b in zip(t1.top[1:], t13.top[1:]))
    worst = min(range(1, len(seq)), key=lambda i: t1.logprobs[i])
    assert t13.logprobs[worst] > t1.logprobs[worst]
