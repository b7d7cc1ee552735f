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
    _prompts,
)
from recon.errors import CheckFailed, ReconError
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
    import tempfile

    from recon.audit.engine import audit_files

    out = Path(args.out) if args.out else None
    prompts = None if args.no_prompt_audit else _prompts(args)
    with tempfile.TemporaryDirectory(prefix="recon-check-") as scratch:
        rows = out / "samples.parquet" if out else (Path(scratch) / "fast.parquet" if args.check else None)
        def audit(encoder: str, rows_path: Path | None):
            return audit_files(
                args.data, tokenizer=args.tokenizer, family=args.family, profile=args.profile, method=args.method,
                mode=args.mode, options=_parse_options(args), rows_path=rows_path, dask=args.dask, prompts=prompts,
                **{**_engine_options(args), "encoder": encoder},
            )
        run = audit(args.encoder, rows)
        _print_errors(run.errors)
        summary = run.summary
        summary["bad_records"] = bad_record_count(run.errors)
        if args.check:
            if args.check == args.encoder:
                raise ReconError(f"--check {args.check} with --encoder {args.encoder}: nothing to compare")
            audit(args.check, Path(scratch) / "check.parquet")
            summary["check"] = {"encoder": args.check, "rows": same_rows(rows, Path(scratch) / "check.parquet",
                                                                         args.encoder, args.check)}
    if out:
        (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        _print_summary(summary)
        if "prompts" in summary:
            _print_prompts(summary["prompts"])
        if "conversations" in summary and (summary["conversations"]["boundaries"] or summary["conversations"]["trajectories"]):
            _print_conversations(summary["conversations"])  # (single-turn data: nothing to say)
        if args.check:
            print(f"check: all {summary['check']['rows']} rows identical with --encoder {args.encoder} and {args.check}")
        if out:
            extra = f"; per-boundary: {out / 'boundaries.parquet'}" if "conversations" in summary else ""
            print(f"per-sample results: {out / 'samples.parquet'}{extra}; summary: {out / 'summary.json'}")
    return 0


def _print_prompts(p: dict) -> None:
    sources = ", ".join(f"{k} {n}" for k, n in p["by_source"].items()) or "-"
    line = f"prompts: {p['records']} records ({sources})"
    if p["audited"]:
        causes = ", ".join(f"{k} {n}" for k, n in p["by_cause"].items())
        line += f"; engine vs rendered: {p['exact']} exact, {p['diverged']} diverged" + (f" ({causes})" if causes else "")
    if p["by_status"].get("error"):
        line += f"; {p['by_status']['error']} could not be rendered"
    print(line)


def _print_conversations(c: dict) -> None:
    causes = ", ".join(f"{k} {n}" for k, n in c["by_cause"].items())
    line = (f"conversations: {c['boundaries']} turn boundaries, prefix kept at {c['prefix_kept']}, broken at "
            f"{c['prefix_broken']}" + (f" ({causes})" if causes else ""))
    if c["unchecked"]:
        line += f"; {c['unchecked']} not checked"
    print(line + f"; {c['trajectories']} trajectories: {c['whole']} whole, {c['cut']} cut")


def same_rows(a: Path, b: Path, a_name: str, b_name: str) -> int:
    """How many rows two audits' ``samples.parquet`` hold, once every row is found equal, read
    in step a batch at a time (flat memory); the first difference is an error naming the sample
    and the column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def batches(path: Path):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
            yield pa.Table.from_batches([batch])

    left, right = batches(a), batches(b)
    x = y = None
    rows = 0
    while True:
        x = x if x is not None and x.num_rows else next(left, None)
        y = y if y is not None and y.num_rows else next(right, None)
        if x is None or y is None:
            if x is not None or y is not None:
                raise CheckFailed(f"--encoder {a_name} gave {'more' if x is not None else 'fewer'} rows "
                                 f"than {b_name} after row {rows}")
            return rows
        n = min(x.num_rows, y.num_rows)
        if not x.slice(0, n).equals(y.slice(0, n)):
            for k in range(n):
                one, other = x.slice(k, 1).to_pylist()[0], y.slice(k, 1).to_pylist()[0]
                if one != other:
                    column = next(c for c in one if one[c] != other[c])
                    raise CheckFailed(
                        f"row {rows + k} (sample {one['id']!r} of {one['dataset']!r}) differs in {column}: "
                        f"--encoder {a_name} {_short(one[column])}, {b_name} {_short(other[column])}")
        rows += n
        x, y = x.slice(n), y.slice(n)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def cmd_export(args: argparse.Namespace) -> int:
    from recon.audit.engine import audit_files
    from recon.samples.export import Policy

    trainer = args.format != "table"
    if args.trajectories and not trainer:
        raise ReconError("--trajectories writes trainer rows: give --format speculators or specforge")
    if trainer and Path(args.out).suffix == ".parquet" and args.format == "specforge":
        raise ReconError(f"{args.out}: SpecForge reads prompts_path as JSONL; name the output .jsonl")
    run = audit_files(
        args.data, tokenizer=args.tokenizer, family=args.family, profile=args.profile, method=args.method,
        mode=args.mode, options=_parse_options(args), export_path=args.out,
        policy=Policy(args.policy, args.min_confidence, args.format, args.max_length, args.min_loss_tokens,
                      args.trajectories),
        prompts=_prompts(args, audit=False), **_engine_options(args),
    )
    _print_errors(run.errors)
    n = run.summary["samples"]
    if not trainer:
        print(f"wrote {n} samples to {run.rows_path}: {run.kept} kept under policy {args.policy}, {n - run.kept} not")
        return 0
    export = run.summary["export"]
    dropped = export["dropped"]
    why = "".join(f", {k} {v}" for k, v in dropped.items())
    if args.json:
        print(json.dumps(run.summary, ensure_ascii=False))
        return 0
    if "trajectories" not in export:
        print(f"wrote {run.kept} {args.format} rows to {run.rows_path} from {n} samples: "
              f"{n - run.kept - sum(dropped.values())} dropped under policy {args.policy}{why}")
        return 0
    t = export["trajectories"]
    causes = ", ".join(f"{k} {v}" for k, v in t["by_cause"].items())
    print(f"wrote {export['rows']} {args.format} rows to {args.out} from {n} samples: {export['trajectory_rows']} "
          f"whole trajectories (one row each) and {export['generation_rows']} generation rows; trajectories: "
          f"{t['whole']} whole, {t['cut']} cut into turns" + (f" ({causes})" if causes else "")
          + f"; {n - export['kept_generations'] - sum(dropped.values())} samples dropped under policy {args.policy}{why}")
    return 0


def add_reconstruct(sub) -> None:
    p = sub.add_parser("reconstruct", help="API text back to token ids (adds recon_ids to each record)")
    _add_data_arguments(p)
    p.add_argument("--method", default="auto", choices=["concat", "segments", "logprobs", "auto"])
    p.add_argument("--out", required=True)
    _add_parse_options(p)
    p.set_defaults(func=cmd_reconstruct, quick_exit=True)


def add_audit(sub) -> None:
    p = sub.add_parser("audit", help="ground truth against reconstruction: status and cause per sample")
    _add_audit_arguments(p)
    p.add_argument("--out", help="folder for samples.parquet and summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_engine_arguments(p)
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: 'local' (LocalCluster) or tcp://scheduler:8786")
    p.add_argument("--no-prompt-audit", action="store_true",
                   help="skip the prompt audit (the engine's prompt_ids against the rendered request)")
    p.add_argument("--check", choices=["native", "fast"],
                   help="audit again with this encoder and fail unless every row is identical (native: the tokenizer's "
                        "own encoder checks recon's fast paths)")
    p.set_defaults(func=cmd_audit, quick_exit=True)


def add_export(sub) -> None:
    p = sub.add_parser("export", help="the training-ready dataset: ids, status, cause and a keep flag")
    _add_audit_arguments(p)
    p.add_argument("--policy", default="exact-only", choices=["exact-only", "fallback", "drop-mismatches", "recover"],
                   help="recover: exact samples, plus samples whose ids `recon recover` recovered confidently")
    p.add_argument("--min-confidence", type=float, default=0.9, metavar="P",
                   help="recover: least recovery confidence to keep a sample (default 0.9)")
    p.add_argument("--format", default="table", choices=["table", "speculators", "specforge"],
                   help="table: ids, status, cause and keep per sample; speculators / specforge: one row per kept "
                        "generation, input_ids = prompt + sampled ids, loss_mask 1 on exactly the sampled ids")
    p.add_argument("--max-length", type=int, metavar="N", help="trainer formats: cut rows to N tokens, as the trainer would")
    p.add_argument("--min-loss-tokens", type=int, default=1, metavar="N",
                   help="trainer formats: drop rows with fewer sampled tokens than this (after --max-length; default 1)")
    p.add_argument("--trajectories", action="store_true",
                   help="trainer formats: a multi-turn trajectory whose prefix holds at every turn boundary becomes one "
                        "row (loss on every turn's sampled ids, 0 on the text between them) instead of a row per turn")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--out", required=True, help=".parquet or .jsonl")
    _add_engine_arguments(p)
    p.set_defaults(func=cmd_export, quick_exit=True)
