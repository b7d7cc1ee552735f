"""The local scorer's prefix tree against the model run on each sequence alone, and the search's
token-count constraint against the ids the model really sampled."""

from __future__ import annotations

import pytest

from recon.audit.profiles import load_profile
from recon.errors import ReconError
from recon.recovery.recover import recover, token_count
from recon.recovery.sampling import Sampling
from recon.samples.records import Record, Response, read_records

from .conftest import ROOT

DATA = ROOT / "data"


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("torch", reason="the prefix tree runs the local model (the 'generate' extra)")
    from recon.recovery.model import LocalModel

    return LocalModel("smollm2", threads=1)


@pytest.fixture(scope="module")
def hot():
    return read_records(DATA / "smollm2-t1.3.jsonl").records


def alone(model, seq, sampling):
    """The oracle: one plain forward pass over ``seq`` by itself, no cache, no tree."""
    torch = model.torch
    with torch.inference_mode():
        logits = model.model(input_ids=torch.tensor([seq])).logits[0, :-1]
        return sampling.log_probs(logits)


def branches(hot, tokenizers):
    """Real sequences sharing prefixes: a sample, the same re-cut (a token split in two), cut short,
    and another sample of the same prompt."""
    tok = tokenizers["smollm2"]
    rec = hot[0]
    seq = rec.prompt_ids + rec.output_ids
    n = len(rec.prompt_ids)
    k = next(k for k in range(n + 3, len(seq)) if len(tok.id_to_bytes(seq[k])) >= 4)
    data = tok.id_to_bytes(seq[k])
    recut = seq[:k] + [tok.bytes_to_id[data[:1]], tok.bytes_to_id[data[1:]]] + seq[k + 1 :] if data[1:] in tok.bytes_to_id else None
    other = next(r for r in hot[1:] if r.prompt_ids == rec.prompt_ids)
    out = [seq, seq[: n + 5], other.prompt_ids + other.output_ids]
    return out + ([recut] if recut else [])


@pytest.mark.parametrize("sampling", [Sampling(1.3), Sampling(0.7, top_p=0.9)], ids=["t1.3", "t0.7-top-p"])
def test_the_tree_scores_every_sequence_as_the_model_alone_does(model, hot, tokenizers, sampling):
    """Sequences from several branches, over two calls, scored through one tree: each token's
    logprob, the top-k and an alternative asked for later equal one plain pass over that sequence;
    every position runs once (the second call runs only what is new, a third call nothing, an id
    asked for later at a position already run no layer but the last)."""
    from recon.recovery.scorers import LocalScorer

    seqs = branches(hot, tokenizers)
    assert len(seqs) == 4
    scorer = LocalScorer(model, top_k=5)
    got = scorer(seqs[:2], sampling=sampling) + scorer(seqs[2:], sampling=sampling)
    distinct = {tuple(s[:i]) for s in seqs for i in range(1, len(s))}  # positions whose next token is scored
    assert scorer.tokens_run == len(distinct) < sum(len(s) - 1 for s in seqs)
    for seq, scored in zip(seqs, got):
        ref = alone(model, seq, sampling)
        want = ref.gather(-1, model.torch.tensor(seq[1:])[:, None])[:, 0].tolist()
        assert scored.logprobs[0] is None and len(scored.logprobs) == len(seq)
        finite = [(a, b) for a, b in zip(scored.logprobs[1:], want) if b != float("-inf")]
        assert max(abs(a - b) for a, b in finite) < 1e-4
        assert [a == float("-inf") for a in scored.logprobs[1:]] == [b == float("-inf") for b in want]
        for i in (1, len(seq) // 2, len(seq) - 1):
            top = ref[i - 1].topk(5)
            assert [t for t, _ in scored.top[i]][:5] == top.indices.tolist()
    again = scorer(seqs, sampling=sampling)
    assert scorer.tokens_run == len(distinct)  # nothing new: nothing run
    assert [s.logprobs for s in again] == [s.logprobs for s in got]
    seq, i = seqs[0], len(seqs[0]) // 2
    rare = int(alone(model, seq, sampling)[i - 1].argsort()[100])  # far outside the top-5
    asked = scorer([seq], alternatives={i: [rare]}, sampling=sampling)[0]
    assert dict(asked.top[i])[rare] == pytest.approx(float(alone(model, seq, sampling)[i - 1, rare]), abs=1e-4)
    assert scorer.tokens_run == len(distinct)  # no position run again: the output layer on its kept hidden state


def test_the_token_count_a_record_gives():
    def rec(reason, **meta):
        return Record(id="r", dataset="d", output_ids=None, response=Response(content="x", finish_reason=reason), meta=meta)

    assert token_count(rec("stop", completion_tokens=17)) == 17  # usage.completion_tokens, as imported
    assert token_count(rec("length", max_new_tokens=96)) == 96  # cut at the limit: exactly that many
    assert token_count(rec("length", max_tokens=50)) == 50
    assert token_count(rec("stop", max_new_tokens=96)) is None  # stopped early: any count up to it
    assert token_count(rec("length", max_new_tokens=True)) is None and token_count(rec("length")) is None


def test_the_sampled_count_recovers_a_sample_the_canonical_count_misses(model, tokenizers):
    """heldout-t1.3 p004-1 was cut at 96 ids; its text's canonical encode has 97. With the count
    (from its meta) the search returns exactly the 96 ids the model sampled; a count no cut of the
    text reaches is a one-line error, not a wrong answer."""
    from recon.recovery.scorers import LocalScorer
    from recon.recovery.search import Segmenter, search

    bound = load_profile("chatml").bind(tokenizers["smollm2"])
    rec = next(r for r in read_records(DATA / "heldout-t1.3.jsonl").records if r.id == "p004-1")
    tok = tokenizers["smollm2"]
    canonical = tok.encode(rec.response.content)
    assert (rec.response.finish_reason, len(rec.output_ids), len(canonical)) == ("length", 96, 97)
    scorer = LocalScorer(model)
    res = next(recover([rec], bound, scorer, progress=False))
    assert res.error is None and res.ids == rec.output_ids and len(res.ids) == token_count(rec) == 96
    seg, sampling = Segmenter(tok), Sampling.from_meta(rec.meta)
    with pytest.raises(ReconError, match="cannot be spelled in exactly 20 ids"):
        search(rec.prompt_ids, canonical, seg, scorer, sampling, length=20)
