"""The two searches on the same samples, in one run: what each costs and what each gets right.

    python benchmarks/recover_search_cost.py --inputs data/heldout-t1.3.jsonl --limit 16

For each search (``recon recover --search beam`` and ``--search lazy``) a fresh local scorer
(one torch thread, so neither reads positions the other ran) recovers the samples one at a time.
Per search it prints: samples exact, samples the other search gets exactly and this one doesn't
(*lost*), search errors (the sampled ids score higher under the sampling distribution than the
returned ones: no fault of the model's), positions per sampled token (median, max: what the scorer
ran for the record, the prompt included, over its sampled ids), scorer calls (median, max) and
seconds; then the ratios. Judging runs after the timed part and is not counted in it. The machine
has 2 shared cores: the seconds of one run are comparable with each other, not with another run's.
Needs the ``generate`` extra (torch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(records, bound, tok, method: str, threads: int):
    from recon.recovery.recover import recover
    from recon.recovery.scorers import make_scorer

    scorer = make_scorer("local", tok, threads=threads)
    out, start = [], time.perf_counter()
    for res in recover(records, bound, scorer, progress=False, method=method, together=1):
        now = time.perf_counter()
        out.append((res, now - start))
        start = now
    return out


def judge(records, results, bound, tok, threads: int) -> list[str]:
    """Per record: exact, hidden (a special token the text does not show), search or model error."""
    from recon.recovery.recover import sampling_of
    from recon.recovery.scorers import make_scorer
    from recon.recovery.search import score_ids

    scorer = make_scorer("local", tok, threads=threads)
    fixed = {t.id for t in tok.added_tokens}
    kinds = []
    for rec, (res, _) in zip(records, results):
        if res.error:
            kinds.append("error")
            continue
        if res.exact:
            kinds.append("exact")
            continue
        body = rec.output_ids[:-1] if rec.response.finish_reason == "stop" else rec.output_ids
        if any(i in fixed for i in body):
            kinds.append("hidden")
            continue
        sampling = sampling_of(rec, scorer)
        got, want = score_ids(rec.prompt_ids, res.ids, scorer, sampling), score_ids(rec.prompt_ids, rec.output_ids, scorer, sampling)
        kinds.append("search" if want > got + 1e-4 else "model")
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", nargs="+", type=Path, default=[ROOT / "data" / "heldout-t1.3.jsonl"])
    ap.add_argument("--limit", type=int, help="the first N samples of each file")
    ap.add_argument("--skip", type=int, default=0, help="start at the N-th sample of each file")
    ap.add_argument("--searches", default="beam,lazy")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", action="store_true", help="the same report (it is markdown already; benchmarks/docs.py asks for it)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import recon
    from recon.audit.profiles import load_profile
    from recon.samples.records import read_records

    tok = recon.load_tokenizer("smollm2")
    bound = load_profile("chatml").bind(tok)
    stop = None if args.limit is None else args.skip + args.limit
    records = [r for path in args.inputs for r in read_records(path).records[args.skip : stop]]
    methods = args.searches.split(",")
    runs = {m: run(records, bound, tok, m, args.threads) for m in methods}
    kinds = {m: judge(records, runs[m], bound, tok, args.threads) for m in methods}
    print(f"{len(records)} samples from {', '.join(p.name for p in args.inputs)}"
          + (f" (from the {args.skip}-th, {args.limit} of each)" if args.limit or args.skip else "")
          + f", one search at a time, {args.threads} torch thread(s):\n")
    print("| search | exact | lost (the other's exact) | search errors | hidden | raised | positions/token median | max "
          "| calls median | max | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for m in methods:
        others = [o for o in methods if o != m]
        per_tok = [res.positions / max(len(rec.output_ids), 1) for rec, (res, _) in zip(records, runs[m]) if res.positions]
        calls = [res.passes for res, _ in runs[m]]
        lost = sum(k != "exact" and any(kinds[o][j] == "exact" for o in others) for j, k in enumerate(kinds[m]))
        seconds = sum(t for _, t in runs[m])
        summary[m] = (statistics.median(per_tok), statistics.median(calls), seconds)
        print(f"| {m} | {kinds[m].count('exact')} | {lost} | {kinds[m].count('search')} | {kinds[m].count('hidden')} | "
              f"{kinds[m].count('error')} | {statistics.median(per_tok):.1f} | {max(per_tok):.1f} | "
              f"{statistics.median(calls):g} | {max(calls)} | {seconds:.0f} |")
    if len(methods) == 2:
        a, b = methods
        print(f"\n{a} / {b} in this run: seconds **{summary[a][2] / summary[b][2]:.2f}x**, positions per token (median) "
              f"{summary[a][0] / summary[b][0]:.2f}x, calls (median) {summary[a][1] / summary[b][1]:.2f}x.")
        differ = [f"- {rec.dataset} `{rec.id}`: {a} {kinds[a][j]}, {b} {kinds[b][j]}" for j, rec in enumerate(records) if kinds[a][j] != kinds[b][j]]
        if differ:
            print("\nWhere they differ:\n\n" + "\n".join(differ))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
