"""The search for the sampled segmentation: a beam over the states of the text, scored exactly.

A candidate is any sequence of ids whose text, decoded as a server decodes it (special tokens
apart, invalid UTF-8 as U+FFFD), is the text the API returned. Its score is its log-probability
under the sampling distribution (:class:`~recon.recovery.sampling.Sampling`: temperature, and
top-k/top-p/min-p where the record says; a token the sampler removed had probability 0), the sum
of one exact conditional per token, each read from a teacher-forced pass over that very prefix.

**States** (:mod:`recon.recovery.states`): a prefix of ids has consumed the text up to a character
boundary with some bytes held by the UTF-8 decoder; prefixes in one state differ only in how they cut it.

**The beam.** States are taken in text order; every prefix in a state is extended by every token
its bytes allow (read by id, however unlikely: a sampled token can rank in the thousands). A
prefix is dropped when it is more than ``delta`` nats below the best score a path still searched
is known to reach at the next *anchor* ahead: a byte offset no token can straddle, so that every
candidate passes through it (the start of most words). A prefix's score can only fall as it grows,
so it can then win only if its different history makes the text *past* that anchor more than
``delta`` nats likelier — the one place the search is not exact (and ``top`` prefixes per state).
Prefixes in the same state are not compared by score there: ``Ċ``+``Ċ`` outscores ``ĊĊ`` at the
end of a paragraph, and loses by 15 nats on the ``1`` after it. A bound only counts while the path
it came from is searched (else two prefixes could each be dropped against the other, and nothing
would be left), and the canonical ids are never dropped (scored in the first pass; the answer
scores at least as high).
Prefixes are scored speculatively: a pass runs a prefix plus the draft's continuation (the
canonical ids, or the fewest tokens back to them, to the first anchor past the rejoin), which
gives the distribution after every prefix along it; the prefixes waiting ahead that their state
would keep go into the same pass (with the local scorer's prefix tree a pass costs the positions
never run before, and one forward pass).

**The count.** With ``length`` (how many ids were sampled, where the record says) a prefix that
cannot end with exactly that many ids is impossible: dropped, and no rival. And prefixes are
rivals only as far as they still need cuts off the canonical ids to end with that count (one that
needs more pays for them later), see :func:`search`'s ``bound``. Before the last U+FFFD for lost
bytes (:attr:`~recon.recovery.states.Text.certain_from`) no count is certain, and prefixes of any
count are rivals.

**Dead ends.** With a truncating sampler a prefix can be one (every way on needs a token the
sampler removed), and a bound resting on it can drop every live path: when every path searched
dies, no bound stands, and what the rules dropped is searched again from where it was dropped.

**A second look** (:func:`~recon.recovery.repair.repair`): after the beam, what ``settle`` and ``delta`` dropped is
finished along the answer's own tail, or its last cut is moved into the answer, and the likeliest
few are scored whole; one that beats the answer replaces it (those two rules assume a prefix's
history stops mattering, and at high temperature it sometimes still does).

**Confidence** is the returned sequence's share of probability among every candidate: the
complete ones found, and each dropped prefix counted as if it went on as well as the best does.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

from recon.errors import ReconError
from recon.recovery.repair import repair
from recon.recovery.sampling import Sampling
from recon.recovery.states import Segmenter, Text, common_suffix

#: scores kept per state for the bound (the best live one counts)
REF = 4


@dataclass
class SearchResult:
    ids: list[int]
    score: float
    confidence: float
    #: other candidates and dropped prefixes: (ids, score relative to the returned sequence's)
    rivals: list[tuple[tuple[int, ...], float]] = field(default_factory=list)
    passes: int = 0


def search(prompt: Sequence[int], canonical: Sequence[int], seg: Segmenter, scorer, sampling: Sampling, *,
           delta: float = 2.0, top: int = 4, horizon: int = 8, settle: int = 12, max_passes: int = 600,
           rejoin: int = 1, length: int | None = None, repairs: int = 3, repair_width: int = 8) -> SearchResult:
    """The most likely ids under ``sampling`` whose text is ``canonical``'s, after ``prompt``;
    with ``length``, of exactly that many ids (what the API's ``usage.completion_tokens`` says,
    or ``max_tokens`` for a sample cut at it): a prefix that cannot end with that many is impossible.
    ``repairs``: rounds of :func:`~recon.recovery.repair.repair` after the beam (two scorer calls each at most, scoring
    at most ``repair_width`` sequences whole)."""
    text = Text(seg, canonical)
    fewest = text.fewest_to_end() if length is not None else None

    def feasible(k: int, state) -> bool:
        """Whether a prefix of ``k`` ids in ``state`` can still end with exactly ``length`` ids:
        the rest needs at least ``fewest`` of them and at most one per byte."""
        if length is None:
            return True
        c, pend = state
        p = c + len(pend) if text.data.startswith(pend, c) else c
        left = length - k
        return left >= 0 and fewest[p] <= left <= len(text.data) - p
    n, pad = len(prompt), canonical[-1] if canonical else 0
    end_state = (len(text.data), b"")
    dists: dict[tuple[int, ...], dict[int, float]] = {}
    #: state -> the best scores scored paths reach there, with the path (best first, at most REF)
    ref: dict[tuple[int, bytes], list[tuple[float, tuple[int, ...]]]] = {}
    dead: dict = {}  # a trie of the dropped prefixes: a path through one of them is no longer searched
    draft_at = {}  # byte offset of a canonical boundary -> index in canonical
    pos = 0
    for k, i in enumerate(canonical):
        draft_at[pos] = k
        pos += len(seg.token_bytes[i])
    draft_at[pos] = len(canonical)
    rest = text.canonical_rest(draft_at) if fewest is not None else None
    certain = text.certain_from  # before it (U+FFFD for lost bytes ahead) prefixes of any count are rivals
    passes = 0
    kwargs = {"sampling": sampling} if getattr(scorer, "truncates", False) else {}

    def run(items) -> None:
        """One pass (batched where the scorer can) over each (ids, state, score, continuation)."""
        nonlocal passes
        jobs = []
        for ids, state, score, cont in items:
            states, st = [state], state
            for t in cont:
                st = text.step(st, t)
                if st is None:
                    cont = cont[: len(states) - 1]
                    break
                states.append(st)
            wanted = {n + len(ids) + j: text.candidates(x) for j, x in enumerate(states)}
            jobs.append((ids, score, cont, states, wanted, list(prompt) + list(ids) + cont + [pad]))
        batch = 8 if getattr(scorer, "batches_alternatives", False) else 1
        batch = getattr(scorer, "batch", None) or batch  # the local scorer takes every job in one call
        for g in range(0, len(jobs), batch):
            if passes and passes >= max_passes:
                break  # out of passes: the rest stay unscored (and are dropped)
            group = jobs[g : g + batch]
            alts = [j[4] for j in group] if batch > 1 else group[0][4]
            results = scorer([j[5] for j in group], sampling.temperature, alts, **kwargs)
            passes += 1
            for (ids, score, cont, states, wanted, _), scored in zip(group, results):
                prefix = ids
                for j, st in enumerate(states):
                    allowed = set(wanted[n + len(ids) + j])
                    lps = {t: lp for t, lp in scored.top[n + len(prefix)] if t in allowed}
                    dists[prefix] = lps
                    if j < len(cont):
                        score += lps.get(cont[j], -math.inf)
                        prefix = prefix + (cont[j],)
                        if score > -math.inf and feasible(len(prefix), states[j + 1]):
                            for key in ref_keys(states[j + 1], len(prefix)):
                                known = ref.setdefault(key, [])
                                if len(known) < REF or score > known[-1][0]:
                                    known.append((score, prefix))
                                    known.sort(key=lambda e: -e[0])
                                    del known[REF:]

    def drop(ids, rel) -> None:
        """``ids`` is searched no further (a rival for the confidence unless ``rel`` is None:
        impossible), nor is any path through it."""
        if rel is not None:
            rivals.append((ids, rel))
        if ids not in dists:
            return  # never scored: no scored path (a bound) runs through it, and it is in no beam now
        node = dead
        for t in ids:
            node = node.setdefault(t, {})
        node[None] = True

    def alive(path) -> bool:
        node = dead
        for t in path:
            node = node.get(t)
            if node is None or None in node:
                return node is None
        return True

    def ref_keys(state, k: int) -> list:
        """Where a scored prefix is a bound: its state (for any count), and with a count, its state
        with how far its count is from ending as the canonical ids do (two prefixes are rivals only
        if the other is no farther)."""
        if rest is None or state[1] or state[0] < certain:
            return [state]
        return [state, (state, length - k - rest[state[0]])]

    def bound(state, k: int = 0) -> float:
        """The best score a path still searched is known to reach at the next anchor past ``state``.

        With a count, only paths that reach it needing no more cuts away from the canonical ids
        than this prefix of ``k`` ids does count (``need``: the sampled count, less its ids, less the
        canonical ids of the rest): one that still needs more must pay for them later (a cut off the
        canonical costs nats), so its lead now bounds nothing."""
        c, pend = state
        p = c + len(pend) if text.data.startswith(pend, c) else c
        anchor = text.next_anchor(p)
        at = (anchor, b"")
        if rest is None or p < certain:
            return next((sc for sc, path in ref.get(at, ()) if alive(path)), -math.inf)
        need = abs(length - k - rest[p])  # the same at the anchor if it goes on as the canonical ids do
        return max((next((sc for sc, path in ref.get((at, e), ()) if alive(path)), -math.inf) for e in range(-need, need + 1)),
                   default=-math.inf)

    def continuation(state) -> list[int]:
        c, pend = state
        p = c + len(pend)
        if not text.data.startswith(pend, c):
            return []
        k = next((draft_at[b] for b in range(p, len(text.data) + 1) if b in draft_at), None)
        if k is None:
            return []
        b = next(b for b in range(p, len(text.data) + 1) if b in draft_at)
        try:
            refill = seg.fewest(text.data[p:b]) if b > p else []
        except ReconError:
            return []
        out = refill + list(canonical[k:])
        if (c, pend) in draft_states:
            return out[:horizon]
        # off the draft: as far as two anchors past where it rejoins
        anchors, q, j = 0, b, 0
        for j, t in enumerate(out[len(refill):], len(refill)):
            q += len(seg.token_bytes[t])
            anchors += (q, b"") in anchor_states
            if anchors >= rejoin:
                break
        return out[: j + 1]

    def ahead() -> list:
        """The unscored prefixes waiting in later states that their state would keep as things
        stand (within ``delta`` of the bound, among its ``top``): scored in the same pass as the
        state at hand, since most are, and a pass costs the same for one more prefix."""
        out = []
        for st, hyps in beams.items():
            if st == end_state:
                continue
            for sc, ids in sorted(hyps, key=lambda h: -h[0])[:top]:
                if sc >= bound(st, len(ids)) - delta and ids not in dists and alive(ids):
                    out.append((ids, st, sc, continuation(st)))
        return out

    start, draft = (0, b""), tuple(canonical)
    anchor_states = {(a, b"") for a in text.anchors}
    draft_states = {(p, b"") for p in draft_at}
    run([((), start, 0.0, list(canonical))])
    beams: dict[tuple[int, bytes], list[tuple[float, tuple[int, ...]]]] = {start: [(0.0, ())]}
    order = [(0, 0, b"")]
    rivals: list[tuple[tuple[int, ...], float]] = []  # dropped: (ids, score - the score that beat it)
    dropped: list[tuple[float, tuple[int, ...], int]] = []  # by a rule, not as impossible: (score, ids, byte offset)
    revive: list = []  # (state, score, ids) dropped by a rule: searched again if every path dies

    def sweep() -> list[tuple[float, tuple[int, ...]]]:
        """The beam over the states in text order, from what ``beams`` holds: the finished paths."""
        while order:
            c, _, pend = heapq.heappop(order)
            state = (c, pend)
            hyps = beams.pop(state, [])
            if not hyps:
                continue
            if state == end_state:
                return [h for h in hyps if length is None or len(h[1]) == length]
            bars = {k: bound(state, k) for k in {len(ids) for _, ids in hyps}} if length is not None else {}
            bar = bound(state) if length is None else max(bars.values())
            best = max(max(s for s, _ in hyps), bar)
            hyps.sort(key=lambda h: -h[0])
            kept = []
            peers: dict[int | None, list] = {}  # with a count, prefixes of other lengths are not rivals here
            for s, ids in hyps:
                same = peers.setdefault(None if length is None or c < certain else len(ids), [])
                if not feasible(len(ids), state):
                    drop(ids, None)  # impossible: searched no further, and no rival
                elif ids == draft[: len(ids)]:
                    kept.append((s, ids))  # the canonical ids: scored already, and always a candidate
                    same.append(ids)
                elif s < bars.get(len(ids), bar) - delta or len(same) >= top or (same and common_suffix(ids, same[0]) >= settle):
                    drop(ids, s - best)  # too far below, or the same as a better one for ``settle`` tokens now
                    revive.append((state, s, ids))
                    if not pend:
                        dropped.append((s, ids, c))
                else:
                    kept.append((s, ids))
                    same.append(ids)
            todo = [(ids, state, s, continuation(state)) for s, ids in kept if ids not in dists]
            if todo and passes < max_passes:
                run(todo + ahead())  # one pass for this state and every prefix ahead likely to be kept
            children = []
            for s, ids in kept:
                if ids not in dists:  # out of passes (the canonical ids are scored: the beam goes on)
                    drop(ids, s - best)
                    continue
                flushed = text.finished(state)
                moves = text.moves(state)
                targets = [(t, moves.get(t)) for t in dists[ids]]
                if flushed == end_state:
                    targets.append((None, flushed))
                for t, nxt in targets:
                    if nxt is None:
                        continue
                    child = (s + dists[ids][t], ids + (t,)) if t is not None else (s, ids)
                    if child[0] == -math.inf:
                        continue
                    if not feasible(len(child[1]), nxt):
                        continue  # impossible, and so is every path through it: not in the beam, no rival
                    children.append((nxt, child))
            for nxt, child in children:
                if nxt not in beams:
                    beams[nxt] = []
                    heapq.heappush(order, (nxt[0], len(nxt[1]), nxt[1]))
                beams[nxt].append(child)
        return []

    done = sweep()
    for _ in range(2):
        if done or not revive or passes >= max_passes:
            break
        # Every path searched died: with a truncating sampler a prefix can be a dead end (each way
        # on needs a token the sampler removed; held-out p015-0 at top-p 0.9, where the canonical
        # ids do). Bounds that rested on dead paths dropped the live ones: no bound stands now,
        # and what the rules dropped is searched again from where it was dropped.
        dead.clear()
        ref.clear()
        for state, s, ids in revive:
            if state not in beams:
                beams[state] = []
                heapq.heappush(order, (state[0], len(state[1]), state[1]))
            beams[state].append((s, ids))
        revive.clear()
        done = sweep()
    if not done:
        if length is not None and not feasible(0, start):
            raise ReconError(f"the text cannot be spelled in exactly {length} ids (the count the record gives)")
        raise ReconError("no candidate spells the text" + (f" in {length} ids within {max_passes} scorer calls" if length is not None
                         else " (a bug, or every cut was truncated away)"))
    done.sort(key=lambda h: -h[0])
    score, ids = done[0]
    rivals = [(i, s - score) for s, i in done[1:]] + rivals
    lps = [dists[ids[:k]][t] for k, t in enumerate(ids)]  # every prefix of a finished path was scored
    for _ in range(repairs):
        if passes >= max_passes:
            break
        better, calls = repair(prompt, ids, lps, dropped, dists, text, scorer, sampling, length, delta, repair_width, kwargs)
        passes += calls
        if better is None:
            break
        rivals = [(ids, score - better[0])] + [(i, r + score - better[0]) for i, r in rivals]
        score, ids, lps = better
    if not text.spells(ids):  # a guard: never hand a trainer ids that spell another text
        raise ReconError("the search's answer does not spell the text (a bug)")
    mass = sum(math.exp(r) for _, r in rivals if r > -50)
    return SearchResult(list(ids), score, 1.0 / (1.0 + mass), rivals, passes)


def score_ids(prompt: Sequence[int], ids: Sequence[int], scorer, sampling: Sampling) -> float:
    """log P(ids | prompt) under ``sampling``: what the search maximizes, for judging its answer
    against the sampled ids (a search error: the sampled ids score higher than the answer)."""
    kwargs = {"sampling": sampling} if getattr(scorer, "truncates", False) else {}
    scored = scorer([list(prompt) + list(ids)], sampling.temperature, None, **kwargs)[0]
    return float(sum(scored.logprobs[len(prompt):]))
