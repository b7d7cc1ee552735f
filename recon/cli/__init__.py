"""The ``recon`` command: one module per command family, this one assembling them.

Expected errors print one line (``recon: error: ...``), not a traceback."""

from __future__ import annotations

import argparse
import sys

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recon",
        description="Which token ids did a language model sample? Check special tokens, reconstruct ids "
                    "from API text, audit reconstructions against ground truth.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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

