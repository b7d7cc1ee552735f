"""`recon recover --together N` against one search at a time, in one run, on the same samples.

    python benchmarks/recover_together.py                                   # 16 of each held-out file, N = 1, 4, 8
    python benchmarks/recover_together.py --limit 40 --together 1,8 --inputs data/heldout-t1.3.jsonl

Each setting recovers the same records with a fresh local scorer (one torch thread, so CPU
seconds and wall seconds agree), the settings in turn. Printed per setting: wall and CPU
seconds, the ratio to the first setting, how many records come back with the first setting's
ids and how many exactly as sampled (the records' own output_ids, the oracle). Why it is faster:
a forward pass costs ~55 ms before its first position (docs/recovery.md, Limits), and N
searches share each pass. Needs the ``generate`` extra.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from recon import load_tokenizer
    from recon.audit.profiles import load_profile
    from recon.recovery.recover import recover
    from recon.recovery.scorers import make_scorer
    from recon.samples.records import read_records

    tok = load_tokenizer("smollm2")
    bound = load_profile("chatml").bind(tok)
    records = [r for path in args.inputs for r in read_records(path, vocab_size=tok.vocab_size).records[: args.limit]]
    settings = [int(n) for n in args.together.split(",")]
    print(f"{len(records)} records from {', '.join(p.name for p in args.inputs)}")
    print("| together | wall s | CPU s | wall vs first | same ids as first | exact (= sampled) |")
    print("|---:|---:|---:|---:|---:|---:|")
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
        print(f"| {n} | {wall:.1f} | {cpu:.1f} | {first[0] / wall:.2f}x | {same}/{len(records)} | {exact} |", flush=True)


if __name__ == "__main__":
    main()
