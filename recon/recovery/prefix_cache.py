"""What a serving engine's prefix cache saves a request, modelled as the engine does it.

It exists so that a search scoring through a server can be charged what the server computes, not
what it sends: two requests that share a prefix cost the engine the shared part once, when its
prefix cache holds that prefix and the request may read it. The two engines recon scores with
match differently, and both refuse to read for a request that wants the prompt's own logprobs:

* **SGLang's radix cache** (:class:`RadixCache`) matches at token granularity: a request reuses
  the longest prefix of its ids that an earlier request left in the tree (``page_size`` 1, the
  default; every finished request's ids are inserted). The match is capped at the input's length
  less one (the last position is always run, for its logits) and, for a request with
  ``return_logprob``, at its ``logprob_start_len`` (``Req.adjust_max_prefix_ids``, called
  ``_compute_max_prefix_len`` in later releases, in
  ``python/sglang/srt/managers/schedule_batch.py`` of sgl-project/sglang: the positions it
  returns logprobs for must be computed). :class:`~recon.recovery.remote.SGLangScorer` asks from
  position 0, so SGLang reads nothing of its cache for it.
* **vLLM's automatic prefix caching** (:class:`BlockCache`) matches whole blocks only (16 tokens
  by default, ``CacheConfig.DEFAULT_BLOCK_SIZE``): a block is found by a hash of its tokens and
  of every token before it, only full blocks are cached, and a hit is at most the request's
  length less one, rounded down to a block (``KVCacheManager.get_computed_blocks`` in
  ``vllm/v1/core/kv_cache_manager.py``). In vLLM 0.32 a request with ``prompt_logprobs`` (or
  ``prompt_logprob_token_ids``) skips the lookup: ``SamplingParams`` sets
  ``skip_reading_prefix_cache`` for it ("the output of prompt logprobs may less than
  n_prompt_tokens, we need to skip reading cache at this request", ``vllm/sampling_params.py``),
  the OpenAI server gives a client no way to unset it, and ``get_computed_blocks`` then returns no
  blocks: every prompt position is computed again (so vLLM's docs say since PR #23399; the design
  is RFC #13414, issue #13409). Its full blocks are still written, for requests that do read.

So as :mod:`recon.recovery.remote` calls them today, both engines compute every position sent.
What the cache would save if a request could read it (:meth:`~_Cache.cached`) is reported beside
that: what a search that sends shared prefixes together can hope for from SGLang with a later
``logprob_start_len``, or from an engine that caches prompt logprobs.

The model is the engine's best case: requests taken in the order given (requests in flight
together are charged as if one finished before the next began) and memory for ``capacity``
positions, evicted least recently used first in two generations (a prefix reused or sent within
the last ``capacity / 2`` new positions is always kept; an older one may be gone, as it may be
from an engine's least-recently-used eviction), at about 170 bytes a held position here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

#: vLLM's default KV block size (``CacheConfig.DEFAULT_BLOCK_SIZE`` in vLLM 0.32)
VLLM_BLOCK_SIZE = 16
#: positions a model holds at most (two generations of half as many: see the module docstring)
CAPACITY = 400_000


class _Trie:
    """Units (a token, or a block of tokens) as a trie of ``(parent node, unit) -> node``: the
    longest held prefix of a sequence of units is a walk from the root, and every node is a
    prefix some earlier sequence held, whatever else it held after it."""

    def __init__(self):
        self._children: dict[tuple[int, Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._children)

    def match(self, units: Sequence[Hashable]) -> int:
        """How many leading ``units`` an earlier insert holds."""
        node = 0
        for k, unit in enumerate(units):
            child = self._children.get((node, unit))
            if child is None:
                return k
            node = child
        return len(units)

    def insert(self, units: Sequence[Hashable]) -> None:
        node = 0
        for unit in units:
            key = (node, unit)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = len(self._children) + 1
            node = child


class _Cache:
    """A prefix cache over a trie of units; subclasses say what a unit is."""

    #: positions a unit covers
    unit = 1

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        #: what was sent lately, and the generation before it (dropped when ``young`` fills)
        self._young, self._old = _Trie(), _Trie()

    def units(self, ids: Sequence[int]) -> list:
        return list(ids)

    def cached(self, ids: Sequence[int]) -> int:
        """Positions of ``ids`` the engine would take from its cache if the request may read it:
        the longest prefix an earlier request left there, in whole units, ending before the last
        position (which is always run, for its logits)."""
        units = self.units(ids)[:max(len(ids) - 1, 0) // self.unit]
        return max(self._young.match(units), self._old.match(units)) * self.unit

    def send(self, ids: Sequence[int], *, read_limit: int | None = None) -> int:
        """Positions the engine computes for ``ids`` (then held in the cache): all but
        :meth:`cached`, which the request may read up to ``read_limit`` positions only (None: no
        cap; 0: it reads nothing), rounded down to a whole unit."""
        ids = list(ids)
        hit = self.cached(ids)
        if read_limit is not None:
            hit = min(hit, max(read_limit, 0) // self.unit * self.unit)
        self._remember(self.units(ids))
        return len(ids) - hit

    def _remember(self, units: list) -> None:
        """Hold ``units`` in the young generation (a prefix only the old one held is renewed);
        when it holds half the capacity it becomes the old one, and the old one is dropped."""
        self._young.insert(units)
        if len(self._young) * self.unit >= self.capacity // 2:
            self._young, self._old = _Trie(), self._young


class RadixCache(_Cache):
    """SGLang's radix cache at token granularity (see the module docstring). A request with
    ``return_logprob`` reads at most ``logprob_start_len`` positions (``read_limit``)."""


class BlockCache(_Cache):
    """vLLM's automatic prefix caching: whole blocks of ``block_size`` tokens, each known by its
    tokens and everything before it (see the module docstring). A request with
    ``prompt_logprobs`` reads nothing (``read_limit=0``)."""

    def __init__(self, block_size: int = VLLM_BLOCK_SIZE, capacity: int = CAPACITY):
        if block_size < 1:
            raise ValueError("block_size must be 1 or more")
        super().__init__(capacity)
        self.unit = self.block_size = block_size

    def units(self, ids: Sequence[int]) -> list[tuple[int, ...]]:
        """The full blocks of ``ids`` (a last partial block is never cached)."""
        size = self.block_size
        return [tuple(ids[i:i + size]) for i in range(0, len(ids) - size + 1, size)]
