"""The prefix audit at scale: what linking trajectories adds to `recon audit`, and its memory.

Writes N trajectories of K turns (SmolLM2's ChatML, engine prompt ids, no messages) in three
scripts per the project's benchmark data: ``ascii`` (slices of the standard library's code and
licence texts, benchmarks/cold_data.py), ``mixed`` (the same with runs of other scripts in one
slice in three) and ``cjk`` (the CJK gettext catalogs, benchmarks/cjk_data.py); one turn in three
of each script in turn. Turn k's prompt is turn k-1's prompt + output + the next user block, as an
engine renders it; in one trajectory in seven one output is sampled in a non-canonical split (the next prompt holds
the canonical encoding of the same text, so that boundary breaks: ``retokenized``).

Files, all with the same records: ``linked`` (``conversation`` and ``turn``, each trajectory's
turns together), ``plain`` (the same without them: nothing to link, no prefix audit) and
``interleaved`` (linked, but turn-major: every trajectory open at once).

Timed in turn, --repeat times, the fastest kept: `recon audit FILE --tokenizer smollm2 --profile
chatml --json` as a whole process, each file; ratio linked / plain (target <= 1.3). Peak memory
(GNU time's %M, /usr/bin/time) of one process (--workers 1: it holds the open trajectories): the plain file, the
linked file at 1/5 of N and at N trajectories (bounded: ratio near 1), the interleaved file (every
trajectory open at once), and that again with a budget of 1M ids ($RECON_PREFIX_MEMORY_IDS), the
rest spilled to a scratch file.

    python benchmarks/conversations_scale.py --trajectories 10000 --turns 10      # 100,000 generations
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cold_data import MIXED_ONE, ODD_ONE, mixed_in, slices, splits  # noqa: E402
from cjk_data import texts as cjk_texts  # noqa: E402

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def _pieces():
    """(user, reply) texts, cycling ascii, mixed, cjk."""
    ascii_, cjk, rng, k = slices(), cjk_texts(), random.Random(3), 0
    cjk_pool: list[str] = []
    while True:
        kind = k % 3
        if kind == 2:
            text = next(cjk, None)
            if text is None:  # the catalogs ran out: reuse them, cut elsewhere
                text = cjk_pool[k % len(cjk_pool)][k % 37:]
            else:
                cjk_pool.append(text)
            yield text[:30], text[30:130]
        else:
            text = next(ascii_)
            if kind == 1:
                text = mixed_in(text, 0, rng) if k % (2 * MIXED_ONE) else text
            yield text[:80], text[80:320]
        k += 1


def write(paths: dict, n: int, turns: int, seed: int = 5) -> int:
    from recon import load_tokenizer

    tok = load_tokenizer("smollm2")
    end = tok.piece_to_id("<|im_end|>")
    rng, cache, pieces = random.Random(seed), {}, _pieces()
    files = {name: open(path, "w") for name, path in paths.items()}
    open_turns: list[list[str]] = [[] for _ in range(turns)]  # interleaved: turn-major, written at the end
    total = 0
    for c in range(n):
        talk = [next(pieces) for _ in range(turns)]
        blocks = tok.encode_batch([f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n" for u, _ in talk],
                                  allow_special=True)
        replies = tok.encode_batch([r for _, r in talk])
        prompt = tok.encode(SYSTEM, allow_special=True) + blocks[0]
        odd = rng.randrange(turns) if c % ODD_ONE == 0 else -1  # one trajectory in seven: one turn sampled non-canonically
        for k in range(turns):
            out = list(replies[k])
            if k == odd:
                spots = [i for i, t in enumerate(out) if splits(tok, t, cache)]
                if spots:
                    i = rng.choice(spots)
                    out[i:i + 1] = rng.choice(splits(tok, out[i], cache))
            record = {"id": f"t{c}-{k}", "prompt_ids": prompt, "output_ids": out + [end]}
            linked = json.dumps({**record, "conversation": f"t{c}", "turn": k}, separators=(",", ":")) + "\n"
            files["linked"].write(linked)
            files["plain"].write(json.dumps(record, separators=(",", ":")) + "\n")
            if "interleaved" in files:
                open_turns[k].append(linked)
            total += 1
            if k + 1 < turns:
                prompt = prompt + list(replies[k]) + [end] + tok.encode("\n", allow_special=True) + blocks[k + 1]
    if "interleaved" in files:
        for lines in open_turns:
            files["interleaved"].writelines(lines)
    for f in files.values():
        f.close()
    return total


def run(path: Path, workers: int | None, env: dict | None = None) -> tuple[float, float, dict]:
    """One whole `recon audit` process: seconds, peak memory (MB), its summary. The peak comes from
    GNU time (``%M``: the process and the children it waited for); a child forked from this big
    process directly would report this process's size, which the fork copied, as its own."""
    cmd = [sys.executable, "-m", "recon.cli", "audit", str(path), "--tokenizer", "smollm2", "--profile", "chatml", "--json"]
    if workers:
        cmd += ["--workers", str(workers)]
    with tempfile.NamedTemporaryFile(prefix="recon-peak-") as peak:
        started = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak.name, *cmd], capture_output=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})})
        seconds = time.perf_counter() - started
        assert done.returncode == 0, f"recon audit {path} failed: {done.stderr[-500:]}"
        kb = float(Path(peak.name).read_text().split()[-1])
    return seconds, kb / 1024, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="recon-conv-") as tmp:
        tmp = Path(tmp)
        paths = {name: tmp / f"{name}.jsonl" for name in ("linked", "plain", "interleaved")}
        t0 = time.perf_counter()
        total = write(paths, args.trajectories, args.turns)
        small = {"linked": tmp / "small-linked.jsonl", "plain": tmp / "small-plain.jsonl"}
        write(small, max(1, args.trajectories // 5), args.turns)
        size = paths["linked"].stat().st_size / 1e6
        print(f"{total} generations in {args.trajectories} trajectories of {args.turns} turns ({size:.0f} MB); "
              f"written in {time.perf_counter() - t0:.0f} s")
        best: dict[str, tuple] = {}
        for _ in range(args.repeat):
            for name in ("plain", "linked"):
                got = run(paths[name], args.workers)
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
        c = best["linked"][2]["conversations"]
        assert "conversations" not in best["plain"][2] and best["plain"][2]["samples"] == total
        print(f"recon audit, plain (no links): {best['plain'][0]:.1f} s; linked: {best['linked'][0]:.1f} s; "
              f"linked / plain = {best['linked'][0] / best['plain'][0]:.2f} (target <= 1.3)")
        print(f"boundaries {c['boundaries']}, prefix kept {c['prefix_kept']}, broken {c['prefix_broken']} {c['by_cause']}; "
              f"trajectories {c['trajectories']}: {c['whole']} whole, {c['cut']} cut")
        # memory: one process (--workers 1), so the peak is the process that holds the open trajectories
        peaks = {name: run(path, 1) for name, path in (
            ("small plain", small["plain"]), ("small", small["linked"]), ("plain", paths["plain"]),
            ("linked", paths["linked"]), ("interleaved", paths["interleaved"]))}
        tight = run(paths["interleaved"], 1, {"RECON_PREFIX_MEMORY_IDS": "1000000"})
        for name, got in (*peaks.items(), ("tight", tight)):
            assert "plain" in name or name == "small" or got[2]["conversations"] == c, f"{name}: other boundaries"
        mb = {name: got[1] for name, got in peaks.items()}
        print(f"peak memory, one process, at {args.trajectories // 5} and {args.trajectories} trajectories: plain (no "
              f"prefix audit) {mb['small plain']:.0f} and {mb['plain']:.0f} MB; linked, turns together "
              f"{mb['small']:.0f} and {mb['linked']:.0f} MB: the prefix audit's share {mb['small'] - mb['small plain']:+.0f} "
              f"and {mb['linked'] - mb['plain']:+.0f} MB")
        print(f"interleaved (every trajectory open at once): peak {mb['interleaved']:.0f} MB "
              f"({mb['interleaved'] - mb['linked']:+.0f} MB against turns together), {peaks['interleaved'][0]:.1f} s "
              f"against {peaks['linked'][0]:.1f} s; with a budget of 1M ids (4 MB, the rest spilled to a scratch "
              f"file): peak {tight[1]:.0f} MB, {tight[0]:.1f} s")


if __name__ == "__main__":
    main()
