"""``recon validate/import/pair``: sample files: validate, import server responses, pair."""

from __future__ import annotations

import argparse

from recon.cli.options import _print_errors
from recon.samples.io import bad_record_count


def cmd_validate(args: argparse.Namespace) -> int:
    from recon import load_tokenizer
    from recon.samples.records import read_records

    vocab = load_tokenizer(args.tokenizer).vocab_size if args.tokenizer else None
    result = read_records(args.data, vocab_size=vocab)
    _print_errors(result.errors, args.max_errors)
    print(result.summary())
    return 0 if result.records else 2


def cmd_import(args: argparse.Namespace) -> int:
    from recon.samples.importers import import_file

    from recon.errors import ReconError

    sampler = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p), ("top_k", args.top_k),
                                 ("min_p", args.min_p), ("sampler_order", args.sampler_order), ("engine", args.engine))
               if v is not None}
    for name, ok in (("temperature", lambda v: v > 0), ("top_p", lambda v: 0 < v <= 1), ("top_k", lambda v: v >= 0),
                     ("min_p", lambda v: 0 <= v <= 1)):
        if name in sampler and not ok(sampler[name]):
            raise ReconError(f"--{name.replace('_', '-')} {sampler[name]}: out of range (temperature > 0, 0 < top-p <= 1, "
                             "top-k >= 0, 0 <= min-p <= 1)")
    result = import_file(args.kind, args.inputs, args.out, dataset=args.dataset, meta=sampler,
                         requests=args.requests or ())
    _print_errors(result.errors)
    print(f"wrote {result.records} records to {args.out}; {bad_record_count(result.errors)} bad input lines")
    return 0 if result.records else 2


def cmd_pair(args: argparse.Namespace) -> int:
    from recon.samples.importers import pair_files

    result = pair_files(args.ground_truth, args.api, args.out)
    _print_errors(result.errors)
    print(f"wrote {result.paired} paired records to {args.out}")
    for label, ids in (("only in ground truth", result.only_ground_truth), ("only in API file", result.only_api)):
        if ids:
            shown = ", ".join(ids[:10]) + (f", ... ({len(ids)} in all)" if len(ids) > 10 else "")
            print(f"unmatched, {label}: {shown}")
    return 0 if result.paired else 2


def add_validate(sub) -> None:
    p = sub.add_parser("validate", help="check sample files: every bad record with file, line and field")
    p.add_argument("data", nargs="+", help="JSONL (.gz) or Parquet files in the sample format")
    p.add_argument("--tokenizer", help="also check ids against this tokenizer's vocabulary")
    p.add_argument("--max-errors", type=int, default=50, help="problems to print (default 50)")
    p.set_defaults(func=cmd_validate)


def add_import(sub) -> None:
    p = sub.add_parser("import", help="turn server responses into the sample format")
    p.add_argument("kind", choices=["sglang", "vllm", "openai"], help="server response shape")
    p.add_argument("inputs", nargs="+", help="JSONL files, one server response a line")
    p.add_argument("--out", required=True)
    p.add_argument("--dataset", help="dataset name (default: the input file's stem)")
    p.add_argument("--requests", nargs="+", metavar="FILE",
                   help="the requests that produced the responses (OpenAI Batch input, joined by custom_id; or "
                        "{id, request} lines): each record keeps their messages, tools and chat_template_kwargs")
    g = p.add_argument_group("the sampler the requests asked for (kept in meta: recon recover scores under it)")
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--top-k", type=int, help="0: off")
    g.add_argument("--min-p", type=float)
    g.add_argument("--sampler-order", choices=["hf", "llama.cpp"],
                   help="hf (vLLM, SGLang, transformers: temperature first) or llama.cpp (temperature last)")
    g.add_argument("--engine", help="what served them (e.g. vllm, sglang, llama.cpp), kept in meta")
    p.set_defaults(func=cmd_import)


def add_pair(sub) -> None:
    p = sub.add_parser("pair", help="join a ground-truth file and an API file by id")
    p.add_argument("ground_truth")
    p.add_argument("api")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_pair)
