"""The sampler recovery scores under (recon.recovery.sampling), held to transformers' own warpers.

Truncation is a hard cut and another engine's logits differ from the scorer's: ``slack`` keeps
what an engine whose log-probabilities lie within ``slack / 2`` of the scorer's could have kept.
The oracle is transformers' TopK / MinP / TopP warpers, run on the logits moved as far as that
allows in the token's favour (the token and, for top-p, every token ranked below it up by
``slack / 2``, the rest down by as much).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the sampler works on torch tensors (the 'generate' extra)")

from recon.recovery.sampling import ENGINE_SLACK, Sampling  # noqa: E402

VOCAB = 40


def kept_by_transformers(x, sampling: Sampling):
    """transformers' warpers in their order (top-k, top-p, min-p), on logits already tempered."""
    from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = x[None].clone()
    if sampling.top_k:
        scores = TopKLogitsWarper(sampling.top_k)(None, scores)
    if sampling.top_p < 1:
        scores = TopPLogitsWarper(sampling.top_p)(None, scores)
    if sampling.min_p:
        scores = MinPLogitsWarper(sampling.min_p)(None, scores)
    return torch.isfinite(scores[0])


def favouring(x, t: int, half: float, below: bool):
    """``x`` moved by at most ``half`` a logit in token ``t``'s favour: ``t`` (and with ``below``,
    every token ranked at or below it) up, every other down."""
    up = (x <= x[t]) if below else (torch.arange(len(x)) == t)
    return torch.where(up, x + half, x - half)


samplers = st.sampled_from([Sampling(top_k=5), Sampling(min_p=0.05), Sampling(min_p=0.2), Sampling(top_p=0.9),
                            Sampling(top_p=0.5)])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sampling=samplers, slack=st.sampled_from([0.1, 0.5, 1.0]))
def test_slack_keeps_what_a_nearby_engine_could_keep(seed, sampling, slack):
    """A token has a probability with ``slack`` exactly when an engine whose logits lie within
    ``slack / 2`` of these keeps it (transformers' warper on the logits moved in its favour)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(VOCAB, generator=gen) * 3
    loose = Sampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, slack=slack)
    finite = torch.isfinite(loose.log_probs(x[None])[0])
    for t in range(VOCAB):
        could = bool(kept_by_transformers(favouring(x, t, slack / 2, below=sampling.top_p < 1), sampling)[t])
        assert bool(finite[t]) == could, (t, sampling, slack)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), order=st.sampled_from(["hf", "llama.cpp"]), temperature=st.sampled_from([0.7, 1.4]),
       sampling=samplers)
def test_slack_leaves_the_kept_tokens_as_transformers_scores_them(seed, order, temperature, sampling):
    """Without slack the kept tokens are transformers' (after the temperature in its order, before it
    in llama.cpp's) and their log-probabilities the softmax over them; with slack the same tokens
    score the same, and the tokens it adds score below the least kept one's cut."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(VOCAB, generator=gen) * 3
    strict = Sampling(temperature, sampling.top_p, sampling.top_k, sampling.min_p, order)
    loose = Sampling(temperature, sampling.top_p, sampling.top_k, sampling.min_p, order, slack=ENGINE_SLACK)
    cut_on = x / temperature if order == "hf" else x
    kept = kept_by_transformers(cut_on, strict)
    want = torch.log_softmax((x / temperature).masked_fill(~kept, -math.inf), dim=-1)
    got, wide = strict.log_probs(x[None])[0], loose.log_probs(x[None])[0]
    assert torch.equal(torch.isfinite(got), kept)
    assert torch.allclose(got[kept], want[kept], atol=1e-5) and torch.allclose(wide[kept], want[kept], atol=1e-5)
    added = torch.isfinite(wide) & ~kept
    assert not added.any() or bool((wide[added] <= want[kept].min() + 1e-5).all())


def test_from_meta_gives_slack_only_to_other_engines():
    """``recon generate`` writes the torch version it sampled with (the local scorer's numerics): no
    slack; a llama.cpp sample (``engine``) or an imported one (neither) gets the engine slack; a
    caller's value wins."""
    ours = {"temperature": 1.0, "top_p": 0.9, "torch": "2.13.0+cpu"}
    assert Sampling.from_meta(ours).slack == 0.0
    assert Sampling.from_meta({**ours, "engine": "llama.cpp"}).slack == ENGINE_SLACK
    assert Sampling.from_meta({"temperature": 0.7, "min_p": 0.05}).slack == ENGINE_SLACK
    assert Sampling.from_meta(ours, slack=0.25).slack == 0.25 and Sampling.from_meta({}, slack=-1).slack == 0.0
