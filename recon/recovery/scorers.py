"""Who scores candidate ids for :mod:`recon.recovery.recover`: teacher-forced logprobs of whole
sequences (prompt + output).

* :class:`LocalScorer` — the local model in-process (the ``generate`` extra), at any temperature,
  for any token at any position; the key/value cache of a shared prefix is reused;
* :class:`~recon.recovery.remote.ServerScorer` and :class:`~recon.recovery.remote.SGLangScorer`
  — a server's prompt logprobs (vLLM's ``prompt_logprobs``, SGLang's ``/generate``), at
  temperature 1 (:mod:`recon.recovery.remote`).
"""

from __future__ import annotations

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

    Recovery scores many sequences that share a long prefix with one scored alone before (a
    draft cut at position k, the windows after k). The model's key/value caches of the last
    ``keep_caches`` sequences scored alone are kept, and a call starts from the one sharing the
    longest prefix, so only the tokens after it are run again.

    ``sampling`` (a :class:`~recon.recovery.sampling.Sampling`, an optional keyword beyond the
    :class:`Scorer` protocol, announced by ``truncates = True``) scores under the sampler's own
    distribution: temperature and top-k/top-p/min-p truncation, ``-inf`` for a token it removed."""

    tempered = True
    truncates = True
    #: ``alternatives`` may be a list, one dict per sequence (beyond the protocol's single dict)
    batches_alternatives = True

    def __init__(self, model, top_k: int = 64, min_shared: int = 8, keep_caches: int = 6):
        self.model, self.top_k, self.min_shared, self.keep_caches = model, top_k, min_shared, keep_caches
        self._caches: list[tuple[list[int], object, SequenceLogprobs, object]] = []  # most recent last

    def __call__(self, sequences, temperature=1.0, alternatives=None, sampling=None):
        from recon.recovery.sampling import Sampling

        sampling = sampling or Sampling(temperature)
        seqs = [list(map(int, s)) for s in sequences]
        shared, base = 0, None
        asked = [p for alt in (alternatives if isinstance(alternatives, list) else [alternatives or {}]) for p in alt]
        for entry in self._caches if seqs else ():
            if entry[1] != sampling:
                continue
            common = min(min(_common_prefix(entry[0], s) for s in seqs), min(map(len, seqs)) - 1,
                         min(asked or [len(seqs[0])]))  # positions asked about are run again
            if common >= shared:
                shared, base = common, entry
        if shared < self.min_shared:
            if len(seqs) != 1 and not sampling.truncates and not asked:
                return self.model.token_logprobs(seqs, top_k=self.top_k, temperature=sampling.temperature)
            shared, base = 0, None
        if not isinstance(alternatives, list):
            alternatives = [alternatives or {}] if len(seqs) == 1 else [{} for _ in seqs]
        return self._extend(seqs, shared, base, sampling, alternatives)

    def _extend(self, seqs: list[list[int]], shared: int, base, sampling,
                alternatives: list[dict[int, list[int]]]) -> list[SequenceLogprobs]:
        """Score ``seqs`` (all starting with ``base``'s first ``shared`` tokens) from its cache."""
        import copy

        torch = self.model.torch
        model = self.model.model
        keep = max(shared - 1, 0)  # cached positions reused; position ``keep`` is run again for its logits
        width = max(len(s) for s in seqs) - keep
        rows = [s[keep:] + [self.model.pad_id] * (width - len(s) + keep) for s in seqs]
        mask = torch.tensor([[1] * keep + [1] * (len(s) - keep) + [0] * (width - len(s) + keep) for s in seqs])
        cache = None
        if keep:
            cache = copy.deepcopy(base[3])
            if cache.get_seq_length() > keep:
                cache.crop(keep - cache.get_seq_length())  # negative: tokens to drop (every transformers 5.x)
            if len(seqs) > 1:
                cache.batch_repeat_interleave(len(seqs))
        else:
            from transformers import DynamicCache

            cache = DynamicCache()
        with torch.inference_mode():
            out = model(input_ids=torch.tensor(rows), attention_mask=mask, use_cache=True, **{self._cache_arg: cache})
            logp = sampling.log_probs(out.logits[:, :-1])
            target = torch.tensor(rows)[:, 1:].unsqueeze(-1)
            picked = logp.gather(-1, target)
            ranks = ((logp > picked).sum(-1) + 1).tolist()
            chosen = picked.squeeze(-1).tolist()
            values, indices = logp.topk(self.top_k, dim=-1)
            values = values.tolist()
            indices = indices.tolist()
            extras = []
            for r, alt in enumerate(alternatives):  # sampled tokens are often far outside the top-k: ask for them by id
                extra = {}
                for pos, ids in alt.items():
                    j = pos - keep - 1
                    if 0 <= j < len(seqs[r]) - keep - 1 and ids:
                        extra[j] = list(zip(ids, logp[r, j, ids].tolist()))
                extras.append(extra)
        results = []
        for r, s in enumerate(seqs):
            m = len(s) - keep - 1  # new positions keep+1 .. len(s)-1
            if keep:
                old = base[2]
                lps, rks, tops = old.logprobs[: keep + 1], old.ranks[: keep + 1], old.top[: keep + 1]
            else:
                lps, rks, tops = [None], [None], [[]]
            new_top = [list(zip(a, b)) for a, b in zip(indices[r][:m], values[r][:m])]
            for j, pairs in extras[r].items():
                new_top[j] = new_top[j] + pairs
            results.append(SequenceLogprobs(lps + chosen[r][:m], rks + ranks[r][:m], tops + new_top))
        if len(seqs) == 1:
            self._caches = [e for e in self._caches if e[0] != seqs[0]][-(self.keep_caches - 1):] + [
                (seqs[0], sampling, results[0], cache)]
        return results

    @property
    def _cache_arg(self) -> str:
        """transformers renamed ``past_key_values`` to ``cache`` during 5.x."""
        import inspect

        return "cache" if "cache" in inspect.signature(self.model.model.forward).parameters else "past_key_values"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


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
