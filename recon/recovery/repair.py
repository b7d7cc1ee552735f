"""The search's second look: what the beam dropped, tried again along its answer.

The beam (:mod:`recon.recovery.search`) drops a prefix by two shortcuts that assume its history
stops mattering. At high temperature the model now and then disagrees, by fractions of a nat
spread over the whole rest of the sample; here the dropped prefixes come back as whole candidates
built from the answer, and the few an estimate and a short scored window rank first are scored whole.
"""

from __future__ import annotations

import math

from recon.errors import ReconError
from recon.recovery.sampling import Sampling
from recon.recovery.states import Text


def repair(prompt, ids, lps, dropped, dists, text: Text, scorer, sampling: Sampling, length, margin: float, width: int,
           kwargs, window: int = 8, reach: int = 4):
    """A second look at what the beam dropped: each dropped prefix finished along the answer's own
    tail (the fewest tokens to a boundary of the answer's, then its ids; with a count, the first
    of the next ``reach`` boundaries that keeps it); and its last cut that differs from the
    answer's moved into the answer (the answer's ids before, the prefix's from there on, the tail).

    The beam's two shortcuts both assume that a prefix's history stops mattering: ``settle`` once
    it agrees with a better one for a while, ``delta`` past the next anchor. At t=1.3 the model
    disagrees now and then, over the whole tail (held-out p009-2: 0.09 nats on 50 tokens; p014-2:
    a cut 0.34 nats behind 8 ids past where it rejoins ends 0.35 ahead). Each part scored as it
    does where it comes from gives an estimate. The ``width`` finished prefixes estimated likeliest
    (within ``margin`` of the answer) are scored whole. The moved cuts estimated ahead of the
    answer (up to ``16 * width``) are scored to ``window`` ids past where they rejoin it (a few new
    positions each; a sampled cut can spend another count of ids than the answer's, and p014-2's
    joins two cuts), and the ``width`` likeliest there, at most a nat behind, are scored whole.
    Returns (score, ids, logprobs) of the best one that beats the answer (``ids``, with ``lps``
    its logprobs), or None; and the scorer calls made."""
    seg = text.seg
    offsets, cum = [0], [0.0]
    for t, lp in zip(ids, lps):
        offsets.append(offsets[-1] + len(seg.token_bytes[t]))
        cum.append(cum[-1] + lp)
    at = {o: k for k, o in enumerate(offsets)}  # the answer's boundaries
    fills: dict = {}

    def fill(c: int, k: int):  # the fewest ids from byte c to the answer's boundary k (None: none)
        if (c, k) not in fills:
            try:
                fills[c, k] = seg.fewest(text.data[c : offsets[k]]) if offsets[k] > c else []
            except ReconError:  # a fixed token in between: no ordinary refill
                fills[c, k] = None
        return fills[c, k]

    tried, plain, moved = {tuple(ids)}, [], []  # (estimate, the answer's ids before, the prefix's, refill, k)
    for s, prefix, c in dropped:
        k = next((at[o] for o in range(c, len(text.data) + 1) if o in at), None)
        if k is None:
            continue
        tail, found = cum[-1] - cum[k], [False, False]  # (a refill scored as the answer's ids there)
        # with a count, the refill may run on to a later boundary of the answer's to keep it
        for k2 in range(k, min(k + reach, len(ids)) + 1) if length is not None else (k,):
            refill = fill(c, k2)
            if refill is None:
                continue
            spare = None if length is None else len(prefix) + len(refill) - k2  # ids more than the answer's
            if not found[0] and not spare and s + tail >= cum[-1] - margin:  # else too far below even so
                plain.append((s + tail, (), prefix, refill, k2))
                found[0] = True
            cut = None if found[1] else last_cut(prefix, c, ids, at, dists, seg, spare)
            if cut is not None and cum[cut[1]] + cut[2] + tail >= cum[-1] - margin:
                moved.append((cum[cut[1]] + cut[2] + tail, ids[: cut[1]], prefix[cut[0] :], refill, k2))
                found[1] = True
    whole, windows = [], []
    for pool, cap in ((plain, width), ([m for m in moved if m[0] > cum[-1]], 16 * width)):
        n = 0
        for _, head, prefix, refill, k in sorted(pool, key=lambda g: -g[0]):
            if n >= cap:
                break
            cand = tuple(head) + tuple(prefix) + tuple(refill) + tuple(ids[k:])
            if cand in tried or (length is not None and len(cand) != length):
                continue
            if not text.spells(cand):
                # Near bytes lost to U+FFFD the answer's own bytes may differ from the text's (any
                # bytes the decoder turns into U+FFFD stand there), so its offsets no longer match
                # the text's, and a refill cut at them can spell something else (held-out p008-2
                # at t=1.3: 'A' became 'i'). Such a candidate is no candidate.
                continue
            tried.add(cand)
            n += 1
            if head:
                ka = min(k + window, len(ids))
                windows.append((cand, len(cand) - len(ids) + ka, ka))
            else:
                whole.append(cand)
    batch = getattr(scorer, "batch", None) or 1

    def scored(seqs):
        return [r.logprobs[len(prompt):] for g in range(0, len(seqs), batch)
                for r in scorer([list(prompt) + list(j) for j in seqs[g : g + batch]], sampling.temperature, None, **kwargs)]

    calls = 0
    if windows:
        near = scored([cand[:e] for cand, e, _ in windows])
        calls += -(-len(windows) // batch)
        whole += [cand for est, cand in sorted(((sum(lp) + cum[-1] - cum[ka], cand) for (cand, _, ka), lp in zip(windows, near)),
                                               key=lambda h: -h[0]) if est > cum[-1] - 1.0][:width]
    if not whole:
        return None, calls
    best = max(((float(sum(lp)), cand, lp) for cand, lp in zip(whole, scored(whole))), key=lambda h: h[0])
    return (best if best[0] > cum[-1] + 1e-6 else None), calls + -(-len(whole) // batch)



def last_cut(prefix, c: int, ids, at: dict[int, int], dists, seg, spare: int | None = None, reach: int = 32):
    """Where ``prefix`` (ending at byte ``c``) last cut the text otherwise than the answer ``ids``:
    (its index, the answer's index at the same byte, the score of the prefix's ids from there), the
    last byte both cut at where their next ids differ, within ``reach`` ids of its end; or None.
    With ``spare`` (how many ids more than the answer the prefix spends to the same boundary), the
    last such byte from which on the prefix spends as many ids as the answer: the moved cut keeps
    the count (held-out p014-2 sampled ``gl``+``y``+``Ġtim`` where the answer has ``gly``+``Ġt``+``im``:
    the last cut alone, ``Ġtim``, spends one id fewer)."""
    off, score = c, 0.0
    for i in range(len(prefix) - 1, max(len(prefix) - 1 - reach, -1), -1):
        off -= len(seg.token_bytes[prefix[i]])
        score += dists.get(prefix[:i], {}).get(prefix[i], -math.inf)
        a = at.get(off)
        if a is not None and (a >= len(ids) or ids[a] != prefix[i]) and (spare is None or i - a == spare):
            return i, a, score
    return None

