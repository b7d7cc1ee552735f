"""What ``recon serve``'s scoring routes computed: requests, prompt tokens received, and
positions run through the model, per route, over the server's life (``GET /counts``).

It exists so that a test can hold a scorer's own counts (:mod:`recon.recovery.remote`: round
trips, tokens sent) to what the server received, and so a user can see what a run cost the
server. The counts are the model side's to make: :func:`recon.server.responses.run_completion`
and :func:`recon.server.prompt_logprobs.run_generate` add what they ran once it has run, so a
request refused before the model (400, 429, ...) counts nothing.

Per route: ``requests`` answered, ``prompt_tokens`` received, ``positions_scored`` (run in
teacher-forced scoring passes), ``positions_sampled`` (run by sampling) and ``positions_computed``
(the two together). ``recon serve`` has no prefix cache: a scoring pass runs every position of
what it scores, so for the scorers' requests ``positions_scored`` equals ``prompt_tokens``.
Sampling is a pass of its own, as transformers' ``generate`` runs it with its key/value cache: the
prompt once, then one position per sampled token but the last (:func:`sampled_positions`). So the
vLLM scorer's request (``max_tokens: 1`` beside ``prompt_logprobs``) costs ``recon serve`` the
prompt twice, where vLLM samples that token from the same prefill that scored the prompt; SGLang's
(``max_new_tokens: 0``) costs it once. ``/generate`` with ``return_logprob`` and sampling scores
the prompt and the sampled tokens together after sampling. Padding is not counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

#: the routes counted, by their name in ``GET /counts``
ROUTES = ("completions", "generate")


@dataclass
class RouteCounts:
    requests: int = 0
    prompt_tokens: int = 0
    positions_scored: int = 0
    positions_sampled: int = 0
    positions_computed: int = 0


@dataclass
class Counts:
    """The counts of every scoring route, safe to add to from the worker threads."""

    routes: dict[str, RouteCounts] = field(default_factory=lambda: {name: RouteCounts() for name in ROUTES})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, route: str, *, prompt_tokens: int, scored: int, sampled: int) -> None:
        """One answered request of ``route``: the prompt ids it received (over all its prompts)
        and the positions the model ran for it, scoring and sampling."""
        with self._lock:
            counts = self.routes[route]
            counts.requests += 1
            counts.prompt_tokens += prompt_tokens
            counts.positions_scored += scored
            counts.positions_sampled += sampled
            counts.positions_computed += scored + sampled

    def snapshot(self) -> dict:
        """``{route: {requests, prompt_tokens, positions_scored, positions_sampled,
        positions_computed}}`` and ``prefix_cache: false`` (what a client needs to read positions
        against tokens)."""
        with self._lock:
            out: dict = {name: dict(vars(c)) for name, c in self.routes.items()}
        out["prefix_cache"] = False
        return out


def sampled_positions(prompt_len: int, sampled: int) -> int:
    """Positions ``generate`` runs to sample ``sampled`` tokens after a prompt of ``prompt_len``:
    the prompt in one pass, then each sampled token but the last fed back (nothing to sample)."""
    return prompt_len + max(sampled - 1, 0) if sampled else 0
