"""What `recon audit` pays before its first record, part by part, per tokenizer (docs/benchmarks.md).

The audit's speed target is set against the tokenizer's own floor, which loads the tokenizer
untimed; the whole `recon audit` process pays for it. On CJK-heavy text the floor is cheap (few
tokens for many bytes), so this fixed cost is most of the budget. This script says what it is
made of, so that what is left, and why, is measured rather than asserted (issue 36, goal 3).

For each tokenizer, in fresh processes (the fastest of --repeat runs of each kept):

- *one-record process*: `recon audit FILE --json` on a one-record file, launch to exit, as
  ``audit_speed.py`` measures its start-up;
- *Python*: ``python -c pass`` (the interpreter and its site packages);
- then, in one process, in the order the audit pays them: *numpy, orjson* (imported by recon's
  tables and reader), *recon's modules* (what the audit command imports), *recon's loader*
  (reading the ranks file or ``tokenizer.json`` and its config, and what recon makes of them),
  the *native core* (tiktoken's ``Encoding`` or a ``tokenizers.Tokenizer`` built from them: the
  floor pays this too, untimed) and *recon's tables* (the canonical check's, the word cache's,
  the boundary rules', built once before the workers fork);
- *the rest*: one-record process minus the parts (reading the file, the one record, the worker
  pool, exit).

By default it also writes the CJK-heavy records of ``cjk_data.py`` for each
tokenizer and times that tokenizer's floor on them (``cold_data.py floor``), to set the start-up
against the 0.5x budget on that data (``--no-floor`` skips it).

    python benchmarks/audit_startup.py                     # every tokenizer, with the CJK budget
    python benchmarks/audit_startup.py --tokenizer kimi --no-floor
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_speed import TOKENIZERS, audit_process, tokenizer_spec, write_data  # noqa: E402

#: the parts timed inside one process, in the order the audit pays them
PARTS = ("numpy, orjson", "recon's modules", "recon's loader", "native core", "recon's tables")

#: run in a fresh interpreter: times the parts and prints them as JSON
CHILD = r"""
import json, sys, time
spec, profile = sys.argv[1], sys.argv[2]
clock = time.perf_counter
spent = {}
t = clock()
import numpy, orjson
spent["numpy, orjson"] = clock() - t
t = clock()
import recon.cli.audit, recon.audit.engine, recon.prompts.sources, recon.tokenizers.load
spent["recon's modules"] = clock() - t
import tiktoken, tokenizers
core, loaded = [0.0], [0.0]
def clocked(inner, into=core):
    def timed(*a, **k):
        t = clock()
        try:
            return inner(*a, **k)
        finally:
            into[0] += clock() - t
    return timed
tiktoken.Encoding.__init__ = clocked(tiktoken.Encoding.__init__)
class Tokenizer:  # the native class can't take new attributes: recon's loader finds this one instead
    from_file = staticmethod(clocked(tokenizers.Tokenizer.from_file))
    from_str = staticmethod(clocked(tokenizers.Tokenizer.from_str))
    from_buffer = staticmethod(clocked(tokenizers.Tokenizer.from_buffer))
    def __new__(cls, *a, _real=clocked(tokenizers.Tokenizer), **k):
        return _real(*a, **k)
tokenizers.Tokenizer = Tokenizer
recon.tokenizers.load.load_tokenizer = clocked(recon.tokenizers.load.load_tokenizer, loaded)
t = clock()
recon.audit.engine._bound(spec, None, profile, "fast")
bound = clock() - t
spent["recon's loader"] = loaded[0] - core[0]
spent["native core"] = core[0]
spent["recon's tables"] = bound - loaded[0]
print(json.dumps(spent))
"""


def python_alone() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def parts(spec: tuple[str, str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", CHILD, *spec], cwd=ROOT, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"audit_startup.py: timing the parts failed for {spec[0]}: {run.stderr.strip().splitlines()[-1]}")
    spent = json.loads(run.stdout)
    spent["total"] = sum(spent.values())
    return spent


def measure(name: str, repeat: int, with_floor: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = tokenizer_spec(name, Path(tmp))
        data = Path(tmp) / "cjk.jsonl"
        write_data(data, 20_000, spec[0], "cjk", 3)
        one = Path(tmp) / "one.jsonl"
        with open(data) as src:
            one.write_text(src.readline())
        whole = min(audit_process(one, memory=False, tokenizer=spec)[1] for _ in range(repeat))
        python = min(python_alone() for _ in range(repeat))
        inside = min((parts(spec) for _ in range(repeat)), key=lambda spent: spent["total"])
        floor = None
        if with_floor:
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
            floor = min(json.loads(subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "cold_data.py"), "floor", str(data), spec[0]],
                cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout)["seconds"] for _ in range(repeat))
    rest = whole - python - inside["total"]
    return {"tokenizer": name, "whole": whole, "python": python, **{p: inside[p] for p in PARTS}, "rest": rest,
            "floor": floor}


def table(rows: list[dict]) -> str:
    head = ["tokenizer", "one-record process s", "Python", *PARTS, "the rest"]
    floors = any(r["floor"] is not None for r in rows)
    if floors:
        head += ["CJK floor s", "start-up / (0.5 × floor)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [r["tokenizer"], f"{r['whole']:.2f}", f"{r['python']:.3f}", *(f"{r[p]:.3f}" for p in PARTS),
                 f"{r['rest']:.3f}"]
        if floors:
            cells += [f"{r['floor']:.2f}", f"**{r['whole'] / (0.5 * r['floor']):.2f}**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="all", choices=sorted(TOKENIZERS) + ["all"])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the fastest is kept")
    ap.add_argument("--no-floor", dest="floor", action="store_false", help="skip the CJK data and its floor")
    ap.add_argument("--markdown", action="store_true", help="print only the table of docs/benchmarks.md")
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "recon")], check=True)  # as pip leaves them
    names = list(TOKENIZERS) if args.tokenizer == "all" else [args.tokenizer]
    rows = [measure(name, args.repeat, args.floor) for name in names]
    if not args.markdown:
        print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; seconds, "
              f"the fastest of {args.repeat}")
    else:
        print(f"*{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; seconds, the fastest "
              f"of {args.repeat} runs each.*\n")
    print(table(rows))


if __name__ == "__main__":
    main()
