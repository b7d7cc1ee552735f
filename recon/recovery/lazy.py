"""A cheaper search for the sampled segmentation: a beam over the text's anchors, scored lazily, in rounds.

Opt-in (``recon recover --search lazy``). It recovers what :mod:`recon.recovery.search`, the default,
recovers on every held-out file (docs/recovery.md has the figures), but its guess inside a segment
is not a bound: it can drop a sampled cut the default keeps on data nobody has run it on.

A candidate is any sequence of ids whose text, decoded as a server decodes it (special tokens
apart, invalid UTF-8 as U+FFFD), is the text the API returned. Its score is its log-probability
under the sampling distribution (:class:`~recon.recovery.sampling.Sampling`: temperature, and
top-k/top-p/min-p where the record says; a token the sampler removed had probability 0), the sum
of one exact conditional per token, each read from a teacher-forced pass over that very prefix.

**What costs.** A model position is the distribution after one prefix. A prefix's own score comes
from its parent's distribution, so it costs nothing until the search wants to go on from it
(Vieira et al., ICML 2025: a position runs only when a token is closed and its extension survives
pruning). The scorer counts the positions it runs (:func:`recon.recovery.scorers.counters`), and
:class:`~recon.recovery.search.SearchResult` the rounds (scorer calls).

**Anchors** (:mod:`recon.recovery.states`) are byte offsets no token can straddle (the start of
most words): every candidate has a token boundary there. Between two anchors the text is a short
segment; the beam holds, at each anchor, the prefixes that reach it.

**A segment, best first.** From the beam at one anchor, prefixes are taken likeliest first (Meister
et al., TACL 2020): a prefix still inside the segment is extended by every token the text allows
there, one that reached the next anchor joins the beam there unless it is more than ``delta`` nats
below the best there, beyond the ``top`` best, or the same as a better one for the last ``settle``
tokens. The default search compares prefixes one anchor later (with what the best reaches at the
anchor after), and a prefix behind at one anchor can lead at the next (held-out p026-2 at t=1.3: 2.5
nats behind, then 7 ahead); so the bar is lowered by the canonical ids' own cost over the next
segment, at most ``ahead`` nats; and a prefix whose distribution is already known (a draft ran
through it) stays if it is within ``delta`` + ``probe`` of the bar. Its next tokens cost nothing,
and where the next segment starts the default search's own rule judges it: it goes on only within
``delta`` of the best that reached the anchor after (held-out llama.cpp s32 p015-1 at t=1.0: the
sampled ids 4.4 nats behind at one anchor, and the likeliest at the end). Taken in score order,
every completion better than a prefix is known when the prefix is looked at. Log-probabilities only
fall as a prefix grows, so a prefix inside the segment already more than ``delta`` below the best
that reached the next anchor could be dropped exactly, but in text the model finds odd (gibberish at
t=1.3) that still expands thousands of cuts. So a prefix inside a segment is judged on a *guess* of
the rest of the segment (the canonical ids' own scores from their next boundary on, a token the
sampler removed counted 0 past its segment) against the best line's guess, and goes on only within
``split_delta`` of it, at most ``split_cap * top`` per segment (``lost_cap`` times as many where the
text lost bytes: any bytes may stand for a U+FFFD, and such a segment has hundreds of cuts), and at
most ``per_byte`` from any one byte offset: taken likeliest first, cuts a few bytes in outscore the
deeper ones, and where nothing reaches the next anchor before the cap is spent, a cap on the
segment alone went on shallow cuts and dropped the sampled line deeper in (held-out llama.cpp s32
p007-0 at t=1.0, 10 nats; t=1.3 p017-2 and p035-3). This is the rule that is not exact (held-out
p005-2 at t=1.3 needs ``split_delta`` 4: its better cut is 3.9 below the guess half way through
the segment). The guess charges a cut the canonical ids' cost of the rest, which a cut that goes
on differently does not pay (p027-3's sampled `` sp``+``in`` against the canonical
`` spin``): so the likeliest ``lead_cap`` prefixes a segment that the guess drops but the bound keeps
(nothing at the next anchor is ``delta`` above them, the bar there lowered as at the anchor) go on
too. The canonical ids are never dropped (the answer scores at least as high as they do). In a
segment where the sampler removed one of the canonical ids the guess says nothing (the sampled cut
of ``Eaterson`` in held-out t=1.4 min-p 0.05 p017-1 sat 9.3 nats under a guess that counted the
removed ``Eat``+``erson`` 0), and a prefix there goes on by the bound alone, within ``split_delta``
of the best that reached the next anchor, at most the cap.

**The count.** With ``length`` (how many ids were sampled, where the record says) a prefix that
cannot end with exactly that many ids is impossible. Prefixes are rivals only as far as they still
need cuts off the canonical ids to end with that count (``need``): one that still needs more must
pay for them later, so its lead now drops nothing; and two prefixes of different lengths are never
the same line for ``settle``, whatever their last tokens (the text after them must absorb the
difference). Before the last U+FFFD for lost bytes (:attr:`~recon.recovery.states.Text.certain_from`)
no count is certain and all are rivals.

**Rounds.** The sweep over the segments reads only distributions already known. A prefix the rules
keep whose distribution is not known yet waits; the sweep goes on past it, and every prefix waiting
anywhere is scored in the next round, all in one scorer call (one forward pass with the local
scorer's prefix tree). A waiting prefix the rules keep with room to spare (at or above its bar) goes
with a draft: the ids the canonical encode spells from where it stands (the fewest tokens back to a
canonical boundary, then the canonical ids), to the next anchor, twice as long each time the same
line outlives its draft, to the end for the line that leads. One kept only by a margin goes alone:
its draft was read about one time in ten on held-out t=1.3 samples (a draft from above its bar, one
in three), unless the round is a crawl: one of at most ``top`` lines with fewer than ``fill``
positions to run takes the withheld drafts too, the likeliest line first, as a call costs a fixed
part whatever it holds and a line that crawls alone pays a call a token. The sweep runs again on
what is known. When nothing waits, the sweep's answer is final, and the drafts decided what it cost
(and, now and then, a guess: a segment's guess is set by the beam lines whose distributions are
known when it starts). ``max_passes`` caps the rounds: what still waits after the last is dropped.

**Dead ends.** Every line can end inside a segment: with a truncating sampler (every way on needs a
token the sampler removed), or with a count the lines kept can no longer meet. Under truncation
the way on was a cut the guess dropped, so the sweeps run once more over what is known with the
guess's rules ``widen`` times wider (its caps ``widen`` squared): a few more rounds, where the
default search takes 30 to 50 (held-out t=1.0 top-p 0.9 p010-3, p019-0, p031-1), with its answer.
Without truncation a dead end is the count, and a wider guess finds a line that meets it but not
always the best one (held-out t=1.3 p015-0: 6.6 nats below the default search's answer), so
there, as when the search runs out of rounds with no answer or the wider sweep ends too,
:func:`recon.recovery.search.search` takes over, reading what was scored here from the scorer's
prefix tree.

**A second look** (:func:`~recon.recovery.repair.repair`, as after the default search): what the
rules dropped at an anchor is finished along the answer's tail, or its last cut moved into it, and
the likeliest few scored whole.

**Confidence** is the returned sequence's share of probability among every candidate: the
complete ones found, and each dropped prefix counted as if it went on as well as the best did.

It is one module because the sweep, its rules, the drafts and the rounds read and write one
search's state (the distributions known, the drafts' lengths, the waiting lines' margins).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, replace
from typing import Sequence

from recon.errors import ReconError
from recon.recovery.repair import repair
from recon.recovery.sampling import Sampling
from recon.recovery.search import SearchResult
from recon.recovery.search import search as beam_search
from recon.recovery.states import Segmenter, Text, common_suffix


@dataclass
class _Sweep:
    """What one sweep over the segments found."""

    done: list[tuple[float, tuple[int, ...]]]  # complete candidates, best first
    rivals: list[tuple[tuple[int, ...], float]]
    waiting: dict[tuple[int, ...], tuple[int, bytes]]  # kept prefixes with no distribution yet -> state
    leads: set[tuple[int, ...]]  # those of them that were the best at their anchor


@dataclass(frozen=True)
class Rules:
    """One lazy search's rules: :func:`search`'s knobs (its signature holds their defaults and
    its docstring what each does), kept together so the search reads them from one place."""

    delta: float
    top: int
    settle: int
    max_passes: int
    split_delta: float
    split_cap: int
    ahead: float
    probe: float
    draft_margin: float
    lead_cap: int
    lost_cap: int
    per_byte: int
    repairs: int
    repair_width: int
    widen: float
    fill: int


def search(prompt: Sequence[int], canonical: Sequence[int], seg: Segmenter, scorer, sampling: Sampling, *,
           delta: float = 2.0, top: int = 4, settle: int = 12, max_passes: int = 60,
           length: int | None = None, split_delta: float = 4.0, split_cap: int = 256, ahead: float = 1.0,
           probe: float = 3.0, draft_margin: float = 0.0, lead_cap: int = 4, lost_cap: int = 4, per_byte: int = 16,
           repairs: int = 3, repair_width: int = 8, widen: float = 2.0, fill: int = 64) -> SearchResult:
    """The most likely ids under ``sampling`` whose text is ``canonical``'s, after ``prompt``;
    with ``length``, of exactly that many ids (what the API's ``usage.completion_tokens`` says,
    or ``max_tokens`` for a sample cut at it). ``split_delta``: how far below the best guess at
    the next anchor a prefix inside a segment may fall and still go on, at most ``split_cap * top``
    of them a segment (``lost_cap`` times as many where bytes are lost) and ``per_byte`` from any
    one byte offset in it; ``lead_cap``: how many a segment go on although the guess drops them,
    the likeliest first. ``ahead``: the most the bar
    at an anchor is lowered for the next segment's cost; ``probe``: how much further below it a
    prefix whose distribution is known may be and still go on to the next segment's own test.
    ``draft_margin``: how far below its bar a waiting prefix may be and still go with a draft
    (what it costs; see the module's *Rounds*).
    ``max_passes``: rounds before the search hands over to :func:`recon.recovery.search.search`
    (which reuses every position scored so far through the scorer's prefix tree). ``widen``: at a
    dead end under a truncating sampler, how much wider the guess's rules are for one more try
    before that hand-over (``split_delta`` times it, the caps times its square; 1: none). ``fill``:
    a round of at most ``top`` lines with fewer positions to run than this also takes the drafts
    ``draft_margin`` withheld, likeliest first, until it has about as many (0: none).
    ``repairs``/``repair_width``: the second look (:func:`~recon.recovery.repair.repair`) after the
    sweeps."""
    rules = Rules(delta, top, settle, max_passes, split_delta, split_cap, ahead, probe, draft_margin, lead_cap,
                  lost_cap, per_byte, repairs, repair_width, widen, fill)
    return _Search(prompt, canonical, Text(seg, canonical), scorer, sampling, length, rules).run()


class _Search:
    def __init__(self, prompt, canonical, text: Text, scorer, sampling, length: int | None, rules: Rules):
        self.prompt, self.canonical, self.text, self.seg = list(prompt), tuple(canonical), text, text.seg
        self.scorer, self.sampling, self.length, self.rules = scorer, sampling, length, rules
        self.kwargs = {"sampling": sampling} if getattr(scorer, "truncates", False) else {}
        self.dists: dict[tuple[int, ...], dict[int, float]] = {}
        self.drafted: dict[tuple[int, ...], int] = {}  # a draft's last prefix -> the draft's length
        self.passes = 0
        self.margin: dict[tuple[int, ...], float] = {}
        self.draft_at: dict[int, int] = {}  # byte offset of a canonical boundary -> index in canonical
        pos = 0
        for k, i in enumerate(canonical):
            self.draft_at[pos] = k
            pos += len(self.seg.token_bytes[i])
        self.draft_at[pos] = len(canonical)
        self.fewest = text.fewest_to_end() if length is not None else None
        self.rest = text.canonical_rest(self.draft_at) if length is not None else None
        n = len(text.data)
        inside = {q for f, t in text.fixed_at.items() for q in range(f + 1, f + len(self.seg.token_bytes[t]))}
        self.anchors = sorted((set(text.anchors) | {0, n}) - inside)  # (a special token's bytes are one token)

    # -- scoring ----------------------------------------------------------------------------------
    def _score(self, items: list[tuple[tuple[int, ...], tuple[int, bytes], list[int]]]) -> None:
        """One scorer call: each (prefix, state, draft) with the distribution after the prefix and
        after every prefix along the draft (only the ids the text allows there are kept)."""
        text, n, pad = self.text, len(self.prompt), (self.canonical[-1] if self.canonical else 0)
        seqs, alts, plans = [], [], []
        for ids, state, draft in items:
            states, st = [state], state
            for t in draft:
                st = text.step(st, t)
                if st is None:
                    break
                states.append(st)
            draft = draft[: len(states) - 1]
            seqs.append(self.prompt + list(ids) + draft + [pad])
            alts.append({n + len(ids) + j: text.candidates(x) for j, x in enumerate(states)})
            plans.append((ids, draft, states))
        batched = getattr(self.scorer, "batches_alternatives", False)
        if batched:
            results = self.scorer(seqs, self.sampling.temperature, alts, **self.kwargs)
        else:  # one sequence a call (a scorer without per-sequence alternatives)
            results = [self.scorer([s], self.sampling.temperature, a, **self.kwargs)[0] for s, a in zip(seqs, alts)]
        self.passes += 1
        for (ids, draft, states), scored in zip(plans, results):
            prefix = ids
            for j, st in enumerate(states):
                allowed = text.moves(st)
                self.dists[prefix] = {t: lp for t, lp in scored.top[n + len(prefix)] if t in allowed}
                if j < len(draft):
                    prefix = prefix + (draft[j],)
            if draft:
                self.drafted[prefix] = len(draft)

    def _draft(self, ids: tuple[int, ...], state: tuple[int, bytes], lead: bool, withheld: bool = False) -> list[int]:
        """The canonical encode's ids from ``state`` on (the fewest tokens back to a canonical
        boundary, then the canonical ids), as far as the scores are likely to be read: to the next
        anchor for a new line; twice its last draft for a line that outlived one; to the end for
        the line that leads at its anchor. A line kept only by a margin gets none unless
        ``withheld`` (a crawl's round, with room: :meth:`_filled`)."""
        text, seg = self.text, self.seg
        c, pend = state
        if not text.data.startswith(pend, c):
            return []
        p = c + len(pend)
        b = next((b for b in range(p, len(text.data) + 1) if b in self.draft_at), None)
        if b is None:
            return []
        try:
            refill = seg.fewest(text.data[p:b]) if b > p else []
        except ReconError:
            return []
        out = refill + list(self.canonical[self.draft_at[b]:])
        if lead:
            return out
        if not withheld and self.margin.get(ids, 0.0) < -self.rules.draft_margin:
            return []
        anchor, q, h = text.next_anchor(p), p, 0
        while h < len(out) and q < anchor:
            q += len(seg.token_bytes[out[h]])
            h += 1
        h = max(h, 1)
        if ids[:-1] in self.drafted:
            h = max(h, 2 * self.drafted[ids[:-1]])
        return out[:h]

    # -- the rules --------------------------------------------------------------------------------
    def _feasible(self, k: int, state) -> bool:
        """Whether a prefix of ``k`` ids in ``state`` can still end with exactly ``length`` ids."""
        if self.length is None:
            return True
        c, pend = state
        p = c + len(pend) if self.text.data.startswith(pend, c) else c
        left = self.length - k
        return left >= 0 and self.fewest[p] <= left <= len(self.text.data) - p

    def _need(self, k: int, anchor: int) -> int | None:
        """How many ids a prefix of ``k`` ids at ``anchor`` still needs beyond the canonical ids of
        the rest (None: no count, or before it is certain: every prefix is a rival)."""
        if self.rest is None or anchor < self.text.certain_from:
            return None
        return self.length - k - self.rest[anchor]

    def _reach(self, k: int, state, anchor: int) -> int | None:
        """The smallest ``|need|`` a prefix of ``k`` ids in ``state`` can have at ``anchor``."""
        if self.rest is None or anchor < self.text.certain_from:
            return None
        c, pend = state
        p = c + len(pend) if self.text.data.startswith(pend, c) else c
        most = self.length - k - self.rest[anchor] - (self.fewest[p] - self.fewest[anchor])
        least = self.length - k - self.rest[anchor] - (anchor - p)
        return 0 if least <= 0 <= most else min(abs(least), abs(most))

    def _settled(self, ids: tuple[int, ...], better: tuple[int, ...]) -> bool:
        """Whether ``ids`` is the same as the ``better`` prefix at its anchor for the last ``settle``
        tokens, and as many ids long where the sample's count is known: the text after them must
        absorb a difference in count, so such two are not the same line (held-out t=1.4 min-p 0.05
        p017-1: the sampled ids one id short of a line 1.1 nats ahead that shared their last 12)."""
        same = common_suffix(ids, better) >= self.rules.settle
        return same and (self.length is None or len(ids) == len(better))

    @staticmethod
    def _bar(best: dict, need: int | None) -> float:
        """The best score among the prefixes at the anchor that are rivals of one with ``need``."""
        if need is None:
            return max(best.values(), default=-math.inf)
        return max((s for g, s in best.items() if g is None or abs(g) <= abs(need)), default=-math.inf)

    # -- the sweep --------------------------------------------------------------------------------
    def _sweep(self, final: bool = False) -> _Sweep:
        """The beam over the segments, on the distributions known now. A prefix the rules keep
        whose distribution is not known waits, and goes on as a *ghost*: along the canonical ids'
        own scores from where it rejoins them (a guess, none of it scored). Ghosts take places in
        the beam and set bars as prefixes do, so that the prefixes this sweep sends to be scored
        are close to what the sweep after it keeps; they are never an answer, and a sweep with
        nothing waiting has none: its beam is exactly what the rules give on scored prefixes."""
        text, canonical, rules = self.text, self.canonical, self.rules
        beam: list[tuple[float, tuple[int, ...] | None, tuple | None]] = [(0.0, (), None)]
        rivals: list[tuple[tuple[int, ...], float]] = []
        waiting: dict[tuple[int, ...], tuple[int, bytes]] = {}
        leads: set[tuple[int, ...]] = set()
        tie = itertools.count()
        for i, (a, b) in enumerate(zip(self.anchors, self.anchors[1:])):
            end = (b, b"")
            ahead = self.lowered[i]
            probe = rules.probe if i + 2 < len(self.anchors) else 0.0  # (nothing to probe past the end)
            heap = []
            for s, ids, ghost in beam:
                if ghost is None:
                    heap.append((-s, next(tie), ids, (a, b""), None))
                else:
                    self._haunt(heap, tie, ghost, b)
            heapq.heapify(heap)
            best: dict[int | None, float] = {}  # per need: the best score that reached b
            guess: dict[int | None, float] = {}  # per need: the best guess of a beam line along the canonical ids to b
            for s, ids, ghost in beam:
                if ghost is None and ids in self.dists:
                    k = len(ids) + self.draft_at[b] - self.draft_at[a]
                    need = self._need(k, b)
                    guess[need] = max(guess.get(need, -math.inf), s + self.cum[self.draft_at[b]] - self.cum[self.draft_at[a]])
            expanded = extra = 0
            cap = self.caps[i]
            at: dict[int, int] = {}  # byte offset inside the segment -> prefixes that went on from there
            kept: dict[int | None, list[tuple[float, tuple[int, ...] | None, tuple | None]]] = {}
            while heap:
                neg, _, ids, state, ghost = heapq.heappop(heap)
                s = -neg
                canon = ghost is None and ids == canonical[: len(ids)]
                if state == end:
                    k = len(ids) if ghost is None else ghost[1] + self.draft_at[b]
                    need = self._need(k, b)
                    same = kept.setdefault(need, [])
                    bar = self._bar(best, need)
                    behind = s < bar + ahead - rules.delta and not (
                        ghost is None and ids in self.dists and s >= bar - probe - rules.delta)
                    if not canon and (behind or len(same) >= rules.top or (
                            ghost is None and same and same[0][2] is None and self._settled(ids, same[0][1]))):
                        if ghost is None:
                            rivals.append((ids, s - max(bar, s)))
                            self.dropped.append((s, ids, b))
                        continue
                    same.append((s, ids, ghost))
                    best.setdefault(need, s)
                    if ghost is None and len(best) == 1 and len(same) == 1 and ids not in self.dists:
                        leads.add(ids)  # the best at this anchor: the likeliest to go on to the end
                    continue
                if state[0] > b or (state[0] == b and state[1]):
                    raise ReconError(f"a token crossed the anchor at byte {b} (a bug)")
                reach = self._reach(len(ids), state, b)
                bar = self._bar(best, reach)
                margin = s - bar
                if not canon and state != (a, b""):  # inside the segment: can it still reach the beam at b?
                    margin = s - bar if self.blind[i] else s + self._rest_of(state, b) - max(bar, self._bar(guess, reach))
                    p = state[0] + len(state[1])
                    if margin >= -rules.split_delta and expanded < cap and at.get(p, 0) < rules.per_byte:
                        expanded += 1
                        at[p] = at.get(p, 0) + 1
                    elif extra < rules.lead_cap and s >= bar + ahead - rules.delta:
                        extra += 1  # the guess would drop it, the bound keeps it: one of the few that go on
                    else:
                        rivals.append((ids, s - max(bar, s)))
                        continue
                elif not canon and s < bar - rules.delta:
                    rivals.append((ids, s - bar))
                    self.dropped.append((s, ids, a))
                    continue
                dist = self.dists.get(ids)
                if dist is None and final:
                    rivals.append((ids, s - max(bar, s)))
                    continue
                if dist is None:
                    waiting[ids] = state
                    self.margin[ids] = margin
                    ghost = self._ghost(ids, state, s)
                    if ghost is not None:
                        self._haunt(heap, tie, ghost, b)
                    continue
                for t, nxt in text.moves(state).items():
                    lp = dist.get(t, -math.inf)
                    if lp > -math.inf and self._feasible(len(ids) + 1, nxt):
                        heapq.heappush(heap, (-(s + lp), next(tie), ids + (t,), nxt, None))
                flushed = text.finished(state)  # held bytes flushed as U+FFFD where the text ends
                if flushed == (len(text.data), b"") and flushed == end and self._feasible(len(ids), flushed):
                    heapq.heappush(heap, (neg, next(tie), ids, flushed, None))
            beam = sorted((h for same in kept.values() for h in same), key=lambda h: -h[0])
            if not beam:
                return _Sweep([], rivals, waiting, leads)
        done = [(s, ids) for s, ids, ghost in beam if ghost is None and (self.length is None or len(ids) == self.length)]
        return _Sweep(done, rivals, waiting, leads)

    def _rest_of(self, state, b: int) -> float:
        """A guess of what the rest of the segment costs a prefix inside it (``state``) to the anchor
        ``b``: the canonical ids' own scores from their next boundary on (0 for the tokens back to
        it). Such a prefix goes on only if it can still reach the beam at ``b`` on that guess."""
        q = self._next_boundary[min(state[0] + len(state[1]), len(self._next_boundary) - 1)]
        return self.cum[self.draft_at[b]] - self.cum[self.draft_at[q]] if q <= b else 0.0

    def _ghost(self, ids: tuple[int, ...], state, score: float) -> tuple[float, int] | None:
        """A waiting prefix's guessed line: back to the canonical ids by the fewest tokens (scored
        0: a guess that flatters it), then along their own scores. (score offset, count offset):
        at a canonical boundary with ``k`` canonical ids before it, its score is the offset plus
        the canonical ids' score there, its count the offset plus ``k``."""
        c, pend = state
        data = self.text.data
        if not data.startswith(pend, c):
            return None
        p = c + len(pend)
        q = next((q for q in range(p, len(data) + 1) if q in self.draft_at), None)
        try:
            refill = self.seg.fewest(data[p:q]) if q is not None and q > p else []
        except ReconError:
            return None
        k = self.draft_at[q]
        return score - self.cum[k], len(ids) + len(refill) - k

    def _haunt(self, heap, tie, ghost: tuple[float, int], b: int) -> None:
        """A ghost as it reaches the anchor ``b``, where its count allows."""
        k = self.draft_at[b]
        if self._feasible(ghost[1] + k, (b, b"")):
            heapq.heappush(heap, (-(ghost[0] + self.cum[k]), next(tie), None, (b, b""), ghost))

    def _sweeps(self) -> _Sweep:
        """Sweeps and rounds until nothing waits (or ``max_passes``)."""
        while True:
            self.dropped = []
            found = self._sweep()
            if found.waiting and self.passes < self.rules.max_passes:
                self._score(self._filled([(ids, st, self._draft(ids, st, ids in found.leads)) for ids, st in sorted(found.waiting.items())]))
                continue
            if found.waiting:  # out of rounds: what still waits is dropped
                found = self._sweep(final=True)
            return found

    def _filled(self, items: list) -> list:
        """A round's (prefix, state, draft) items; in a round of no more lines than the beam keeps
        at an anchor (``top``), with the drafts ``draft_margin`` withheld, the likeliest first,
        while it has fewer than ``fill`` positions to run. A scorer call costs a fixed part (a
        server's round trip, a forward pass's set-up) whatever it holds, and a line that crawls
        alone one token a round costs a call a token (held-out llama.cpp t=0.8 p015-0: 39 calls, 8
        with its rounds filled). A wide round is left as it is: at t=1.3, filling every round
        with room ran more positions for about as many calls."""
        if len(items) > self.rules.top:
            return items
        room = self.rules.fill - sum(1 + len(d) for _, _, d in items)
        for j in sorted(range(len(items)), key=lambda j: -self.margin.get(items[j][0], 0.0)):
            if room <= 0:
                break
            ids, st, draft = items[j]
            if not draft:
                draft = self._draft(ids, st, False, withheld=True)
                items[j] = (ids, st, draft)
                room -= len(draft)
        return items

    def run(self) -> SearchResult:
        start, rules = (0, b""), self.rules
        self._score([((), start, list(self.canonical))])
        n = len(self.text.data)
        self._next_boundary = [n] * (n + 1)  # byte offset -> the first canonical boundary at or after it
        for q in range(n, -1, -1):
            self._next_boundary[q] = q if q in self.draft_at else self._next_boundary[min(q + 1, n)]
        lps = [self.dists[self.canonical[:k]].get(t, -math.inf) for k, t in enumerate(self.canonical)]
        # the canonical ids' score after each of them, for the guesses (a segment's rest, a ghost's
        # line): a token the sampler removed counts 0 there, or past it every guess is -inf (NaN
        # against another), no prefix inside a segment passes, and the sweep ends at a dead end
        self.cum = list(itertools.accumulate((lp if lp > -math.inf else 0.0 for lp in lps), initial=0.0))
        # per segment, what the bar at its end is lowered by: the beam's bar there is what the best
        # reaches one anchor later, guessed from the canonical ids' own scores over the next
        # segment (none where those are impossible: a token the sampler removed)
        true = list(itertools.accumulate(lps, initial=0.0))
        ends = [true[self.draft_at[q]] for q in self.anchors]
        self.lowered = [max(c - b, -rules.ahead) if c > -math.inf else 0.0 for b, c in zip(ends[1:], ends[2:])] + [0.0]
        # per segment, how many prefixes inside it may go on: more where the text lost bytes
        lost = self.text.lost
        cap = rules.split_cap * rules.top
        self.caps = [cap * (rules.lost_cap if any(a - self.seg.wild_radius <= w < b for w in lost) else 1)
                     for a, b in zip(self.anchors, self.anchors[1:])]
        # per segment, whether the sampler removed one of the canonical ids in it: the guess (their
        # own scores, that one counted 0) says nothing of a cut there, which goes on by the bound
        self.blind = [any(lp == -math.inf for lp in lps[self.draft_at[a]:self.draft_at[b]])
                      for a, b in zip(self.anchors, self.anchors[1:])]
        found = self._sweeps()
        if not found.done and rules.widen > 1 and self.sampling.truncates:
            # A dead end under truncation: the guess dropped the way on that the sampler kept. Once
            # more over what is known, the guess's rules widened (split_delta times widen, the caps
            # times widen squared), before the beam.
            grow = round(rules.widen ** 2)
            self.rules = rules = replace(rules, split_delta=rules.widen * rules.split_delta, lead_cap=grow * rules.lead_cap,
                                         per_byte=grow * rules.per_byte)
            self.caps = [grow * c for c in self.caps]  # (split_cap is read only through these)
            found = self._sweeps()
        if not found.done:
            # Out of rounds with no answer (the canonical ids need not be one: with a count they can
            # be impossible): the breadth-first beam takes over. It raises where no cut can be an
            # answer, and it reads what was scored here again from the scorer's prefix tree.
            wide = beam_search(self.prompt, self.canonical, self.seg, self.scorer, self.sampling, length=self.length)
            return SearchResult(wide.ids, wide.score, wide.confidence, wide.rivals, self.passes + wide.passes)
        score, ids = found.done[0]
        rivals = [(i, s - score) for s, i in found.done[1:]] + found.rivals
        lps = [self.dists[ids[:k]][t] for k, t in enumerate(ids)]
        for _ in range(rules.repairs):
            better, calls = repair(self.prompt, ids, lps, self.dropped, self.dists, self.text, self.scorer, self.sampling, self.length,
                                   rules.delta, rules.repair_width, self.kwargs)
            self.passes += calls
            if better is None:
                break
            rivals = [(ids, score - better[0])] + [(i, r + score - better[0]) for i, r in rivals]
            score, ids, lps = better
        if not self.text.spells(ids):  # a guard: never hand a trainer ids that spell another text
            raise ReconError("the search's answer does not spell the text (a bug)")
        mass = sum(math.exp(r) for _, r in rivals if r > -50)
        return SearchResult(list(ids), score, 1.0 / (1.0 + mass), rivals, self.passes)


def score_ids(prompt: Sequence[int], ids: Sequence[int], scorer, sampling: Sampling) -> float:
    """log P(ids | prompt) under ``sampling``: what the search maximizes, for judging its answer
    against the sampled ids (a search error: the sampled ids score higher than the answer)."""
    kwargs = {"sampling": sampling} if getattr(scorer, "truncates", False) else {}
    scored = scorer([list(prompt) + list(ids)], sampling.temperature, None, **kwargs)[0]
    return float(sum(scored.logprobs[len(prompt):]))
