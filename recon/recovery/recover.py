"""Recover the ids a model sampled when its text does not round-trip.

A non-canonical sample spells the same bytes as the canonical encoding of its text, only cut
into tokens differently (the model sampled ``Ġj`` + ``ets`` where the tokenizer merges
``Ġjets``). Those ids are not lost: the bytes admit only a few segmentations, and the model
that sampled them ranks them.

The search is constrained decoding, done speculatively. The canonical encoding is the draft;
one teacher-forced pass over prompt + draft gives the model's distribution at every position,
read for every token whose bytes are a prefix of the text still to come (sampled tokens are
often far outside any top-k: rank 2,851 for a real ``Ġescape`` at temperature 1.3). Where such
a token beats the draft's, or the draft's holds less than ``flag`` of their probability, the
contenders are compared by scoring their drafts over a window: each contender token, the bytes
after it refilled with the fewest tokens up to the next draft boundary or one of the two after
(``ber`` + ``rying`` where the draft had ``berry`` + ``ing``), summed from the cut to a few
tokens past where all contenders rejoin. A bare ``Ġ`` often beats ``Ġstated`` as a token, rarely
as a window. The best draft wins and a new pass verifies the rest; the model's key/value cache
of the shared prefix is reused (:class:`LocalScorer`), so each pass or window runs only the
tokens after the cut.

Scores come from a :class:`Scorer`: the local model (:class:`LocalScorer`, the ``generate``
extra) or an OpenAI-compatible server's prompt logprobs (:class:`ServerScorer`, vLLM's shape).
A server reports only its top-k per position, so it sees fewer alternatives than the local model.
The confidence is the product, over positions, of the chosen cut's share of probability: among
the byte-consistent tokens there, or where windows were compared, among the windows (at the
sampling temperature when the record's ``meta`` has it and the scorer can apply it). 1.0 means
no other cut had any weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from recon.audit.profiles import BoundProfile
from recon.audit.reconstruct import reconstruct_batch, view_of
from recon.errors import ReconError
from recon.recovery.scorers import Scorer
from recon.samples.records import Record
from recon.tokenizers.tokenizer import Tokenizer

#: positions where the chosen token holds less than this share are reported as choices
CHOICE_SHARE = 0.99
#: bytes a re-cut may span (from the cut to where it rejoins the draft)
MAX_SPAN = 32


# -- segmentations ---------------------------------------------------------------------------------------
class Segmenter:
    """Which ordinary tokens spell a given stretch of bytes (special tokens never stand in for text)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        fixed = {t.id for t in tok.added_tokens}
        self.token_bytes = tok.token_bytes
        self.ordinary = {data: i for data, i in tok.bytes_to_id.items() if i not in fixed}
        self.fixed = frozenset(fixed)
        self.max_len = max(map(len, self.ordinary))

    def prefixes(self, data: bytes, lo: int, hi: int) -> list[int]:
        """Ordinary tokens whose bytes are a prefix of ``data[lo:hi]``."""
        found = []
        for length in range(1, min(self.max_len, hi - lo) + 1):
            tid = self.ordinary.get(data[lo : lo + length])
            if tid is not None:
                found.append(tid)
        return found

    def fewest(self, data: bytes) -> list[int]:
        """The segmentation of ``data`` into the fewest ordinary tokens (longest first on ties)."""
        n = len(data)
        best: list[tuple[int, int] | None] = [None] * (n + 1)  # (tokens, length of last) to reach i
        best[0] = (0, 0)
        for i in range(n):
            if best[i] is None:
                continue
            for length in range(min(self.max_len, n - i), 0, -1):
                if data[i : i + length] in self.ordinary:
                    cand = (best[i][0] + 1, length)
                    if best[i + length] is None or cand[0] < best[i + length][0]:
                        best[i + length] = cand
        if best[n] is None:
            raise ReconError(f"no segmentation of {data!r} into ordinary tokens")
        out, i = [], n
        while i:
            length = best[i][1]
            out.append(self.ordinary[data[i - length : i]])
            i -= length
        return out[::-1]


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
    #: recovered == ground truth / canonical encode == ground truth (None without output_ids)
    exact: bool | None = None
    canonical_exact: bool | None = None
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.ids is not None and self.ids != self.canonical

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
                   passes=meta.get("passes", 0), exact=meta.get("exact"), canonical_exact=meta.get("canonical_exact"),
                   error=meta.get("error"))

    def to_meta(self) -> dict:
        """What ``recon recover`` stores in a record's ``meta["recover"]`` (and export reads back)."""
        return {"ids": self.ids, "confidence": None if self.confidence is None else round(self.confidence, 6),
                "candidates": self.n_candidates if self.ids is not None else 0, "changed": self.changed,
                "exact": self.exact, "canonical_exact": self.canonical_exact, "passes": self.passes,
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


def _spellable(seg: Segmenter, ids: Sequence[int], offs: Sequence[int], data: bytes, k: int) -> tuple[int, int]:
    """Byte range position ``k`` may take a token from: up to the next fixed (special) token."""
    end = next((offs[j] for j in range(k, len(ids)) if ids[j] in seg.fixed), len(data))
    return offs[k], end


def _share(chosen_lp: float, lps: Iterable[float]) -> float:
    lps = list(lps)
    top = max(lps)
    return math.exp(chosen_lp - top) / sum(math.exp(x - top) for x in lps)


def _boundary_index(seg: Segmenter, ids: Sequence[int], offset: int) -> int:
    """The index in ``ids`` of the token starting at byte ``offset`` (len(ids) at the end)."""
    pos = 0
    for j, i in enumerate(ids):
        if pos >= offset:
            return j
        pos += len(seg.token_bytes[i])
    return len(ids)


def recover_ids(prompt: Sequence[int], canonical: Sequence[int], seg: Segmenter, scorer: Scorer, *,
                temperature: float = 1.0, lookahead: bool = True, margin: float = 8.0, window: int = 4,
                rejoins: int = 2, flag: float = 0.98, max_passes: int = 400) -> tuple[list[int], float, list[Choice], int]:
    """The most likely ids spelling the same bytes as ``canonical`` after ``prompt``.

    Returns (ids, confidence, choices, scorer calls). At a position where the draft's token holds
    less than ``flag`` of the probability among the byte-consistent tokens (or isn't the most
    likely), every such token within ``margin`` nats of the best is tried: its draft is scored up
    to ``window`` tokens past the point where all contenders rejoin the same cut, and the best
    sum wins. A token-level choice alone would pick a bare ``Ġ`` over ``Ġstated``; the window
    sees that ``stated`` without its space is improbable. ``lookahead=False`` takes the best
    token alone (cheaper, worse)."""
    tb = seg.token_bytes
    draft = list(canonical)
    data = b"".join(tb[i] for i in draft)
    n = len(prompt)
    start, calls, confidence, choices = 0, 0, 1.0, []
    scored = None
    while calls < max_passes:
        offs = _offsets(tb, draft)
        if scored is None:
            wanted = {n + k: seg.prefixes(data, *_spellable(seg, draft, offs, data, k))
                      for k in range(start, len(draft)) if draft[k] not in seg.fixed}
            scored = scorer([list(prompt) + draft], temperature, wanted)[0]
            calls += 1
        cut = None
        for k in range(start, len(draft)):
            if draft[k] in seg.fixed or n + k == 0:
                continue
            lo, hi = _spellable(seg, draft, offs, data, k)
            options = {draft[k]: scored.logprobs[n + k]}
            for tid, lp in scored.top[n + k]:
                if tid not in options and tid not in seg.fixed and lo + len(tb[tid]) <= hi and data.startswith(tb[tid], lo):
                    options[tid] = lp
            if len(options) == 1:
                continue
            ranked = sorted(options.items(), key=lambda kv: -kv[1])
            best, share = ranked[0][0], _share(options[draft[k]], options.values())
            if best == draft[k] and share >= flag:
                confidence *= share
                continue
            contenders = [tid for tid, lp in ranked if lp >= ranked[0][1] - margin]
            if draft[k] not in contenders:
                contenders.append(draft[k])
            if lookahead and len(contenders) > 1:
                drafts = [draft]
                for tid in contenders:
                    for d in _cuts(seg, draft, k, tid, rejoins) if tid != draft[k] else ():
                        if d not in drafts:
                            drafts.append(d)
                # every contender rejoins the draft's cut by the end of the longest contender's refill
                rejoin = max(_offsets(tb, d)[k + 1 + _refill_len(seg, draft, k, d)] for d in drafts)
                j = _boundary_index(seg, draft, rejoin)
                end_bytes = offs[min(j + window, len(draft))]
                ends = [_boundary_index(seg, d, end_bytes) for d in drafts]
                results = scorer([list(prompt) + d[:e] for d, e in zip(drafts, ends)], temperature)
                calls += 1
                totals = [sum(r.logprobs[n + k : n + e]) for r, e in zip(results, ends)]
                top = max(range(len(drafts)), key=totals.__getitem__)
                # a token's score: its best draft's (the choice reported is of the token at k)
                per_token: dict[int, float] = {}
                for d, total in zip(drafts, totals):
                    per_token[d[k]] = max(per_token.get(d[k], -math.inf), total)
                ranked = sorted(per_token.items(), key=lambda kv: -kv[1])
                best = drafts[top][k]
                share = _share(totals[top], per_token.values())
            elif not lookahead:
                share = _share(options[best], options.values())
            confidence *= share
            if share < CHOICE_SHARE or best != draft[k]:
                choices.append(Choice(k, offs[k], ranked, best, share))
            if best != draft[k]:
                draft = drafts[top] if lookahead and len(contenders) > 1 else _cut(seg, draft, k, best)
                cut, scored = k, None
                break
        if cut is None:
            break
        start = cut + 1
    if b"".join(tb[i] for i in draft) != data:
        raise AssertionError("recovery changed the bytes")  # a bug, never the input's fault
    return draft, confidence, choices, calls


def _refill_len(seg: Segmenter, old: Sequence[int], k: int, new: Sequence[int]) -> int:
    """How many tokens after position ``k`` the cut ``new`` differs from ``old`` (its refill)."""
    if new is old:
        return 0
    tail = 0
    while tail < min(len(old), len(new)) - k - 1 and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return len(new) - k - 1 - tail


def recover(records: Sequence[Record], bound: BoundProfile, scorer: Scorer, *, temperature: float | None = None,
            lookahead: bool = True, progress: bool | None = None) -> Iterator[Recovery]:
    """Recover each record's sampled ids from its text (its response, or the API view of its
    output_ids): the canonical encode, then the search above. ``temperature``: score at this
    temperature; None takes the record's ``meta["temperature"]`` where the scorer can apply it,
    else 1. Records without ``prompt_ids`` get an error (the model needs the context); every
    record gets a result, in order. Text holding U+FFFD lost bytes no cut can restore: its
    confidence is 0."""
    from tqdm.auto import tqdm

    seg = Segmenter(bound.tok)
    views = [view_of(r, bound) for r in records]
    canon = reconstruct_batch(views, bound, "concat")
    for rec, rc in tqdm(list(zip(records, canon)), desc="recover", unit="sample", disable=None if progress is None else not progress):
        truth = rec.output_ids
        base = Recovery(rec.id, rec.dataset, None, rc.ids, None,
                        canonical_exact=None if truth is None or rc.ids is None else rc.ids == truth)
        if rc.ids is None:
            base.error = f"no canonical encoding: {rc.error}"
        elif rec.prompt_ids is None:
            base.error = "field prompt_ids: recovery scores the output in its context and needs the prompt ids"
        if base.error:
            yield base
            continue
        temp = temperature
        if temp is None:
            meta_t = rec.meta.get("temperature") if isinstance(rec.meta, dict) else None
            temp = float(meta_t) if scorer.tempered and isinstance(meta_t, (int, float)) and meta_t > 0 else 1.0
        ids, conf, choices, passes = recover_ids(rec.prompt_ids, rc.ids, seg, scorer, temperature=temp, lookahead=lookahead)
        if "\ufffd".encode() in bound.tok.ids_bytes(rc.ids):
            conf = 0.0  # the text has a replacement character: bytes were lost, no cut can bring them back
        base.ids, base.confidence, base.choices, base.passes = ids, conf, choices, passes
        base.exact = None if truth is None else ids == truth
        yield base


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
