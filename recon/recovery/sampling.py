"""The distribution a sampler drew from: temperature, then top-k, top-p and min-p truncation.

Recovery maximizes the sampled sequence's log-probability under *this* distribution, not the
model's raw one: a token outside the sampler's top-p or min-p set had probability 0, so a
segmentation that needs it is impossible, and the kept tokens are renormalized. The record's
``meta`` says how it was sampled (``recon generate`` writes ``temperature`` and ``top_p``; ``top_k``
and ``min_p`` where set). The order is transformers' (``recon generate``): temperature first, then
top-k, top-p, min-p, each on the result of the last; ``meta["sampler_order"] = "llama.cpp"`` takes
llama.cpp's default chain instead (top-k, top-p, min-p on the raw logits, temperature last).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    order: str = "hf"  # or "llama.cpp"

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    @classmethod
    def from_meta(cls, meta, temperature: float | None = None) -> "Sampling":
        """The sampler a record's ``meta`` describes; ``temperature`` overrides the meta's."""
        meta = meta if isinstance(meta, dict) else {}

        def num(key, default, kind=float):
            value = meta.get(key)
            return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        t = temperature if temperature is not None else num("temperature", 1.0)
        order = meta.get("sampler_order") if meta.get("sampler_order") in ("hf", "llama.cpp") else "hf"
        top_p = num("top_p", 1.0)
        return cls(t if t > 0 else 1.0, top_p if 0 < top_p <= 1 else 1.0, max(num("top_k", 0, int), 0),
                   min(max(num("min_p", 0.0), 0.0), 1.0), order)

    def log_probs(self, logits):
        """Log-probabilities (``-inf`` where truncated) from raw logits (a torch tensor, last axis the vocabulary)."""
        import torch

        x = logits.float()
        if self.order == "hf":
            x = x / self.temperature
            x = self._truncate(x)
        else:
            x = self._truncate(x) / self.temperature
        return torch.log_softmax(x, dim=-1)

    def _truncate(self, x):
        """transformers' TopK, TopP and MinP warpers (min_tokens_to_keep 1), in that order."""
        import torch

        neg = -float("inf")
        if self.top_k > 0:
            kth = torch.topk(x, min(self.top_k, x.shape[-1]), dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, neg)
        if self.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=False, dim=-1)
            cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
            remove = cum <= (1 - self.top_p)
            remove[..., -1:] = False
            x = x.masked_fill(remove.scatter(-1, order, remove), neg)
        if self.min_p > 0.0:
            probs = torch.softmax(x, dim=-1)
            top = probs.amax(dim=-1, keepdim=True)
            x = x.masked_fill(probs < self.min_p * top, neg)
        return x
