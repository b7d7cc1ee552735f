"""How well `recon recover` gets back the sampled ids, on real held-out SmolLM2 samples.

    python benchmarks/recover_accuracy.py                      # recover every sample, then report
    python benchmarks/recover_accuracy.py --shard 0/2 &        # or in parallel shards ...
    python benchmarks/recover_accuracy.py --shard 1/2
    python benchmarks/recover_accuracy.py --report             # ... and report from their rows
                                                               # (no shards: from the bundled rows)

Input: ``data/heldout-t0.7.jsonl`` and ``data/heldout-t1.3.jsonl`` (made by ``recon generate``
with seed 11, not the bundled seed-0 samples; see data/README.md). Only the API view is used
(response text + prompt ids); the ground-truth ids only judge the result. One row per sample
goes to ``data/recover-heldout.jsonl`` (the file notebook 03 reads): canonical encode exact?
recovered exact? confidence, candidates, scorer calls, seconds. Needs the ``generate`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
INPUTS = [DATA / "heldout-t0.7.jsonl", DATA / "heldout-t1.3.jsonl"]
ROWS = DATA / "recover-heldout.jsonl"


def recover_rows(shard: tuple[int, int], out: Path, threads: int) -> None:
    import recon
    from recon.audit.profiles import load_profile
    from recon.samples.records import read_records
    from recon.recovery.recover import recover
    from recon.recovery.scorers import make_scorer

    tok = recon.load_tokenizer("smollm2")
    bound = load_profile("chatml").bind(tok)
    records = [r for path in INPUTS for r in read_records(path).records]
    mine = records[shard[0] :: shard[1]]
    scorer = make_scorer("local", tok, threads=threads)
    with open(out, "w", encoding="utf-8") as f:
        start = time.perf_counter()
        for rec, res in zip(mine, recover(mine, bound, scorer, progress=False)):
            took = time.perf_counter() - start
            row = {"id": res.id, "dataset": res.dataset, "temperature": rec.meta.get("temperature"),
                   "tokens": len(rec.output_ids), "canonical_exact": res.canonical_exact, "exact": res.exact,
                   "changed": res.changed, "confidence": None if res.confidence is None else round(res.confidence, 6),
                   "candidates": res.n_candidates, "choices": len(res.choices), "calls": res.passes,
                   "seconds": round(took, 2), "error": res.error}
            f.write(json.dumps(row) + "\n")
            f.flush()
            start = time.perf_counter()


def report(paths: list[Path]) -> None:
    """Merge the shards' rows in input order, mark the non-canonical samples (same bytes as the
    canonical encode, other ids: the audit's non_canonical_bpe), write ROWS, print the table."""
    import pandas as pd

    import recon
    from recon.samples.records import read_records
    from recon.recovery.recover import recovery_table

    tok = recon.load_tokenizer("smollm2")
    found = {(r["dataset"], r["id"]): r for p in paths for r in map(json.loads, p.read_text().splitlines())}
    rows = []
    for path in INPUTS:
        for rec in read_records(path).records:
            row = found.get((rec.dataset, rec.id))
            if row is None:
                continue
            canonical = tok.encode(rec.response.content) + ([rec.output_ids[-1]] if rec.response.finish_reason == "stop" else [])
            if "\ufffd" in (rec.response.content or ""):
                row["confidence"] = 0.0  # as recon.recovery.recover.recover sets it: bytes were lost
            row["non_canonical"] = not row["canonical_exact"] and tok.ids_bytes(canonical) == tok.ids_bytes(rec.output_ids)
            rows.append(row)
    frame = pd.DataFrame(rows)
    with open(ROWS, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(recovery_table(frame).to_string())
    print(f"\nrows: {ROWS.relative_to(ROOT)} ({len(frame)} samples; recovery took {frame.seconds.sum() / 60:.1f} "
          f"CPU-minutes, median {frame.seconds.median():.1f} s a sample, {frame.calls.median():.0f} scorer calls)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th sample from the i-th")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--report", action="store_true", help="only merge the shards' rows and report")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    i, n = map(int, args.shard.split("/"))
    part = DATA / f".recover-shard-{i}-of-{n}.jsonl"
    if not args.report:
        recover_rows((i, n), part, args.threads)
        if n > 1:
            print(f"wrote {part}; run --report when every shard is done")
            return
    parts = sorted(DATA.glob(".recover-shard-*.jsonl"))
    if not parts and ROWS.is_file():  # no fresh shards: report from the bundled rows
        from recon.recovery.recover import recovery_table
        import pandas as pd

        frame = pd.read_json(ROWS, lines=True)
        print(recovery_table(frame).to_string())
        print(f"\nrows: {ROWS.relative_to(ROOT)} (bundled; run without --report to recover again)")
        return
    if not parts:
        sys.exit("no shard rows in data/; run without --report first")
    report(parts)


if __name__ == "__main__":
    main()
