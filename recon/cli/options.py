"""Arguments several commands share: sample files, tokenizer and profile, parse options, engine."""

from __future__ import annotations

import argparse
import sys


def _parse_options(args: argparse.Namespace):
    from recon.audit.profiles import ParseOptions

    return ParseOptions(strip_content=args.strip_content, drop_newline_after_close=args.drop_newline_after_close,
                        reserialize_arguments=args.reserialize_arguments, renumber_ids=args.renumber_ids,
                        skip_special_tokens=args.skip_special_tokens)


def _add_parse_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server deviations when parsing output_ids into an API view")
    g.add_argument("--strip-content", action="store_true", help="strip whitespace around content and reasoning")
    g.add_argument("--drop-newline-after-close", action="store_true", help="drop one newline after the reasoning close tag")
    g.add_argument("--reserialize-arguments", action="store_true", help="json.dumps(json.loads(arguments)) with defaults")
    g.add_argument("--renumber-ids", action="store_true", help="tool call ids become call_0, call_1, ...")
    g.add_argument("--skip-special-tokens", action="store_true", help="drop special tokens outside the grammar from the text")


def _add_data_arguments(p: argparse.ArgumentParser, data: str = "sample files (JSONL, .jsonl.gz, Parquet)",
                        tokenizer: str = "tokenizer spec") -> None:
    """The sample files, and the tokenizer and profile to read them with (every command over records)."""
    p.add_argument("data", nargs="+", help=data)
    p.add_argument("--tokenizer", required=True, help=tokenizer)
    p.add_argument("--family", help="pre-tokenizer family for a tiktoken ranks file")
    p.add_argument("--profile", required=True, help="kimi-k2, deepseek, qwen3, chatml, or a YAML file")


def _engine_options(args: argparse.Namespace) -> dict:
    options = {"workers": args.workers, "encoder": args.encoder}
    if args.chunk_size:
        options["chunk_size"] = args.chunk_size
    return options


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-size", type=int, metavar="N",
                   help="records per batch (memory holds a few per worker; default 1,000)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker processes on this machine (default: one per core; 1 = in this process)")
    p.add_argument("--encoder", default="fast", choices=["fast", "native"],
                   help="fast: recon's exact fast paths (default); native: every text through the tokenizer's own "
                        "encoder, the oracle the fast paths are checked against")


def _add_audit_arguments(p: argparse.ArgumentParser) -> None:
    _add_data_arguments(p)
    p.add_argument("--method", default="auto", choices=["concat", "segments", "logprobs", "auto"])
    p.add_argument("--mode", default="auto", choices=["auto", "roundtrip", "paired", "reconstruct-only"],
                   help="auto: paired when a record has output_ids and a response, roundtrip with ids only")
    _add_parse_options(p)
    g = p.add_argument_group("prompts (the engine's prompt_ids, else the record's messages rendered by the chat template)")
    g.add_argument("--chat-template", metavar="FILE",
                   help="the chat template (.jinja, or JSON with a chat_template key); default: the tokenizer's own "
                        "(chat_template.jinja, tokenizer_config.json or the GGUF)")
    g.add_argument("--template-name", metavar="NAME",
                   help="which of a tokenizer's several named templates (default: 'default', as transformers picks)")


def _prompts(args: argparse.Namespace, *, audit: bool = True):
    """The run's prompt setting: the chat template found for ``--tokenizer`` (or given)."""
    from recon.audit.engine import Prompts, _bound
    from recon.prompts.sources import find_chat_template

    # the tokenizer the run loads anyway (cached): its files say where the template is
    tok = _bound(args.tokenizer, args.family, args.profile, getattr(args, "encoder", "fast")).tok
    template = find_chat_template(tok.source, chat_template=args.chat_template, name=args.template_name)
    return Prompts(template, audit)


def _print_errors(errors, limit: int = 50) -> None:
    for err in errors[:limit]:
        print(err, file=sys.stderr)
    if len(errors) > limit:
        print(f"... and {len(errors) - limit} more problems", file=sys.stderr)
