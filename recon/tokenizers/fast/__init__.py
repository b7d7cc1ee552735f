"""Exact fast paths beside the native encoder: same ids, less work.

Each one is an optimisation of :meth:`recon.tokenizers.Tokenizer.encode_batch` and nothing
else; the native encoder stays the oracle, and the tests check every path against it.

* :mod:`~recon.tokenizers.fast.pretokenize` — the tokenizer's own pre-tokenizer replayed with
  Python's ``re`` on ASCII text, and the token-space boundary rules;
* :mod:`~recon.tokenizers.fast.wordcache` — each distinct pre-token encoded once by the BPE model;
* :mod:`~recon.tokenizers.fast.canonical` — a sample's ids confirmed as its text's encoding on
  the ids themselves;
* :mod:`~recon.tokenizers.fast.derive` — the boundary rules of a tiktoken-style pattern, read off
  its structure (cl100k, Qwen, Kimi).
"""
