"""``recon reconstruct/audit/export``: reconstruct, audit and export sample files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recon.cli.options import (
    _add_audit_arguments,
    _add_data_arguments,
    _add_engine_arguments,
    _add_parse_options,
    _engine_options,
    _parse_options,
    _print_errors,
)
from recon.samples.io import bad_record_count


def cmd_reconstruct(args: argparse.Namespace) -> int:
    from recon import load_tokenizer
    from recon.audit.profiles import load_profile
    from recon.audit.reconstruct import reconstruct_records
    from recon.samples.records import read_records, write_records

    tok = load_tokenizer(args.tokenizer, family=args.family)
    bound = load_profile(args.profile).bind(tok)
    data = read_records(args.data, vocab_size=tok.vocab_size)
    _print_errors(data.errors)
    results = reconstruct_records(data.records, bound, args.method, _parse_options(args))
    extras = []
    for res in results:
        extra = {"recon_ids": res.ids, "recon_method": res.method}
        if res.coverage is not None:
            extra["recon_coverage"] = round(res.coverage, 6)
        if res.error:
            extra["recon_error"] = res.error
        extras.append(extra)
    n = write_records(data.records, args.out, extras)
    failed = sum(r.error is not None for r in results)
    methods = ", ".join(f"{m}: {sum(r.method == m and r.error is None for r in results)}" for m in sorted({r.method for r in results}))
    print(f"wrote {n} records to {args.out} ({methods}; {failed} could not be reconstructed); {data.summary()}")
    return 0 if data.records else 2


def _print_summary(summary: dict) -> None:
    def line(name: str, s: dict) -> str:
        rate = "n/a" if s["exact_rate"] is None else f"{s['exact_rate']:.1%}"
        causes = ", ".join(f"{c} {n}" for c, n in s["by_cause"].items()) or "-"
        return f"{name:24} {s['samples']:>8} {s['exact']:>8} {s['mismatched']:>9} {s['errors']:>7} {s['unverified']:>10}  {rate:>7}  {causes}"
    print(f"{'dataset':24} {'samples':>8} {'exact':>8} {'mismatch':>9} {'errors':>7} {'unverified':>10}  {'exact%':>7}  causes")
    for name, s in summary["datasets"].items():
        print(line(name, s))
    if len(summary["datasets"]) > 1:
        print(line("all", summary))


def cmd_audit(args: argparse.Namespace) -> int:
    from recon.audit.engine import audit_files

    out = Path(args.out) if args.out else None
    run = audit_files(
        args.data, tokenizer=args.tokenizer, family=args.family, profile=args.profile, method=args.method,
        mode=args.mode, options=_parse_options(args), rows_path=out / "samples.parquet" if out else None,
        dask=args.dask, **_engine_options(args),
    )
    _print_errors(run.errors)
    summary = run.summary
    summary["bad_records"] = bad_record_count(run.errors)
    if out:
        (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        _print_summary(summary)
        if out:
            print(f"per-sample results: {out / 'samples.parquet'}; summary: {out / 'summary.json'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from recon.audit.engine import audit_files
    from recon.samples.export import Policy

    run = audit_files(
        args.data, tokenizer=args.tokenizer, family=args.family, profile=args.profile, method=args.method,
        mode=args.mode, options=_parse_options(args), export_path=args.out,
        policy=Policy(args.policy, args.min_confidence), **_engine_options(args),
    )
    _print_errors(run.errors)
    n = run.summary["samples"]
    print(f"wrote {n} samples to {run.rows_path}: {run.kept} kept under policy {args.policy}, {n - run.kept} not")
    return 0


def add_reconstruct(sub) -> None:
    p = sub.add_parser("reconstruct", help="API text back to token ids (adds recon_ids to each record)")
    _add_data_arguments(p)
    p.add_argument("--method", default="auto", choices=["concat", "segments", "logprobs", "auto"])
    p.add_argument("--out", required=True)
    _add_parse_options(p)
    p.set_defaults(func=cmd_reconstruct)


def add_audit(sub) -> None:
    p = sub.add_parser("audit", help="ground truth against reconstruction: status and cause per sample")
    _add_audit_arguments(p)
    p.add_argument("--out", help="folder for samples.parquet and summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_engine_arguments(p)
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: 'local' (LocalCluster) or tcp://scheduler:8786")
    p.set_defaults(func=cmd_audit)


def add_export(sub) -> None:
    p = sub.add_parser("export", help="the training-ready dataset: ids, status, cause and a keep flag")
    _add_audit_arguments(p)
    p.add_argument("--policy", default="exact-only", choices=["exact-only", "fallback", "drop-mismatches", "recover"],
                   help="recover: exact samples, plus samples whose ids `recon recover` recovered confidently")
    p.add_argument("--min-confidence", type=float, default=0.9, metavar="P",
                   help="recover: least recovery confidence to keep a sample (default 0.9)")
    p.add_argument("--out", required=True, help=".parquet or .jsonl")
    _add_engine_arguments(p)
    p.set_defaults(func=cmd_export)
