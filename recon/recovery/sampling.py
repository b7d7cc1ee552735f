"""The distribution a sampler drew from: temperature, then top-k, top-p and min-p truncation.

Recovery maximizes the sampled sequence's log-probability under *this* distribution, not the
model's raw one: a token outside the sampler's top-p or min-p set had probability 0, so a
segmentation that needs it is impossible, and the kept tokens are renormalized. The record's
``meta`` says how it was sampled (``recon generate`` writes ``temperature`` and ``top_p``; ``top_k``
and ``min_p`` where set). The order is transformers' (``recon generate``): temperature first, then
top-k, top-p, min-p, each on the result of the last; ``meta["sampler_order"] = "llama.cpp"`` takes
llama.cpp's default chain instead (top-k, top-p, min-p on the raw logits, temperature last).

**Another engine's numerics.** Truncation is a hard cut, and two engines never compute the same
logits: llama.cpp on the GGUF's Q4_1 weights (8-bit activations) and torch in float32 on the same
weights differ by about 0.1 nats a logit. A token the sampling engine kept just above the cut can
fall just below it in the scorer's numbers: then the sampled ids are impossible to the scorer, and
the search returns something else or finds no candidate at all (held-out samples drawn by
llama.cpp at min-p 0.05, t=1.4: 64 of 160 raised, exact samples among them). ``slack`` (nats)
keeps every token that the cut would keep on logits moved by at most ``slack / 2`` each in its
favour (what an engine whose logits differ from the scorer's by that much could have kept: at
min-p and top-k, a log-probability ratio to the cut ``slack`` nats higher); such a token scores
as the kept ones do (its logit against the same normalizer), and the kept ones score exactly as
without slack. :meth:`from_meta` gives no slack to the samples whose
meta says recon's own torch sampler drew them (``recon generate``: the local scorer's numerics,
the cut is exact there), and :data:`ENGINE_SLACK` to every other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the slack (nats) for samples another engine drew (see the module docstring): the largest
#: shortfall seen on the held-out llama.cpp samples (`benchmarks/llamacpp_heldout.py --shortfall`: 0.75-1.0 nats)
ENGINE_SLACK = 1.0


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    order: str = "hf"  # or "llama.cpp"
    #: nats by which a token may miss the cut and still count as kept (another engine's numerics)
    slack: float = 0.0

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    @classmethod
    def from_meta(cls, meta, temperature: float | None = None, slack: float | None = None) -> "Sampling":
        """The sampler a record's ``meta`` describes; ``temperature`` overrides the meta's, and
        ``slack`` the default one (none where ``recon generate``'s torch sampler drew the sample:
        ``meta.torch`` and no ``meta.engine``; else :data:`ENGINE_SLACK`)."""
        meta = meta if isinstance(meta, dict) else {}
        if slack is None:
            slack = 0.0 if "torch" in meta and "engine" not in meta else ENGINE_SLACK

        def num(key, default, kind=float):
            value = meta.get(key)
            return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        t = temperature if temperature is not None else num("temperature", 1.0)
        order = meta.get("sampler_order") if meta.get("sampler_order") in ("hf", "llama.cpp") else "hf"
        top_p = num("top_p", 1.0)
        out = cls(t if t > 0 else 1.0, top_p if 0 < top_p <= 1 else 1.0, max(num("top_k", 0, int), 0),
                  min(max(num("min_p", 0.0), 0.0), 1.0), order, max(float(slack), 0.0))
        # no cut, no slack (one scorer tree for every sampler of the same temperature)
        return out if out.truncates else cls(out.temperature, order=order)

    def log_probs(self, logits):
        """Log-probabilities (``-inf`` where truncated) from raw logits (a torch tensor, last axis the vocabulary)."""
        import torch

        x = logits.float()
        if self.order == "hf":
            x = x / self.temperature
        kept = self._truncate(x)
        if self.slack > 0 and self.truncates:
            near = self._truncate(x, self.slack)  # what the cut keeps with slack (the kept among it)
            scaled = x if self.order == "hf" else x / self.temperature
            lp = scaled - torch.logsumexp(scaled.masked_fill(kept == -math.inf, -math.inf), dim=-1, keepdim=True)
            return lp.masked_fill((near == -math.inf) & (kept == -math.inf), -math.inf)
        if self.order != "hf":
            kept = kept / self.temperature
        return torch.log_softmax(kept, dim=-1)

    def _truncate(self, x, slack: float = 0.0):
        """transformers' TopK, TopP and MinP warpers (min_tokens_to_keep 1), in that order; with
        ``slack``, each keeps every token it would keep on logits moved by at most ``slack / 2``
        each in that token's favour (an engine whose logits differ that much could have kept it)."""
        import torch

        neg = -float("inf")
        if self.top_k > 0:
            kth = torch.topk(x, min(self.top_k, x.shape[-1]), dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth - slack, neg)
        if self.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=False, dim=-1)
            cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
            if slack:
                # the mass at or below a token (what top-p keeps it by) were it slack/2 up and every
                # other token slack/2 down: those below it gain e^slack against the rest, and those
                # less than slack above it fall to its level
                reach = torch.searchsorted(sorted_x.contiguous(), sorted_x + slack, right=True) - 1
                within = cum.gather(-1, reach) - cum
                below = cum * math.exp(slack)
                remove = (below + within) / (below + 1 - cum) <= (1 - self.top_p)
            else:
                remove = cum <= (1 - self.top_p)
            remove[..., -1:] = False
            x = x.masked_fill(remove.scatter(-1, order, remove), neg)
        if self.min_p > 0.0:
            if slack:
                x = x.masked_fill(x < x.amax(dim=-1, keepdim=True) + math.log(self.min_p) - slack, neg)
            else:
                probs = torch.softmax(x, dim=-1)
                top = probs.amax(dim=-1, keepdim=True)
                x = x.masked_fill(probs < self.min_p * top, neg)
        return x
