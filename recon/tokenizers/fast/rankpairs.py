"""Adjacent pairs of tokens tested by tiktoken's own BPE, run by recon in C on the ranks.

Why: a run of CJK tokens is confirmed by its adjacent pairs (:mod:`recon.tokenizers.fast.cjkruns`),
each pair's question being whether the BPE alone of its two tokens' bytes gives exactly those
two tokens. In a vocabulary with tens of thousands of CJK tokens (Qwen, Kimi, cl100k) a cold
audit of CJK text asks it of ~250,000 new pairs, and through the core (a pair a piece, or many
glued into one text) that cost what re-encoding the text costs. The answer depends only on the
ranks, so it is computed here: :func:`recon.kernel.bpe_pairs` is tiktoken's
``_encode_single_piece`` (a piece that is a token is that token; else bytes merged, again and
again, at the leftmost adjacent parts whose joined bytes have the lowest rank) on the pair's
bytes, with the ranks in a hash of their bytes, several times faster than a call into the core
and no text built. ``tests/test_canonical_cjk.py`` holds it to the core's own
``_encode_single_piece`` on real and random pairs of each tiktoken vocabulary.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from recon.kernel import bpe_pairs, bpe_table
from recon.tokenizers.fast.cjkids import layout


def rank_pairs(token_bytes: Sequence[bytes], ranks: Iterable[int]) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """The pair test of :class:`~recon.tokenizers.fast.cjkruns.PairCheck` for a tiktoken core:
    ``test(a, b, same)``, per pair, whether the core's BPE of a's bytes then b's is exactly
    [a, b]. ``token_bytes[id]``: every token's bytes (as built from the core's ranks: the
    ordinary token of rank r is ``token_bytes[r]``); ``ranks``: the ids of the ordinary tokens,
    the only ones a merge makes (added tokens never take part)."""
    n = len(token_bytes)
    vocab = layout(token_bytes)
    offsets = np.concatenate(([0], np.cumsum(vocab.lengths))).astype(np.int64).tobytes()
    data = vocab.raw
    include = np.zeros(n, np.uint8)
    ids = np.fromiter(ranks, np.int64)
    include[ids[(ids >= 0) & (ids < n)]] = 1
    table = bpe_table(data, offsets, include.tobytes())

    def test(a: np.ndarray, b: np.ndarray, same: np.ndarray) -> np.ndarray:
        a, b = (np.ascontiguousarray(x, dtype=np.int64).tobytes() for x in (a, b))
        return np.frombuffer(bpe_pairs(a, b, data, offsets, table), dtype=bool).copy()

    return test
