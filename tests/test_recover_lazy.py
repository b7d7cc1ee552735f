"""The lazy anchor beam (``recon recover --search lazy``, :mod:`recon.recovery.lazy`) on real
held-out samples: judged by the data's own sampled ids and the model's own score of them (a
search error is a returned sequence the model scores below the sampled one), and its cost by the
default search's, run on the same samples."""

from __future__ import annotations

import json

import pytest

from recon.audit.profiles import load_profile
from recon.samples.records import read_records

from .conftest import ROOT
from .test_cli import recon

DATA = ROOT / "data"
CI_SUBSET = ROOT / "tests" / "data" / "recover-ci.jsonl"
#: where the lazy search is known to miss what the default search finds, and why: asserted to
#: still miss, so that a fix shows here (docs/recovery.md, the lazy search's section). None on the
#: CI subset now: t=1.3 p014-2 (` trans`+`lum` against the canonical ` transl`+`um`, which the
#: guess inside a segment drops) gets the default search's answer, 0.005 nats above the sampled ids
LAZY_MISSES: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("torch", reason="recovery scores with the local model (the 'generate' extra)")
    from recon.recovery.model import LocalModel

    return LocalModel("smollm2", threads=1)


@pytest.fixture(scope="module")
def bound(tokenizers):
    return load_profile("chatml").bind(tokenizers["smollm2"])


def _held(names):
    return {(r.dataset, r.id): r for name in names for r in read_records(DATA / f"{name}.jsonl").records}


def test_lazy_search_makes_no_search_error_on_the_ci_samples(model, bound):
    """The CI subset of held-out samples (quick and hard ones: t=1.3 p014-2's gibberish, a count
    the canonical ids miss, llama.cpp's truncated samples): every returned sequence spells the text
    and scores at least as high as the sampled ids (the data's ``output_ids``) under the sampling
    distribution, unless those hold a special token the text does not show, the default search
    misses them too (t=1.3 p008-2, cut inside a character: then no worse than it), or the lazy
    search is known to miss them (:data:`LAZY_MISSES`); a sample the bundled rows recover exactly
    stays exact. One sample here is a dead end for the lazy search (top-p 0.9 p015-0: every line it
    keeps needs a token the sampler removed), where the beam takes over."""
    from recon.recovery.recover import recover, sampling_of
    from recon.recovery.scorers import LocalScorer
    from recon.recovery.search import score_ids

    import pandas as pd

    subset = [json.loads(line) for line in CI_SUBSET.read_text().splitlines()]
    rows = {(r.dataset, r.id): r for name in ("recover-heldout", "recover-heldout-truncated", "recover-heldout-llamacpp")
            for r in pd.read_json(DATA / f"{name}.jsonl", lines=True).itertuples()}
    held = _held(sorted({s["dataset"] for s in subset}))
    picked = [held[s["dataset"], s["id"]] for s in subset]
    scorer = LocalScorer(model)
    fixed = {t.id for t in bound.tok.added_tokens}
    missed = []
    for rec, res in zip(picked, recover(picked, bound, scorer, progress=False, method="lazy")):
        assert res.error is None, res.error
        body = res.ids[:-1] if rec.response.finish_reason == "stop" else res.ids  # the end token apart
        assert bound.tok.decode(body) == rec.response.content, rec.id
        if (rec.dataset, rec.id) in LAZY_MISSES:
            assert not res.exact, f"{rec.id} no longer missed ({LAZY_MISSES[rec.dataset, rec.id]}): update LAZY_MISSES and the docs"
            missed.append(rec.id)
            continue
        if rows[rec.dataset, rec.id].exact:  # an exact sample stays exact
            assert res.exact, rec.id
        if not res.exact:
            sampled = rec.output_ids[:-1] if rec.response.finish_reason == "stop" else rec.output_ids
            if any(i in fixed for i in sampled):
                continue  # hidden: no cut of the text is the sampled ids
            sampling = sampling_of(rec, scorer)
            got, want = score_ids(rec.prompt_ids, res.ids, scorer, sampling), score_ids(rec.prompt_ids, rec.output_ids, scorer, sampling)
            if rows[rec.dataset, rec.id].failure == "search":  # the default search's miss too: no worse than it
                assert got >= rows[rec.dataset, rec.id].returned_score - 1e-2, (rec.id, got)
            else:
                assert got >= want - 1e-4, (rec.id, got, want)
    assert sorted(missed) == sorted(i for _, i in LAZY_MISSES)


def test_lazy_search_finds_a_cut_its_guess_ranks_low(model, bound):
    """Held-out p005-2 at t=1.3 (gibberish): the likeliest cut of one 16-byte stretch sits 3.9 nats
    under the guess of its stretch half way through it; with the guess's margin at 2 the search
    returned a sequence 3.5 nats below the sampled ids. It must score at least as high as they do."""
    from recon.recovery.recover import recover, sampling_of
    from recon.recovery.scorers import LocalScorer
    from recon.recovery.search import score_ids

    rec = _held(["heldout-t1.3"])["heldout-t1.3", "p005-2"]
    scorer = LocalScorer(model)
    res = next(recover([rec], bound, scorer, progress=False, method="lazy"))
    sampling = sampling_of(rec, scorer)
    assert score_ids(rec.prompt_ids, res.ids, scorer, sampling) >= score_ids(rec.prompt_ids, rec.output_ids, scorer, sampling) - 1e-4


def test_lazy_search_probes_a_line_behind_at_an_anchor(model, bound):
    """llama.cpp's held-out s32 p015-1 (t=1.0): the sampled ids are 4.4 nats behind the best at
    one anchor, more than ``delta`` plus the bar's lowering, and the likeliest at the end. Without
    ``probe`` the lazy search dropped them there and ended 8.7 nats below them; it must return the
    data's ``output_ids``."""
    from recon.recovery.recover import recover
    from recon.recovery.scorers import LocalScorer

    rec = _held(["heldout-llamacpp-t1.0-s32"])["heldout-llamacpp-t1.0-s32", "p015-1"]
    res = next(recover([rec], bound, LocalScorer(model), progress=False, method="lazy"))
    assert res.ids == rec.output_ids


def _without_hand_over(model, bound, monkeypatch, dataset: str, ids: tuple[str, ...]) -> list:
    """The lazy search's results on held-out records, with the hand-over to the default search
    made an error (each result paired with its record)."""
    import recon.recovery.lazy as lazy
    from recon.recovery.recover import recover
    from recon.recovery.scorers import LocalScorer

    def no_hand_over(*args, **kwargs):
        raise AssertionError("the lazy search handed over to the default search")

    monkeypatch.setattr(lazy, "beam_search", no_hand_over)
    held = _held([dataset])
    picked = [held[dataset, i] for i in ids]
    out = list(zip(picked, recover(picked, bound, LocalScorer(model), progress=False, method="lazy")))
    for rec, res in out:
        assert res.error is None, (rec.id, res.error)
    return out


def test_lazy_search_guesses_past_a_token_the_sampler_removed(model, bound, monkeypatch):
    """Held-out p027-1 and p005-3 at t=1.0 top-p 0.9: the canonical ids hold a token top-p
    removed, and a guess along their scores was -inf past it: no cut inside such a segment passed,
    the sweep died, and the default search took over (32 and 55 more calls). With that token
    counted 0 in the guesses the lazy search answers itself, with the data's ``output_ids``."""
    for rec, res in _without_hand_over(model, bound, monkeypatch, "heldout-t1.0-p0.9", ("p027-1", "p005-3")):
        assert res.ids == rec.output_ids, rec.id


def test_lazy_search_widens_its_guess_at_a_dead_end(model, bound, monkeypatch):
    """Held-out p010-3 and p031-1 at t=1.0 top-p 0.9: every line the lazy search kept ended inside
    a segment (the way on was a cut its guess dropped), and the default search took over, 53 and
    39 calls in all. One more sweep over what is known, with the guess's rules ``widen`` times
    wider, finds the data's ``output_ids`` itself, within the issue's 20 calls."""
    for rec, res in _without_hand_over(model, bound, monkeypatch, "heldout-t1.0-p0.9", ("p010-3", "p031-1")):
        assert res.ids == rec.output_ids, rec.id
        assert res.passes <= 20, (rec.id, res.passes)


def test_lazy_search_cuts_freely_where_the_sampler_removed_a_canonical_id(model, bound, monkeypatch):
    """Held-out p017-1 at t=1.4 min-p 0.05: min-p removed the canonical ``Eat``+``erson``, and the
    sampled ``E``+``aters``+``on`` sat 9.3 nats under a guess that counted them 0; and where the
    sampled line met a line 1.1 nats ahead with the same last 12 tokens but one id more, ``settle``
    took them for one line. Every line ended inside a segment, and the default search took over
    (67 calls). With no guess in a segment whose canonical ids the sampler removed, and lines of
    different lengths never settled as one, the lazy search returns the data's ``output_ids``
    itself, in 21 calls (with either rule undone it misses them)."""
    for rec, res in _without_hand_over(model, bound, monkeypatch, "heldout-t1.4-m0.05", ("p017-1",)):
        assert res.ids == rec.output_ids, rec.id
        assert res.passes <= 25, (rec.id, res.passes)


def test_lazy_search_fills_a_round_that_has_room(model, bound):
    """llama.cpp's held-out p015-0 (t=0.8, its default sampler) and p017-0 (t=1.4 min-p 0.05): a
    few lines crawled a token a round, their drafts withheld as they were kept only by a margin,
    for 39 and 36 calls. A crawl's round takes the withheld drafts: each returns the data's
    ``output_ids`` within the issue's 20 calls (8 and 11)."""
    from recon.recovery.recover import recover
    from recon.recovery.scorers import LocalScorer

    held = _held(["heldout-llamacpp-t0.8-default", "heldout-t1.4-m0.05"])
    picked = [held["heldout-llamacpp-t0.8-default", "p015-0"], held["heldout-t1.4-m0.05", "p017-0"]]
    for rec, res in zip(picked, recover(picked, bound, LocalScorer(model), progress=False, method="lazy")):
        assert res.ids == rec.output_ids, rec.id
        assert res.passes <= 20, (rec.id, res.passes)


def test_lazy_search_keeps_a_cut_behind_at_its_anchor_that_wins_later(model, bound):
    """Held-out p026-2 at t=1.3: the sampled cut is 2.5 nats behind the best where the two meet
    and 7 ahead at the end (compared where they meet, the lazy search returned ids 7.2 nats below
    the sampled ones). With the bar lowered by the next segment's cost it returns the sampled ids,
    as the default search does."""
    from recon.recovery.recover import recover
    from recon.recovery.scorers import LocalScorer

    rec = _held(["heldout-t1.3"])["heldout-t1.3", "p026-2"]
    res = next(recover([rec], bound, LocalScorer(model), progress=False, method="lazy"))
    assert not res.canonical_exact and res.ids == rec.output_ids


def test_lazy_search_lets_a_few_cuts_its_guess_drops_go_on(model, bound):
    """Held-out p027-3 at t=1.3: the sampled `` sp``+``in`` sits more than ``split_delta`` under its
    guess (the canonical `` spin``'s own cost of the rest), yet nothing that reached the next anchor
    beats it; the likeliest few such cuts a segment go on (``lead_cap``), and the search returns
    the sampled ids (it returned ids 2 nats below them). p035-2 (bytes lost to U+FFFD, where any
    byte may stand): its segment needs more cuts than ``split_cap`` (``lost_cap`` times as many
    where bytes are lost); it ended 8 nats below the sampled ids and must now score at least as
    high as they do."""
    from recon.recovery.recover import recover, sampling_of
    from recon.recovery.scorers import LocalScorer
    from recon.recovery.search import score_ids

    held = _held(["heldout-t1.3"])
    scorer = LocalScorer(model)
    exact, lost = (held["heldout-t1.3", i] for i in ("p027-3", "p035-2"))
    first, second = recover([exact, lost], bound, scorer, progress=False, method="lazy")
    assert not first.canonical_exact and first.ids == exact.output_ids
    sampling = sampling_of(lost, scorer)
    assert "\ufffd" in lost.response.content
    assert score_ids(lost.prompt_ids, second.ids, scorer, sampling) >= score_ids(lost.prompt_ids, lost.output_ids, scorer, sampling) - 1e-4


def test_lazy_search_goes_on_from_every_byte_of_a_segment(model, bound):
    """llama.cpp's held-out s32 p007-0 (t=1.0): ``吴Conarctic, �breweries、`` has no anchor inside,
    and the sampled `` \\xe7`` (a lone lead byte, shown as U+FFFD) lets any bytes stand there:
    nothing reaches the next anchor before the segment's cap is spent. Taken likeliest first, the
    cuts a few bytes in outscore the deeper ones, so the cap went on shallow cuts and the sampled
    line, deeper in, was dropped (the search returned ids 10 nats below it). Now at most
    ``per_byte`` cuts go on from each byte offset: it must return the data's ``output_ids``."""
    from recon.recovery.recover import recover
    from recon.recovery.scorers import LocalScorer

    rec = _held(["heldout-llamacpp-t1.0-s32"])["heldout-llamacpp-t1.0-s32", "p007-0"]
    assert "\ufffd" in rec.response.content
    res = next(recover([rec], bound, LocalScorer(model), progress=False, method="lazy"))
    assert not res.canonical_exact and res.ids == rec.output_ids


def test_lazy_search_costs_fewer_calls_and_positions_than_the_beam(model, bound):
    """On three non-canonical t=1.3 samples, both searches return the sampled ids; the lazy one
    makes fewer scorer calls and runs fewer model positions (each search on a fresh scorer, so
    neither reads what the other ran)."""
    from recon.recovery.recover import recover
    from recon.recovery.scorers import LocalScorer

    held = _held(["heldout-t1.3"])
    picked = [held["heldout-t1.3", i] for i in ("p004-3", "p013-2", "p014-1")]
    runs = {m: list(recover(picked, bound, LocalScorer(model), progress=False, method=m)) for m in ("beam", "lazy")}
    for beam, lazy, rec in zip(runs["beam"], runs["lazy"], picked):
        assert beam.exact and lazy.exact and lazy.ids == rec.output_ids, rec.id
    calls = {m: sum(r.passes for r in rs) for m, rs in runs.items()}
    positions = {m: sum(r.positions for r in rs) for m, rs in runs.items()}
    assert calls["lazy"] * 2 <= calls["beam"], calls
    assert positions["lazy"] < positions["beam"], positions


def test_lazy_search_out_of_rounds_hands_over_to_the_beam(model, bound):
    """With one round allowed and a count the canonical ids cannot meet (the sampled 96 where the
    canonical encode has another count), the lazy search has no answer of its own; the beam takes
    over and returns a sequence of exactly 96 ids spelling the text."""
    from recon.audit.reconstruct import reconstruct_batch, view_of
    from recon.recovery.lazy import search
    from recon.recovery.recover import Segmenter, sampling_of
    from recon.recovery.scorers import LocalScorer

    rec = _held(["heldout-t1.3"])["heldout-t1.3", "p025-1"]
    canonical = reconstruct_batch([view_of(rec, bound)], bound, "concat")[0].ids
    assert len(canonical) != len(rec.output_ids) == 96
    scorer = LocalScorer(model)
    found = search(rec.prompt_ids, canonical, Segmenter(bound.tok), scorer, sampling_of(rec, scorer), max_passes=1, length=96)
    assert len(found.ids) == 96 and found.passes > 1
    assert bound.tok.decode(found.ids) == rec.response.content


def test_cli_recover_takes_the_lazy_search_and_refuses_an_unknown_one(tmp_path, model):
    src = DATA / "smollm2-t0.7.jsonl"
    picked = [r for r in read_records(src).records if r.id in ("p022-3", "p026-3")]
    from recon.samples.records import write_records

    write_records(picked, tmp_path / "in.jsonl")
    run = recon("recover", str(tmp_path / "in.jsonl"), "--tokenizer", "smollm2", "--profile", "chatml",
                "--search", "lazy", "--together", "1", "--out", str(tmp_path / "out.jsonl"))
    assert run.returncode == 0, run.stderr
    back = [r.meta["recover"] for r in read_records(tmp_path / "out.jsonl").records]
    assert [m["exact"] for m in back] == [True, True] and all(m["positions"] > 0 for m in back)
    bad = recon("recover", str(tmp_path / "in.jsonl"), "--tokenizer", "smollm2", "--profile", "chatml",
                "--search", "greedy", "--out", str(tmp_path / "bad.jsonl"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1  # one line, no usage block
    assert bad.stderr.startswith("recon recover: error: argument --search: invalid choice: 'greedy'")
