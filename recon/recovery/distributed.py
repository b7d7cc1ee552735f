"""Recovery on a Dask cluster: the local scorer on every worker, records in small chunks.

Why: recovering a sample costs seconds of model time, and one machine's cores are soon not
enough. The audit already runs on Dask (:mod:`recon.audit.engine`); recovery uses the same
cluster. Each worker loads the tokenizer, the profile and the model once (:func:`_worker_state`,
cached per process), chunks of records go out a few at a time (a bounded number in flight, so
memory stays flat), and the results come back in input order, so ``recon recover --out`` streams
them as it does in one process. Every record is recovered by the same code as in-process
(:func:`recon.recovery.recover.recover`), so the results are identical.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Iterator, Sequence

from recon.recovery.recover import Recovery
from recon.samples.records import Record

#: records per task: a few, so a slow sample holds up little and the workers stay busy
CHUNK = 4


@lru_cache(maxsize=2)
def _worker_state(tokenizer: str, family: str | None, profile: str, model: str, threads: int | None, top_k: int | None):
    """The bound profile and the local scorer, built once in each worker process."""
    from recon.audit.profiles import load_profile
    from recon.recovery.scorers import make_scorer
    from recon.tokenizers.load import load_tokenizer

    tok = load_tokenizer(tokenizer, family=family)
    return load_profile(profile).bind(tok), make_scorer("local", tok, model=model, threads=threads, top_k=top_k)


def recover_chunk(spec: tuple, records: Sequence[Record], temperature: float | None, lookahead: bool,
                  together: int = 1, slack: float | None = None, method: str = "beam") -> list[Recovery]:
    """Recover ``records`` in whatever process runs this (a Dask worker), ``together`` at once."""
    from recon.recovery.recover import recover

    bound, scorer = _worker_state(*spec)
    return list(recover(records, bound, scorer, temperature=temperature, lookahead=lookahead, progress=False,
                        together=together, slack=slack, method=method))


def recover_on_dask(records: Sequence[Record], spec: tuple, address: str, *, temperature: float | None = None,
                    lookahead: bool = True, chunk: int = CHUNK, client=None, together: int = 1,
                    slack: float | None = None, method: str = "beam") -> Iterator[Recovery]:
    """Each record's :class:`Recovery`, in input order, recovered on the Dask cluster at ``address``
    (``"local"``: a LocalCluster here) or through ``client``. ``spec``: (tokenizer, family,
    profile, model, threads, top_k), what each worker loads. ``together``: searches a worker runs
    at once (:mod:`recon.recovery.together`; a task then holds at least that many records)."""
    from recon.audit.workers import _bounded, _dask_client

    own = client is None
    if own:
        client = _dask_client(address)
    try:
        limit = 2 * max(len(client.scheduler_info().get("workers", {})), 1)
        chunk = max(chunk, together)
        chunks: Iterable[Sequence[Record]] = (records[i : i + chunk] for i in range(0, len(records), chunk))
        submit = lambda part: client.submit(recover_chunk, spec, part, temperature, lookahead, together, slack, method, pure=False)  # noqa: E731
        for done in _bounded(iter(chunks), submit, lambda future: future.result(), limit):
            yield from done
    finally:
        if own:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
