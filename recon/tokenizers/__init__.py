"""The tokenizers room: a spec becomes a :class:`Tokenizer`, safely, and its special tokens are
found by text and checked.

* :mod:`~recon.tokenizers.load` — specs (short names, HF files, tiktoken directories, GGUF) to
  tokenizers, never running a repository's code;
* :mod:`~recon.tokenizers.tokenizer` — the one interface the rest of recon sees, with
  :mod:`~recon.tokenizers.native` wrapping the two native cores (HF ``tokenizers``, ``tiktoken``);
* :mod:`~recon.tokenizers.families` — per-family pre-tokenizers for tokenizers built natively (Kimi);
* :mod:`~recon.tokenizers.gguf` and :mod:`~recon.tokenizers.gguf_reader` — GGUF vocabularies;
* :mod:`~recon.tokenizers.specials` — special-token discovery and id checks;
* :mod:`~recon.tokenizers.bytelevel` — GPT-2 byte-level pieces to bytes and back;
* :mod:`recon.tokenizers.fast` — exact fast paths, each checked against the native encoder.
"""

from recon.tokenizers.load import SHORT_NAMES, load_tokenizer
from recon.tokenizers.tokenizer import AddedToken, Tokenizer

__all__ = ["SHORT_NAMES", "AddedToken", "Tokenizer", "load_tokenizer"]
