"""Recover the ids a model sampled when its text does not round-trip.

A non-canonical sample spells the same bytes as the canonical encoding of its text, only cut
into tokens differently (the model sampled ``Ġj`` + ``ets`` where the tokenizer merges
``Ġjets``). Those ids are not lost: the bytes admit only a few segmentations, and the model
that sampled them ranks them.

The search (:mod:`recon.recovery.search`) is a beam over the states of the text, every prefix
scored exactly under the sampling distribution (the record's temperature, and top-k/top-p/min-p
where its ``meta`` says, :mod:`recon.recovery.sampling`), every token the text allows read by id.
It drops a prefix only when another prefix already reaches the state, or the next point every
candidate must pass, more than ``delta`` nats higher. Text holding U+FFFD (a sample cut inside a
character) is searched too: there any bytes the decoder turns into U+FFFD may stand.

Scores come from a :class:`Scorer`: the local model (:class:`LocalScorer`, the ``generate``
extra) or an OpenAI-compatible server's prompt logprobs (:class:`ServerScorer`, vLLM's shape).
A server reports only its top-k per position, so it sees fewer alternatives than the local model,
and scores at temperature 1 without truncation. The confidence is the returned ids' share of
probability among every candidate the search saw (complete, or dropped on the way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from recon.audit.profiles import BoundProfile
from recon.audit.reconstruct import reconstruct_batch, view_of
from recon.recovery.sampling import Sampling
from recon.recovery.scorers import Scorer, counters, spent
from recon.recovery.search import Segmenter, search
from recon.samples.records import Record

#: positions where the chosen token holds less than this share are reported as choices
CHOICE_SHARE = 0.99
#: bytes a re-cut may span (from the cut to where it rejoins the draft), for candidate_sequences
MAX_SPAN = 32


# -- results ---------------------------------------------------------------------------------------------
@dataclass
class Choice:
    """A position where another cut of the text had weight: the candidates for the token there."""

    position: int  # index in the output ids
    offset: int  # byte offset in the output
    #: (token id, log score), best first; ``log score`` is the logprob there (or, with lookahead,
    #: the summed logprob of that candidate's draft over the window)
    candidates: list[tuple[int, float]]
    chosen: int
    share: float  # the chosen candidate's share of probability among the candidates


@dataclass
class Recovery:
    """The recovered ids of one record, how sure, and what else was considered."""

    id: str
    dataset: str
    ids: list[int] | None
    canonical: list[int] | None
    confidence: float | None
    choices: list[Choice] = field(default_factory=list)
    passes: int = 0
    #: what the scorer spent on it (:func:`~recon.recovery.scorers.spent`: positions run, forward
    #: passes, round trips, tokens sent, as the scorer counts them); empty with searches run together
    cost: dict = field(default_factory=dict)
    #: recovered == ground truth / canonical encode == ground truth (None without output_ids)
    exact: bool | None = None
    canonical_exact: bool | None = None
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.ids is not None and self.ids != self.canonical

    @property
    def positions(self) -> int | None:
        """Model positions scored for this record: what the local model ran new for it, or what a
        server computed (None where the scorer does not count, or searches ran together)."""
        return self.cost.get("positions_computed")

    @property
    def n_candidates(self) -> int:
        """Full sequences considered: the chosen one plus one per other candidate at each choice."""
        return 1 + sum(len(c.candidates) - 1 for c in self.choices)

    def candidate_sequences(self, seg: Segmenter) -> list[list[int]]:
        """The recovered ids, then each single-choice alternative: the other candidate token at a
        choice with the bytes up to the next boundary refilled (all spell the same bytes)."""
        if self.ids is None:
            return []
        out = [list(self.ids)]
        for choice in self.choices:
            for tid, _ in choice.candidates:
                if tid != self.ids[choice.position]:
                    out.append(_cut(seg, self.ids, choice.position, tid))
        return out

    @classmethod
    def from_meta(cls, rid: str, dataset: str, meta: dict) -> "Recovery":
        """A result back from a record's ``meta["recover"]`` (what a resumed run's summary counts).
        The canonical ids are not stored, only whether recovery changed them."""
        ids = meta.get("ids")
        return cls(rid, dataset, ids, None if meta.get("changed") else ids, meta.get("confidence"),
                   passes=meta.get("passes", 0), cost=meta.get("cost") or {}, exact=meta.get("exact"), canonical_exact=meta.get("canonical_exact"),
                   error=meta.get("error"))

    def to_meta(self) -> dict:
        """What ``recon recover`` stores in a record's ``meta["recover"]`` (and export reads back)."""
        return {"ids": self.ids, "confidence": None if self.confidence is None else round(self.confidence, 6),
                "candidates": self.n_candidates if self.ids is not None else 0, "changed": self.changed,
                "exact": self.exact, "canonical_exact": self.canonical_exact, "passes": self.passes,
                "positions": self.positions, "cost": self.cost,
                "error": self.error}


# -- the search ------------------------------------------------------------------------------------------
def _offsets(token_bytes: Sequence[bytes], ids: Sequence[int]) -> list[int]:
    out = [0]
    for i in ids:
        out.append(out[-1] + len(token_bytes[i]))
    return out


def _cut(seg: Segmenter, ids: Sequence[int], k: int, tid: int) -> list[int]:
    """``ids`` with token ``tid`` at position ``k``: bytes from its end up to the next boundary of
    ``ids`` refilled with the fewest tokens, the rest of ``ids`` unchanged. Same bytes throughout."""
    return _cuts(seg, ids, k, tid, rejoins=0)[0]


def _cuts(seg: Segmenter, ids: Sequence[int], k: int, tid: int, rejoins: int) -> list[list[int]]:
    """:func:`_cut`, and the same cut rejoining ``ids`` up to ``rejoins`` boundaries later (the
    bytes in between refilled with the fewest tokens): ``ber`` + ``rying`` where the draft had
    ``berry`` + ``ing``. Only within the stretch of text before the next fixed token."""
    offs = _offsets(seg.token_bytes, ids)
    end = offs[k] + len(seg.token_bytes[tid])
    first = next(j for j in range(k + 1, len(offs)) if offs[j] >= end)
    out = []
    for j in range(first, min(first + rejoins + 1, len(ids) + 1)):
        if j > first and (ids[j - 1] in seg.fixed or offs[j] - offs[k] > MAX_SPAN):
            break
        data = b"".join(seg.token_bytes[i] for i in ids[k:j])
        rest = data[end - offs[k] :]
        out.append(list(ids[:k]) + [tid] + (seg.fewest(rest) if rest else []) + list(ids[j:]))
    return out


def recover_ids(prompt: Sequence[int], canonical: Sequence[int], seg: Segmenter, scorer: Scorer, *,
                sampling: Sampling | None = None, lookahead: bool = True, method: str = "beam",
                **options) -> tuple[list[int], float, list[Choice], int]:
    """The most likely ids whose text is ``canonical``'s after ``prompt`` under ``sampling``
    (``method``: one of :data:`SEARCHES`). Returns (ids, confidence, choices, scorer calls).
    ``lookahead=False`` keeps one prefix per state (cheaper, not exact)."""
    if not lookahead:
        options = {"delta": 0.0, "top": 1, **options}
    found = _search_by(method)(prompt, canonical, seg, scorer, sampling or Sampling(), **options)
    return found.ids, found.confidence, _choices(seg, found), found.passes


#: the searches ``recover`` can run: the breadth-first beam (:mod:`recon.recovery.search`, the
#: default) and the lazy anchor beam (:mod:`recon.recovery.lazy`: fewer scorer calls, opt-in)
SEARCHES = ("beam", "lazy")


def _search_by(method: str):
    if method == "beam":
        return search
    if method == "lazy":
        from recon.recovery.lazy import search as lazy_search

        return lazy_search
    raise ValueError(f"search {method!r}: expected one of {', '.join(SEARCHES)}")


def _choices(seg: Segmenter, found) -> list[Choice]:
    """Where rivals part from the returned ids: per position, the best score of each token there."""
    ids = found.ids
    per: dict[int, dict[int, float]] = {}
    for rival, rel in found.rivals:
        k = next((j for j, (a, b) in enumerate(zip(rival, ids)) if a != b), None)
        if k is None or rel < -30:
            continue
        tokens = per.setdefault(k, {ids[k]: 0.0})
        tokens[rival[k]] = max(tokens.get(rival[k], -math.inf), rel)
    out, offs = [], _offsets(seg.token_bytes, ids)
    for k in sorted(per):
        ranked = sorted(per[k].items(), key=lambda kv: -kv[1])
        share = 1.0 / sum(math.exp(v) for _, v in ranked)
        out.append(Choice(k, offs[k], ranked, ids[k], share))
    return out


def recover(records: Sequence[Record], bound: BoundProfile, scorer: Scorer, *, temperature: float | None = None,
            lookahead: bool = True, progress: bool | None = None, together: int = 1,
            slack: float | None = None, method: str = "beam") -> Iterator[Recovery]:
    """Recover each record's sampled ids from its text (its response, or the API view of its
    output_ids): the canonical encode, then the search above. ``temperature``: score at this
    temperature; None takes the record's ``meta["temperature"]`` where the scorer can apply it,
    else 1; the sampler's truncation (``top_p``, ``top_k``, ``min_p`` in ``meta``) where the scorer
    can apply it, with ``slack`` nats at the cut for another engine's numerics (None: by the
    record, :meth:`~recon.recovery.sampling.Sampling.from_meta`). Records without ``prompt_ids``
    get an error (the model needs the context), and so
    does a record whose search raised (:func:`search_failed`: one line naming it); every record gets a
    result, in order. ``together``: searches run at once, each round of their scorer calls run as
    one (:mod:`recon.recovery.together`; the local scorer only): the same ids for any value, a
    confidence within float rounding (positions batched with others round differently).
    ``method``: the search, one of :data:`SEARCHES`."""
    from tqdm.auto import tqdm

    _search_by(method)  # an unknown name fails here, before any record

    seg = Segmenter(bound.tok)
    views = [view_of(r, bound) for r in records]
    canon = reconstruct_batch(views, bound, "concat")
    jobs = list(zip(records, canon))
    bar = tqdm(total=len(jobs), desc="recover", unit="sample", disable=None if progress is None else not progress)

    def one(k: int, job, scoring) -> Recovery:
        return _recover_one(*job, seg, scoring, temperature, lookahead, slack, method)

    if together > 1 and getattr(scorer, "batches_alternatives", False) and len(jobs) > 1:
        from recon.recovery.together import run_together

        results = run_together(jobs, one, scorer, together)
    else:
        results = (one(k, job, scorer) for k, job in enumerate(jobs))
    try:
        for result in results:
            bar.update(1)
            yield result
    finally:
        bar.close()


def _recover_one(rec: Record, rc, seg: Segmenter, scorer: Scorer, temperature: float | None, lookahead: bool,
                 slack: float | None = None, method: str = "beam") -> Recovery:
    """One record's recovery (see :func:`recover`)."""
    truth = rec.output_ids
    base = Recovery(rec.id, rec.dataset, None, rc.ids, None,
                    canonical_exact=None if truth is None or rc.ids is None else rc.ids == truth)
    if rc.ids is None:
        base.error = f"no canonical encoding: {rc.error}"
    elif rec.prompt_ids is None:
        base.error = "field prompt_ids: recovery scores the output in its context and needs the prompt ids"
    if base.error:
        return base
    sampling = sampling_of(rec, scorer, temperature, slack)
    before = counters(scorer)
    try:
        ids, conf, choices, passes = recover_ids(rec.prompt_ids, rc.ids, seg, scorer, sampling=sampling, lookahead=lookahead,
                                                 method=method, length=token_count(rec))
    except Exception as exc:  # one record's failure, not the run's: it gets an error, the rest go on
        base.error = search_failed(rec.id, exc)
        base.cost = spent(before, scorer) if before else {}
        return base
    base.ids, base.confidence, base.choices, base.passes = ids, conf, choices, passes
    base.exact = None if truth is None else ids == truth
    base.cost = spent(before, scorer) if before else {}
    return base


def token_count(rec: Record) -> int | None:
    """How many ids the model sampled, where the record says: ``meta["completion_tokens"]`` (an
    API's ``usage.completion_tokens``, which the importers keep), else ``meta["max_new_tokens"]``
    (or ``max_tokens``) for a response cut at that limit (``finish_reason`` "length")."""
    meta = rec.meta if isinstance(rec.meta, dict) else {}

    def count(key):
        value = meta.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    if count("completion_tokens") is not None:
        return count("completion_tokens")
    if rec.response is not None and rec.response.finish_reason == "length":
        return count("max_new_tokens") or count("max_tokens")
    return None


def search_failed(rid: str, exc: BaseException, what: str = "the search") -> str:
    """One line naming the record, for an unexpected error in its search (a bug to report)."""
    msg = " ".join(str(exc).split()) or "no message"
    return f"record {rid}: {what} failed ({type(exc).__name__}: {msg})"


def sampling_of(rec: Record, scorer: Scorer, temperature: float | None = None, slack: float | None = None) -> Sampling:
    """The distribution to score ``rec`` under: its meta's sampler where ``scorer`` can apply it
    (``slack``: :meth:`~recon.recovery.sampling.Sampling.from_meta`'s)."""
    if not getattr(scorer, "tempered", False):
        return Sampling(temperature) if temperature else Sampling()
    full = Sampling.from_meta(rec.meta, temperature, slack)
    return full if getattr(scorer, "truncates", False) else Sampling(full.temperature)


def summarize(results: Sequence[Recovery]) -> dict:
    """Counts for the summary line and the notebook: how often the canonical encode was wrong,
    how many of those recovery fixed, how many exact samples it broke."""
    judged = [r for r in results if r.exact is not None]
    wrong = [r for r in judged if not r.canonical_exact]
    right = [r for r in judged if r.canonical_exact]
    return {
        "samples": len(results), "errors": sum(r.error is not None for r in results),
        "changed": sum(r.changed for r in results), "with_truth": len(judged),
        "canonical_wrong": len(wrong), "recovered": sum(r.exact for r in wrong),
        "broken": sum(not r.exact for r in right), "exact_after": sum(r.exact for r in judged),
    }


def summary_line(results: Sequence[Recovery], min_confidence: float = 0.9) -> str:
    s = summarize(results)
    confident = sum(r.confidence is not None and r.confidence >= min_confidence for r in results)
    line = (f"recovered {s['samples'] - s['errors']} of {s['samples']} samples ({s['errors']} errors): "
            f"{s['changed']} differ from the canonical encode, {confident} with confidence >= {min_confidence:g}")
    if s["with_truth"]:
        fixed = f"{s['recovered']}/{s['canonical_wrong']}" + (f" ({s['recovered'] / s['canonical_wrong']:.1%})" if s["canonical_wrong"] else "")
        line += (f"; against ground truth: canonical encode wrong for {s['canonical_wrong']} of {s['with_truth']}, "
                 f"recovered exactly {fixed}, exact samples made wrong {s['broken']}")
    return line


# -- tables and plots (pure: they read result rows, no model needed) ----------------------------------------
def recovery_table(rows, min_confidence: float = 0.9):
    """Per dataset, from result rows (``benchmarks/recover_accuracy.py``'s or :meth:`Recovery.to_meta`
    fields plus ``dataset`` and ``non_canonical``): how often the canonical encode was wrong, how
    many non-canonical samples recovery got back exactly, how many exact samples it made wrong,
    and how trustworthy its confidence is."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    out = []
    for name, g in list(frame.groupby("dataset", sort=True)) + ([("all", frame)] if frame["dataset"].nunique() > 1 else []):
        nc = g[g["non_canonical"]]
        right = g[g["canonical_exact"]]
        sure = g[g["confidence"] >= min_confidence]
        out.append({
            "dataset": name, "samples": len(g),
            "canonical wrong": int((~g["canonical_exact"]).sum()),
            "canonical wrong %": 100 * (~g["canonical_exact"]).mean(),
            "non-canonical": len(nc),
            "recovered exactly": int(nc["exact"].sum()),
            "recovered %": 100 * nc["exact"].mean() if len(nc) else float("nan"),
            "exact made wrong": int((~right["exact"]).sum()),
            "exact after %": 100 * g["exact"].mean(),
            f"conf>={min_confidence:g}": len(sure),
            f"exact | conf>={min_confidence:g} %": 100 * sure["exact"].mean() if len(sure) else float("nan"),
        })
    return pd.DataFrame(out).set_index("dataset").round(1)


def recovery_plot_data(table):
    """What :func:`plot_recovery` draws: exact-sample rate per dataset, canonical encode vs recovered."""
    import pandas as pd

    return pd.DataFrame({"canonical encode": 100 - table["canonical wrong %"], "recovered": table["exact after %"]})


def plot_recovery(table, title: str = "samples whose ids come back exactly"):
    import matplotlib.pyplot as plt

    data = recovery_plot_data(table)
    fig, ax = plt.subplots(figsize=(6, 3))
    data.plot.bar(ax=ax, rot=0)
    ax.set_ylabel("% of samples")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    fig.tight_layout()
    return fig
