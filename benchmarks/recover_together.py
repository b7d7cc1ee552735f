"""`recon recover --together N` against one search at a time, in one run, on the same samples.

    python benchmarks/recover_together.py                                   # 16 of each held-out file, N = 1, 4, 8
    python benchmarks/recover_together.py --limit 40 --together 1,8 --inputs data/heldout-t1.3.jsonl
    python benchmarks/recover_together.py --all --together 4 --shard 0/2 &   # every held-out sample, against
    python benchmarks/recover_together.py --all --together 4 --shard 1/2     # the bundled rows (one at a time)

Each setting recovers the same records with a fresh local scorer (one torch thread, so CPU
seconds and wall seconds agree), the settings in turn. Printed per setting: wall and CPU
seconds, the ratio to the first setting, the positions run through the model and the forward
passes that ran them, how many records come back with the first setting's
ids and how many exactly as sampled (the records' own output_ids, the oracle). Why it is faster:
a forward pass costs ~55 ms before its first position (docs/recovery.md, Limits), and N
searches share each pass. Needs the ``generate`` extra.

``--all`` takes every held-out file (the four `data/heldout-*.jsonl`), no limit, and compares
each record with its bundled row (``data/recover-heldout*.jsonl``, made one search at a time):
exactness, failure and confidence (the rows keep 6 decimals).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
INPUTS = [DATA / "heldout-t0.7.jsonl", DATA / "heldout-t1.3.jsonl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, nargs="+", default=INPUTS, help="sample files (records with prompt_ids)")
    parser.add_argument("--limit", type=int, default=16, help="the first N records of each file")
    parser.add_argument("--together", default="1,4,8", help="settings, comma-separated (the first is the reference)")
    parser.add_argument("--all", action="store_true", help="every held-out sample, each compared with its bundled row")
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th record from the i-th (run n at once)")
    parser.add_argument("--markdown", action="store_true", help="print the table as docs/benchmarks.md shows it")
    args = parser.parse_args()
    if args.all:
        args.inputs, args.limit = sorted(DATA.glob("heldout-*.jsonl")), None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from recon import load_tokenizer
    from recon.audit.profiles import load_profile
    from recon.recovery.recover import recover
    from recon.recovery.scorers import make_scorer
    from recon.samples.records import read_records

    tok = load_tokenizer("smollm2")
    bound = load_profile("chatml").bind(tok)
    records = [r for path in args.inputs for r in read_records(path, vocab_size=tok.vocab_size).records[: args.limit]]
    shard, shards = map(int, args.shard.split("/"))
    records = records[shard::shards]
    rows = {(r["dataset"], r["id"]): r for path in DATA.glob("recover-heldout*.jsonl")
            for r in map(json.loads, path.read_text().splitlines())} if args.all else {}
    settings = [int(n) for n in args.together.split(",")]
    print(f"{len(records)} records from {', '.join(p.name for p in args.inputs)}" + (":\n" if args.markdown else ""))
    print("| together | wall s | CPU s | wall vs first | positions | passes | same ids as first | exact (= sampled) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    first = None
    for n in settings:
        scorer = make_scorer("local", tok, threads=1)
        wall, cpu = time.perf_counter(), time.process_time()
        results = list(recover(records, bound, scorer, progress=False, together=n))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        ids = [r.ids for r in results]
        if first is None:
            first = (wall, ids)
        same = sum(a == b for a, b in zip(first[1], ids))
        exact = sum(r.ids is not None and r.ids == rec.output_ids for r, rec in zip(results, records))
        print(f"| {n} | {wall:.1f} | {cpu:.1f} | {first[0] / wall:.2f}x | {scorer.positions_run:,} | {scorer.passes_run:,} "
              f"| {same}/{len(records)} | {exact} |", flush=True)
        if rows:
            against_rows(records, results, rows)


def against_rows(records, results, rows: dict) -> None:
    """Each result beside its bundled row: exactness and confidence (and where they differ)."""
    agree, gap, differ = 0, 0.0, []
    for rec, res in zip(records, results):
        row = rows[rec.dataset, rec.id]
        if (res.ids == rec.output_ids) == row["exact"]:
            agree += 1
        else:
            differ.append(rec.id)
        if res.confidence is not None and row["confidence"] is not None:
            gap = max(gap, abs(res.confidence - row["confidence"]))
    print(f"against the bundled rows: exactness the same for {agree}/{len(records)}"
          + (f" (differ: {', '.join(differ)})" if differ else "") + f"; largest confidence difference {gap:.2e}")


if __name__ == "__main__":
    main()
