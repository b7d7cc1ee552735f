"""Scorers on a server: teacher-forced logprobs from the engines that sampled the data.

* :class:`ServerScorer` — vLLM's shape: ``POST /v1/completions`` with the ids as ``prompt``,
  ``echo``, ``max_tokens: 1`` and ``prompt_logprobs: k``. It reports the top-k per position only,
  so a sampled token outside them is not seen.
* :class:`SGLangScorer` — SGLang's native ``POST /generate`` with ``input_ids``,
  ``return_logprob``, ``logprob_start_len: 0``, ``top_logprobs_num: k`` and ``max_new_tokens:
  0``; and ``token_ids_logprob``, which asks for exactly the candidate ids, so the server sees
  the alternatives the local model sees.

Both keep ``concurrency`` requests in flight (a thread each; sequences come back in order), retry
a connection failure, a 429 or a 5xx with exponential backoff, and refuse any other answer in one
line naming the URL. Servers score prompts at temperature 1 (vLLM from the raw logits, SGLang with
``temp_scaled_logprobs`` off, whatever the request's temperature), so ``tempered`` is False and a
call at another temperature is refused in one line rather than answered at 1.

Both count what they cost over their life, as plain ints a caller reads before and after a record
(:func:`recon.recovery.scorers.counters`): ``round_trips`` (requests sent, one per sequence; a
retry of a failed attempt is not counted again), ``tokens_sent`` (ids in those prompts),
``positions_computed`` (new positions the engine computes, given its prefix cache as it treats
these requests: :mod:`recon.recovery.prefix_cache`; both engines skip reading it for a request
that wants prompt logprobs from position 0, so today this equals ``tokens_sent``) and
``positions_uncached`` (what it would compute if the request could read its cache: the positions
no earlier request left there). Sequences are charged in the order given, before they go out.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from recon.errors import ReconError
from recon.recovery.model import SequenceLogprobs
from recon.recovery.prefix_cache import VLLM_BLOCK_SIZE, BlockCache, RadixCache

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def post_json(url: str, body: dict, *, timeout: float, api_key: str | None = None, retries: int = 3,
              backoff: float = 0.5) -> Any:
    """``body`` POSTed as JSON, the answer parsed; a refused connection, a timeout, 429 or 5xx is
    tried again after ``backoff``, 2 x ``backoff``, ... seconds, ``retries`` times."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code not in RETRY_STATUSES or attempt == retries:
                detail = e.read(300).decode("utf-8", "replace").strip()
                raise ReconError(f"{url}: HTTP {e.code}" + (f": {' '.join(detail.split())}" if detail else "")) from None
        except (OSError, ValueError) as e:  # refused, reset, timed out; or not JSON
            if isinstance(e, ValueError) or attempt == retries:
                raise ReconError(f"{url}: {e}") from None
        time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


class _Remote:
    tempered = False
    #: positions of its cache a scoring request lets the engine read (0: none; see prefix_cache)
    cache_read_limit: int | None = 0

    def __init__(self, url: str, top_k: int, timeout: float, api_key: str | None, concurrency: int, retries: int,
                 cache):
        if concurrency < 1:
            raise ReconError("--concurrency must be 1 or more")
        self.url, self.top_k, self.timeout, self.api_key = url, top_k, timeout, api_key
        self.concurrency, self.retries = concurrency, retries
        #: the engine's prefix cache as modelled (:mod:`recon.recovery.prefix_cache`)
        self.cache = cache
        #: over the scorer's life (see the module docstring)
        self.round_trips = self.tokens_sent = self.positions_computed = self.positions_uncached = 0
        self._counting = threading.Lock()  # searches run together call from several threads

    def _charge(self, sequences: Sequence[Sequence[int]]) -> None:
        """Count the requests about to go out, in the order given: what is sent, what the engine
        computes given its cache and these requests' limit on reading it, and what it would
        compute if they could read it."""
        with self._counting:
            for ids in sequences:
                cached = self.cache.cached(ids)
                self.positions_computed += self.cache.send(ids, read_limit=self.cache_read_limit)
                self.positions_uncached += len(ids) - cached
                self.round_trips += 1
                self.tokens_sent += len(ids)

    def _all(self, work, sequences: Sequence[Sequence[int]]) -> list[SequenceLogprobs]:
        self._charge(sequences)
        if len(sequences) <= 1 or self.concurrency == 1:
            return [work(k, ids) for k, ids in enumerate(sequences)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(sequences))) as pool:
            return list(pool.map(work, range(len(sequences)), sequences))

    def _post(self, body: dict) -> Any:
        return post_json(self.url, body, timeout=self.timeout, api_key=self.api_key, retries=self.retries)

    def _untempered(self, temperature: float) -> None:
        """vLLM scores prompts from the raw logits and SGLang with ``temp_scaled_logprobs`` off: a
        server's prompt logprobs are at temperature 1 whatever the request says, so scores at any
        other temperature cannot be had from it (the top-k alone does not renormalize)."""
        if temperature != 1.0:
            raise ReconError(f"{self.url}: a server's prompt logprobs are at temperature 1, not {temperature:g}; "
                             "score at another temperature with --scorer local")


class ServerScorer(_Remote):
    """vLLM's ``prompt_logprobs`` (see the module docstring). ``block_size`` is the engine's KV
    block size (``--block-size``, 16 by default), the granularity its prefix cache matches at; a
    ``prompt_logprobs`` request reads none of it in vLLM 0.32 (``cache_read_limit`` 0)."""

    def __init__(self, url: str, model: str | None = None, top_k: int = 20, timeout: float = 120.0,
                 api_key: str | None = None, concurrency: int = 4, retries: int = 3, block_size: int = VLLM_BLOCK_SIZE):
        url = url.rstrip("/")
        if not url.endswith("/completions"):
            url += "/completions" if url.endswith("/v1") else "/v1/completions"
        super().__init__(url, top_k, timeout, api_key, concurrency, retries, BlockCache(block_size))
        self.model = model

    def request_body(self, ids: Sequence[int]) -> dict:
        body = {"prompt": list(ids), "max_tokens": 1, "echo": True, "prompt_logprobs": self.top_k, "temperature": 0}
        if self.model:
            body["model"] = self.model
        return body

    def __call__(self, sequences, temperature=1.0, alternatives=None):
        # the top-k only: alternatives outside it are not seen
        self._untempered(temperature)
        return self._all(lambda _, ids: parse_prompt_logprobs(self._post(self.request_body(ids)), ids, source=self.url),
                         sequences)


def parse_prompt_logprobs(payload: dict, ids: Sequence[int], *, source: str = "response") -> SequenceLogprobs:
    """A vLLM ``/v1/completions`` response's ``choices[0].prompt_logprobs`` as :class:`SequenceLogprobs`."""
    try:
        entries = payload["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ReconError(f"{source}: no choices[0].prompt_logprobs in the response (does the server support prompt_logprobs?)") from None
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise ReconError(f"{source}: prompt_logprobs has {len(entries) if isinstance(entries, list) else 'no'} entries for {len(ids)} prompt ids")
    logprobs: list[float | None] = [None]
    ranks: list[int | None] = [None]
    top: list[list[tuple[int, float]]] = [[]]
    for i, entry in enumerate(entries[1:], 1):
        if not isinstance(entry, dict) or str(ids[i]) not in entry:
            raise ReconError(f"{source}: prompt_logprobs[{i}] does not hold the prompt's token {ids[i]}")
        mine = entry[str(ids[i])]
        logprobs.append(float(mine["logprob"]))
        ranks.append(mine.get("rank"))
        top.append(sorted(((int(k), float(v["logprob"])) for k, v in entry.items()), key=lambda kv: -kv[1]))
    return SequenceLogprobs(logprobs, ranks, top)


class SGLangScorer(_Remote):
    """SGLang's native ``/generate`` (see the module docstring). Its radix cache matches at token
    granularity, but a request with ``return_logprob`` reads at most ``logprob_start_len``
    positions of it, and the scorer asks from 0 (``cache_read_limit``)."""

    #: where the logprobs asked for begin, and so how much of its cache SGLang may read
    cache_read_limit = LOGPROB_START_LEN = 0

    def __init__(self, url: str, top_k: int = 20, timeout: float = 120.0, api_key: str | None = None,
                 concurrency: int = 4, retries: int = 3):
        url = url.rstrip("/")
        url = url.removesuffix("/v1")
        super().__init__(url if url.endswith("/generate") else url + "/generate", top_k, timeout, api_key,
                         concurrency, retries, RadixCache())

    def request_body(self, ids: Sequence[int], wanted: Sequence[int] = ()) -> dict:
        body = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True, "logprob_start_len": self.LOGPROB_START_LEN, "top_logprobs_num": self.top_k}
        if wanted:
            body["token_ids_logprob"] = sorted(set(wanted))
        return body

    def __call__(self, sequences, temperature=1.0, alternatives=None):
        self._untempered(temperature)
        asked = (alternatives or {}) if len(sequences) == 1 else {}  # as the local scorer: one sequence

        def one(_, ids):
            wanted = sorted({t for ts in asked.values() for t in ts})
            payload = self._post(self.request_body(ids, wanted))
            return parse_sglang_logprobs(payload, ids, asked, source=self.url)
        return self._all(one, sequences)


def _entry(row: Any, where: str, source: str) -> tuple[float | None, int]:
    if not isinstance(row, (list, tuple)) or len(row) < 2 or type(row[1]) is not int:
        raise ReconError(f"{source}: {where}: expected [logprob, token_id, text], got {str(row)[:60]}")
    lp = row[0]
    if lp is not None and not isinstance(lp, (int, float)):
        raise ReconError(f"{source}: {where}: the logprob is {str(lp)[:30]}, not a number")
    return (None if lp is None else float(lp)), row[1]


def parse_sglang_logprobs(payload: dict, ids: Sequence[int], alternatives: dict[int, list[int]] | None = None, *,
                          source: str = "response") -> SequenceLogprobs:
    """SGLang's ``meta_info``: ``input_token_logprobs`` ([logprob, id, text] per position, the
    first one's logprob null), ``input_top_logprobs`` (the top-k there) and
    ``input_token_ids_logprobs`` (the ids ``token_ids_logprob`` asked for, at every position;
    kept where ``alternatives`` asked for them), as :class:`SequenceLogprobs`."""
    meta = payload.get("meta_info") if isinstance(payload, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("input_token_logprobs"), list):
        raise ReconError(f"{source}: no meta_info.input_token_logprobs in the response (return_logprob is needed)")
    rows, tops = meta["input_token_logprobs"], meta.get("input_top_logprobs") or []
    by_id = meta.get("input_token_ids_logprobs") or []
    if len(rows) != len(ids):
        raise ReconError(f"{source}: input_token_logprobs has {len(rows)} entries for {len(ids)} input ids "
                         "(logprob_start_len must be 0)")
    logprobs: list[float | None] = [None]
    ranks: list[int | None] = [None]
    top: list[list[tuple[int, float]]] = [[]]
    for i in range(1, len(ids)):
        lp, tid = _entry(rows[i], f"input_token_logprobs[{i}]", source)
        if tid != ids[i] or lp is None:
            raise ReconError(f"{source}: input_token_logprobs[{i}] is not the logprob of the input's token {ids[i]}")
        here = [_entry(r, f"input_top_logprobs[{i}]", source) for r in (tops[i] if i < len(tops) and tops[i] else [])]
        best = sorted(((t, v) for v, t in here if v is not None), key=lambda kv: -kv[1])
        rank = next((k for k, (t, _) in enumerate(best, 1) if t == tid), None)
        if alternatives and i in alternatives and i < len(by_id) and by_id[i]:
            want = set(alternatives[i])
            best += [(t, v) for v, t in (_entry(r, f"input_token_ids_logprobs[{i}]", source) for r in by_id[i])
                     if t in want and v is not None]
        logprobs.append(lp)
        ranks.append(rank)
        top.append(best)
    return SequenceLogprobs(logprobs, ranks, top)
