"""The ``recon`` command: one module per command family, this one assembling them.

Expected errors print one line (``recon: error: ...``), not a traceback."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from typing import NoReturn

from recon.cli import audit, model, report, samples, server, setup, tokens
from recon.errors import CheckFailed, ReconError, SpecialTokenMismatch

#: the subcommands, in the order ``recon --help`` lists them
COMMANDS = (
    setup.add_setup,
    tokens.add_tokens,
    report.add_report,
    audit.add_reconstruct,
    audit.add_audit,
    audit.add_export,
    model.add_recover,
    samples.add_validate,
    model.add_generate,
    samples.add_import,
    samples.add_pair,
    server.add_serve,
    server.add_collect,
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (an unknown choice, a missing argument) print one
    line, as recon's other expected errors do, rather than the usage block and then the error.
    Subcommands' parsers are this class too (``add_subparsers`` makes them of its parser's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="recon",
        description="Which token ids did a language model sample? Check special tokens, reconstruct ids "
                    "from API text, audit reconstructions against ground truth.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv``: the arguments, ``sys.argv[1:]`` by default); its exit status."""
    return _run(build_parser().parse_args(argv))


def run() -> NoReturn:
    """The ``recon`` program: :func:`main`, then exit. A command that sets ``quick_exit`` (the audits,
    whose tokenizer tables hold hundreds of thousands of objects) ends without the interpreter
    freeing every object one by one (~0.1 s, a twentieth of a 20,000-record audit): output
    flushed and exit handlers run first, as at a normal exit, and only where no other thread runs."""
    args = build_parser().parse_args()
    code = _run(args)
    if getattr(args, "quick_exit", False) and threading.active_count() == 1:
        atexit._run_exitfuncs()  # what a normal exit runs: logging, tempfile and multiprocessing clean-ups
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`| head`), a closed stream
                pass
        os._exit(code)
    sys.exit(code)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except SpecialTokenMismatch as e:
        print(f"recon: mismatch: {e}", file=sys.stderr)
        return 1
    except CheckFailed as e:
        print(f"recon: check failed: {e}", file=sys.stderr)
        return 1
    except ReconError as e:
        print(f"recon: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `recon tokens ... | head`
        return 0

