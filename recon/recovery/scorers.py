"""Who scores candidate ids for :mod:`recon.recovery.recover`: teacher-forced logprobs of whole
sequences (prompt + output).

* :class:`LocalScorer` — the local model in-process (the ``generate`` extra), at any temperature,
  for any token at any position; the key/value cache of a shared prefix is reused;
* :class:`~recon.recovery.remote.ServerScorer` and :class:`~recon.recovery.remote.SGLangScorer`
  — a server's prompt logprobs (vLLM's ``prompt_logprobs``, SGLang's ``/generate``), at
  temperature 1 (:mod:`recon.recovery.remote`).

Every scorer counts what it costs over its life in plain int attributes; :func:`counters` reads
them, so a caller charges a record what its search spent (after less before).
"""

from __future__ import annotations

import threading
from typing import Protocol, Sequence

from recon.errors import ReconError
from recon.recovery.model import SequenceLogprobs
from recon.recovery.remote import (  # noqa: F401
    ServerScorer,
    SGLangScorer,
    parse_prompt_logprobs,
    parse_sglang_logprobs,
)
from recon.tokenizers.tokenizer import Tokenizer


class Scorer(Protocol):
    """Teacher-forced logprobs for whole sequences (prompt + output)."""

    #: how many most-likely tokens it reports per position (the only alternatives it can see)
    top_k: int
    #: whether it can score at a temperature other than 1
    tempered: bool

    def __call__(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0,
                 alternatives: dict[int, list[int]] | None = None) -> list[SequenceLogprobs]:
        """Logprobs of each sequence's tokens and the ``top_k`` at each position; for a single
        sequence, also of the ``alternatives`` ids at their positions, where the scorer can."""


class LocalScorer:
    """The local model (:class:`recon.recovery.model.LocalModel`) scoring in-process.

    Recovery scores many sequences that share long prefixes. Every position run is kept in a
    :class:`~recon.recovery.prefix_tree.PrefixTree` (keys, values and the distribution after it),
    so a call runs only the positions no earlier call ran, all of them in one forward pass. There
    is a tree per sampling distribution (the last :data:`MAX_TREES` used); all are dropped before
    a call once together they hold more than ``max_nodes`` positions (about 48 KB each for
    SmolLM2-135M: keys and values in 30 layers, and the last hidden state). One call runs at a
    time (searches run together call from several threads).

    ``sampling`` (a :class:`~recon.recovery.sampling.Sampling`, an optional keyword beyond the
    :class:`Scorer` protocol, announced by ``truncates = True``) scores under the sampler's own
    distribution: temperature and top-k/top-p/min-p truncation, ``-inf`` for a token it removed."""

    tempered = True
    truncates = True
    #: ``alternatives`` may be a list, one dict per sequence (beyond the protocol's single dict)
    batches_alternatives = True
    #: sequences per call from the search: all of them (new positions run together, in chunks)
    batch = 1 << 30

    def __init__(self, model, top_k: int = 64, max_nodes: int = 20_000):
        self.model, self.top_k, self.max_nodes = model, top_k, max_nodes
        #: one tree per sampling distribution, the most recently used last (records searched
        #: together may be sampled differently: each keeps its own tree)
        self._trees: dict = {}
        #: one call at a time (searches run together call from several threads, and a caller may
        #: score while their results come in)
        self._lock = threading.Lock()
        #: positions run through the model, and forward passes, over the scorer's life (for benchmarks)
        self.positions_run = self.passes_run = 0
        #: calls, and positions asked for in them, over its life (the remote scorers' names: a call
        #: is its round trip; what it computes is ``positions_computed``, the positions run)
        self.round_trips = self.tokens_sent = 0

    def __call__(self, sequences, temperature=1.0, alternatives=None, sampling=None):
        from recon.recovery.sampling import Sampling

        sampling = sampling or Sampling(temperature)
        seqs = [list(map(int, s)) for s in sequences]
        if not isinstance(alternatives, list):
            alternatives = [alternatives or {}] if len(seqs) == 1 else [{} for _ in seqs]
        with self._lock:
            self.round_trips += 1
            self.tokens_sent += sum(map(len, seqs))
            tree = self._tree_for(sampling)
            positions, passes = tree.tokens_run, tree.passes_run
            out = tree.score(seqs, alternatives)
            self.positions_run += tree.tokens_run - positions
            self.passes_run += tree.passes_run - passes
            return out

    def _tree_for(self, sampling):
        from recon.recovery.prefix_tree import PrefixTree

        if sum(map(len, self._trees.values())) > self.max_nodes:
            self._trees.clear()  # (memory: every tree starts again)
        tree = self._trees.pop(sampling, None)
        if tree is None:
            tree = PrefixTree(self.model, sampling, self.top_k)
            while len(self._trees) >= MAX_TREES:
                del self._trees[next(iter(self._trees))]  # the least recently used
        self._trees[sampling] = tree
        return tree

    @property
    def positions_computed(self) -> int:
        """Positions run through the model over its life: the tree runs each prefix once, so a
        position asked for again costs nothing (the remote scorers' name for it)."""
        return self.positions_run

    @property
    def tokens_run(self) -> int:
        """Positions run through the model by the current trees (for benchmarks)."""
        return sum(tree.tokens_run for tree in self._trees.values())


#: sampling distributions a :class:`LocalScorer` keeps a prefix tree for at once
MAX_TREES = 4

#: the cost counters a scorer may have, each an int over its life: calls or requests
#: (``round_trips``), ids in them (``tokens_sent``), new positions computed given what is cached
#: (``positions_computed``), what a server would compute if it read its cache
#: (``positions_uncached``), the local model's positions and forward passes (``positions_run``,
#: ``passes_run``)
COUNTERS = ("round_trips", "tokens_sent", "positions_computed", "positions_uncached", "positions_run", "passes_run")


def counters(scorer) -> dict[str, int]:
    """The cost counters ``scorer`` has (of :data:`COUNTERS`), by name. Read before and after a
    record, their difference (:func:`spent`) is what its search cost; with searches run together
    (``--together``) the calls of the records searched at once share one scorer, so a record's
    difference then holds the others' calls too."""
    values = {name: getattr(scorer, name, None) for name in COUNTERS}
    return {name: value for name, value in values.items() if isinstance(value, int) and not isinstance(value, bool)}


def spent(before: dict[str, int], scorer) -> dict[str, int]:
    """What ``scorer`` spent since ``before`` (a :func:`counters` reading), counter by counter."""
    return {name: value - before.get(name, 0) for name, value in counters(scorer).items()}


def make_scorer(spec: str, tok: Tokenizer, *, model: str = "smollm2", threads: int | None = None, top_k: int | None = None,
                api: str = "vllm", concurrency: int = 4, api_key: str | None = None) -> Scorer:
    """``local``: the GGUF model in-process (needs torch, the ``generate`` extra); a URL: a server,
    ``api`` ``vllm`` (OpenAI-style ``/v1/completions`` with ``prompt_logprobs``) or ``sglang``
    (native ``/generate``), ``concurrency`` requests in flight. The model must share ``tok``'s
    vocabulary."""
    if spec.startswith(("http://", "https://")):
        name = None if model == "smollm2" else model
        if api == "sglang":
            return SGLangScorer(spec, top_k=top_k or 20, concurrency=concurrency, api_key=api_key)
        if api != "vllm":
            raise ReconError(f"--scorer-api {api!r}: expected vllm or sglang")
        return ServerScorer(spec, model=name, top_k=top_k or 20, concurrency=concurrency, api_key=api_key)
    if spec != "local":
        raise ReconError(f"--scorer {spec!r}: expected 'local' or an http(s) URL of an OpenAI-compatible server")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ReconError("recovery with the local model needs torch, the 'generate' extra: "
                         "pip install -e '.[generate]' (or score with --scorer URL)") from None
    from recon.recovery.model import LocalModel

    local = LocalModel(model, threads=threads)
    if local.tokenizer.token_bytes != tok.token_bytes:
        raise ReconError(f"--model {model}: its vocabulary is not the tokenizer's ({tok.name}); recovery needs the model that sampled")
    return LocalScorer(local, top_k=top_k or 64)
