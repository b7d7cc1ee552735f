"""How well `recon recover` gets back the sampled ids, on real held-out SmolLM2 samples.

    python benchmarks/recover_accuracy.py                      # recover every sample, then report
    python benchmarks/recover_accuracy.py --shard 0/2 &        # or in parallel shards ...
    python benchmarks/recover_accuracy.py --shard 1/2
    python benchmarks/recover_accuracy.py --report             # ... and report from their rows, merged
                                                               # (no shards waiting: from the rows file)
    python benchmarks/recover_accuracy.py --limit 4 --out /tmp/rows.jsonl   # a quick look: the first 4 of each file
    python benchmarks/recover_accuracy.py --inputs mine.jsonl --out /tmp/rows.jsonl  # your own samples (tuning)

A shard writes its rows to a hidden file beside ``--out`` (``.<stem>-shard-i-of-n.jsonl``);
``--report`` merges the waiting shards into ``--out`` and deletes them, so a later run never
merges them again.

Every failure is classified: a *search error* when the sampled ids score higher than the returned
ones under the sampling distribution (the record's temperature, and top-p/top-k/min-p where its
meta says; what the search maximizes), else a *model error* (the model prefers what was
returned: no search can fix it); *hidden* when the sampled ids hold a special token the text does
not show (the server skipped it in decoding: no cut of the text is the sampled ids); *truncated*
when the sampled ids hold a token recon's sampler removes even with its slack (the sampling
engine's numbers kept it: the two engines disagree at the cut by more than the slack). Calibration: of the samples at confidence >= 0.9, the share exact.

Input: ``data/heldout-t0.7.jsonl`` and ``data/heldout-t1.3.jsonl`` (made by ``recon generate``
with seed 11, not the bundled seed-0 samples; see data/README.md). The held-out samples drawn
with truncation (top-p 0.9 at t=1.0, min-p 0.05 at t=1.4; seeds 12 and 13, made after the search
was last changed and never tuned on) go through the same script:

    python benchmarks/recover_accuracy.py --inputs data/heldout-t1.0-p0.9.jsonl data/heldout-t1.4-m0.05.jsonl \
        --out data/recover-heldout-truncated.jsonl --shard 0/2 &      # and 1/2, then --report with the same --inputs/--out

and so do the ones llama.cpp drew (``benchmarks/llamacpp_heldout.py``; recovered with slack at the
cut for its numerics, recon.recovery.sampling):

    python benchmarks/recover_accuracy.py --inputs data/heldout-llamacpp-t0.7-p0.95.jsonl \
        data/heldout-llamacpp-t0.8-default.jsonl data/heldout-llamacpp-t1.4-m0.05.jsonl \
        --out data/recover-heldout-llamacpp.jsonl --shard 0/2 &       # and 1/2, then --report
 Only the API view is used
(response text + prompt ids); the ground-truth ids only judge the result. One row per sample
goes to ``data/recover-heldout.jsonl`` (the file notebook 03 reads): canonical encode exact?
recovered exact? confidence, candidates, scorer calls, model positions and forward passes (the
scorer's own counters, :func:`recon.recovery.scorers.spent`), seconds. Needs the ``generate`` extra.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
INPUTS = [DATA / "heldout-t0.7.jsonl", DATA / "heldout-t1.3.jsonl"]
ROWS = DATA / "recover-heldout.jsonl"


def load(inputs: list[Path], limit: int | None):
    from recon.samples.records import read_records

    return [r for path in inputs for r in read_records(path).records[:limit]]


def recover_rows(shard: tuple[int, int], out: Path, threads: int, inputs: list[Path], limit: int | None,
                 slack: float | None = None, method: str = "beam") -> None:
    import recon
    from recon.audit.profiles import load_profile
    from recon.recovery.recover import recover, sampling_of, search_failed
    from recon.recovery.scorers import make_scorer
    from recon.recovery.search import score_ids

    tok = recon.load_tokenizer("smollm2")
    bound = load_profile("chatml").bind(tok)
    records = load(inputs, limit)
    mine = records[shard[0] :: shard[1]]
    scorer = make_scorer("local", tok, threads=threads)
    fixed = {t.id for t in tok.added_tokens}
    with open(out, "w", encoding="utf-8") as f:
        start = time.perf_counter()
        for rec, res in zip(mine, recover(mine, bound, scorer, progress=False, slack=slack, method=method)):
            took = time.perf_counter() - start
            row = {"id": res.id, "dataset": res.dataset, "temperature": rec.meta.get("temperature"),
                   "tokens": len(rec.output_ids), "canonical_exact": res.canonical_exact, "exact": bool(res.exact),
                   "changed": res.changed, "confidence": None if res.confidence is None else round(res.confidence, 6),
                   "candidates": res.n_candidates, "choices": len(res.choices), "calls": res.passes,
                   "positions": res.positions, "forward_passes": res.cost.get("passes_run"),
                   "seconds": round(took, 2), "error": res.error, "failure": "error" if res.error else None}
            if res.ids is not None and not res.exact:  # judged by the score the search maximizes
                sampling = sampling_of(rec, scorer, slack=slack)
                try:
                    got = score_ids(rec.prompt_ids, res.ids, scorer, sampling)
                    sampled = score_ids(rec.prompt_ids, rec.output_ids, scorer, sampling)
                    # a special token the text does not show (skipped in decoding): outside every cut of the text
                    hidden = [i for i in rec.output_ids if i in fixed] != [i for i in res.canonical if i in fixed]
                    row.update(returned_score=round(got, 4), sampled_score=round(sampled, 4) if sampled > -math.inf else None,
                               returned_ids=res.ids, failure="hidden" if hidden else "truncated" if sampled == -math.inf
                               else "search" if sampled > got + 1e-4 else "model")
                except Exception as exc:  # judging one record failed: it says so, the rest go on
                    row.update(error=search_failed(rec.id, exc, "scoring its ids"), failure="error")
            if row["error"]:
                print(f"{row['error']}", file=sys.stderr, flush=True)
            f.write(json.dumps(row) + "\n")
            f.flush()
            start = time.perf_counter()


def report(paths: list[Path], inputs: list[Path], rows_out: Path, as_markdown: bool = False) -> None:
    """Merge the shards' rows in input order, mark the non-canonical samples (same bytes as the
    canonical encode, other ids: the audit's non_canonical_bpe), write ROWS, print the table."""
    import pandas as pd

    import recon
    from recon.samples.records import read_records
    from recon.recovery.recover import recovery_table

    tok = recon.load_tokenizer("smollm2")
    found = {(r["dataset"], r["id"]): r for p in paths for r in map(json.loads, p.read_text().splitlines())}
    rows = []
    for path in inputs:
        for rec in read_records(path).records:
            row = found.get((rec.dataset, rec.id))
            if row is None:
                continue
            canonical = tok.encode(rec.response.content) + ([rec.output_ids[-1]] if rec.response.finish_reason == "stop" else [])
            row["non_canonical"] = not row["canonical_exact"] and tok.ids_bytes(canonical) == tok.ids_bytes(rec.output_ids)
            rows.append(row)
    frame = pd.DataFrame(rows)
    with open(rows_out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    if as_markdown:
        print(markdown(frame))
        return
    print(recovery_table(frame).to_string())
    print_failures(frame)
    print_cost(frame)
    print(f"\nrows: {rows_out} ({len(frame)} samples; recovery took {frame.seconds.sum() / 60:.1f} "
          f"CPU-minutes, median {frame.seconds.median():.1f} s a sample, {frame.calls.median():.0f} scorer calls)")


def markdown(frame) -> str:
    """The two tables docs/benchmarks.md shows (per dataset; per temperature among the samples whose
    canonical encode is wrong) and a line of calibration and cost, all from the rows."""
    from recon.recovery.recover import recovery_table

    table = recovery_table(frame)
    out = ["| dataset | samples | canonical encode wrong | non-canonical | recovered exactly | exact made wrong | exact before → after |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in table.iterrows():
        r = {k: (int(v) if float(v).is_integer() else v) for k, v in r.items()}
        before = 100 * (1 - r["canonical wrong"] / r["samples"])
        out.append(f"| {name} | {r['samples']} | {r['canonical wrong']} ({r['canonical wrong %']:.1f}%) | {r['non-canonical']} | "
                   f"{r['recovered exactly']} ({r['recovered %']:.1f}%) | {r['exact made wrong']} | {before:.1f}% → {r['exact after %']:.1f}% |")
    out += ["", "| temperature | canonical wrong | recovered | search errors | model errors | hidden | truncated |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    wrong = frame[~frame["canonical_exact"]]
    for t, g in sorted(wrong.groupby("temperature"), key=lambda kv: kv[0]):
        kinds = [int((g["failure"] == k).sum()) for k in ("search", "model", "hidden", "truncated")]
        out.append(f"| {t:g} | {len(g)} | {int(g['exact'].sum())} | " + " | ".join(map(str, kinds)) + " |")
    sure = frame[frame["confidence"] >= 0.9]
    medians = "; ".join(f"t={t:g}: {g.seconds.median():.2f} s and {g.calls.median():.0f} scorer calls"
                        for t, g in sorted(frame.groupby("temperature"), key=lambda kv: kv[0]))
    failed = int((frame["failure"] == "error").sum())
    out += ["", f"At confidence ≥ 0.9: {len(sure)} samples, {int(sure['exact'].sum())} exact. Searches that raised: {failed}. "
            f"Recovery took {frame.seconds.sum() / 60:.1f} CPU-minutes (the rows' `seconds`, one search at a time, "
            f"one torch thread); the median sample, {medians}."]
    return "\n".join(out)


def print_failures(frame) -> None:
    """Per temperature: recovered / search errors / model errors among the samples whose canonical
    encode is wrong, and the calibration line."""
    wrong = frame[~frame["canonical_exact"]]
    failure = frame["failure"] if "failure" in frame else None
    print("\ntemperature  canonical wrong  recovered  search errors  model errors  hidden  truncated  failed  median s  total s  median calls")
    for t, g in sorted(wrong.groupby("temperature"), key=lambda kv: kv[0]):
        kinds = g["failure"] if failure is not None else None
        search, model, hidden, cut, failed = (int((kinds == k).sum()) if kinds is not None else "?"
                                              for k in ("search", "model", "hidden", "truncated", "error"))
        every = frame[frame["temperature"] == t]  # time and calls over every sample at t, exact ones too
        print(f"{t:>11g}  {len(g):>15}  {int(g['exact'].sum()):>9}  {search!s:>13}  {model!s:>12}  {hidden!s:>6}  {cut!s:>9}  {failed!s:>6}  "
              f"{every.seconds.median():>8.2f}  {every.seconds.sum():>7.0f}  {every.calls.median():>12.0f}")
    if failure is not None:
        broken = frame[frame["canonical_exact"] & ~frame["exact"]]
        print(f"exact samples made wrong: {len(broken)} (search errors among them {int((broken['failure'] == 'search').sum())}, "
              f"failed {int((broken['failure'] == 'error').sum())})")
    sure = frame[frame["confidence"] >= 0.9]
    share = f"{sure['exact'].mean():.1%}" if len(sure) else "n/a"
    print(f"calibration: {len(sure)} samples at confidence >= 0.9, {int(sure['exact'].sum())} exact ({share}); "
          f"mean confidence {frame['confidence'].mean():.3f} vs exact share {frame['exact'].mean():.3f}")


def print_cost(frame) -> None:
    """Per file: model positions scored per sampled token (the median over its samples: issue 37's
    measure) and forward passes per sample, from the rows' counters (rows made before they were
    counted have none)."""
    if "positions" not in frame or frame["positions"].isna().all():
        print("\ncost: these rows carry no positions (made before recovery counted them; recover again)")
        return
    print("\ndataset                          positions/token (median, max)   forward passes (median, max)   scorer calls (median, max)")
    for name, g in frame.groupby("dataset", sort=True):
        per = g["positions"] / g["tokens"]
        print(f"{name:<32} {per.median():>14.1f} {per.max():>8.1f}   {g['forward_passes'].median():>18.0f} {g['forward_passes'].max():>6.0f}"
              f"   {g['calls'].median():>16.0f} {g['calls'].max():>6.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th sample from the i-th")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--report", action="store_true", help="only merge the shards' rows and report")
    ap.add_argument("--limit", type=int, help="only the first N samples of each input file (a quick run)")
    ap.add_argument("--inputs", nargs="+", type=Path, help="sample files (default: the held-out files)")
    ap.add_argument("--truncation-slack", type=float, metavar="NATS",
                    help="slack at the sampler's cut for every record, as recon recover's (default: by the record; "
                         "0 shows what the llama.cpp samples did before the cut had slack)")
    ap.add_argument("--search", default="beam", choices=["beam", "lazy"], help="the search recon recover --search runs")
    ap.add_argument("--out", type=Path, help=f"rows file (default {ROWS.relative_to(ROOT)}, the bundled rows)")
    ap.add_argument("--markdown", action="store_true",
                    help="with --report: print only the tables of docs/benchmarks.md (benchmarks/docs.py)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    inputs, rows_out = args.inputs or INPUTS, args.out or ROWS
    i, n = map(int, args.shard.split("/"))
    part = shard_path(rows_out, i, n)
    if not args.report:
        recover_rows((i, n), part, args.threads, inputs, args.limit, args.truncation_slack, args.search)
        if n > 1:
            print(f"wrote {part}; run --report when every shard is done")
            return
    parts = [part] if not args.report else shards_of(rows_out)
    if not parts and rows_out.is_file():  # no shards waiting: report from the rows as they are (the bundled ones)
        from recon.recovery.recover import recovery_table
        import pandas as pd

        frame = pd.read_json(rows_out, lines=True)
        if args.markdown:
            print(markdown(frame))
            return
        print(recovery_table(frame).to_string())
        print_failures(frame)
        print_cost(frame)
        print(f"\nrows: {rows_out} (no shard rows waiting beside it: the rows as they are; run without --report "
              "to recover again)")
        return
    if not parts:
        sys.exit(f"no shard rows beside {rows_out}; run without --report first")
    report(parts, inputs, rows_out, args.markdown)
    for path in parts:  # merged into rows_out: a later run must not merge them again
        path.unlink()


def shard_path(rows_out: Path, i: int, n: int) -> Path:
    """Shard i of n's rows, a hidden file beside the rows file they are merged into."""
    return rows_out.parent / f".{rows_out.stem}-shard-{i}-of-{n}.jsonl"


def shards_of(rows_out: Path) -> list[Path]:
    """The shard files waiting beside ``rows_out``, all of one split (else an error naming them)."""
    parts = sorted(rows_out.parent.glob(f".{rows_out.stem}-shard-*-of-*.jsonl"))
    splits = {p.name.rsplit("-of-", 1)[1] for p in parts}
    if len(splits) > 1:
        sys.exit(f"shard files of different splits beside {rows_out}: {', '.join(p.name for p in parts)}; "
                 "delete the stale ones")
    return parts


if __name__ == "__main__":
    main()
