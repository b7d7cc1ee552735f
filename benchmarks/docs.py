"""Recompute the tables of docs/benchmarks.md, one command for all of them.

    python benchmarks/docs.py                      # every section, full size (the speed ones take minutes)
    python benchmarks/docs.py --only recover-heldout --only recover-truncated
    python benchmarks/docs.py --quick              # reduced sizes where a full run is long
    python benchmarks/docs.py --list               # the sections, their commands and rough times

Each section of docs/benchmarks.md sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
This script runs that section's command (a script in benchmarks/ with ``--markdown``, which prints
only the tables), and puts its output between the markers, with a line naming the command that
made it; the prose around the markers is left alone. Every command also runs alone, without this
script: drop ``--markdown`` for the script's usual report.

The recovery tables come from the bundled rows (data/recover-heldout*.jsonl) and are exact; the
speed tables are timings on whatever machine runs this, noisy on shared cores.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"

#: name: (command, the --quick command or None when the full one is quick, rough minutes of the full one on
#: 2 loaded shared cores)
SECTIONS: dict[str, tuple[str, str | None, float]] = {
    "audit-cold": ("benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 20000",
                   "benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 5000 --repeat 1", 2.5),
    "audit-tokenizers": ("benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 20000 --tokenizer all",
                         "benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 5000 --repeat 1 --tokenizer all", 7),
    "audit-scripts": ("benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 20000 --tokenizer all "
                      "--data ascii,mixed,cjk",
                      "benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 5000 --repeat 1 --tokenizer all "
                      "--data ascii,mixed,cjk", 15),
    "audit-memory": ("benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 0 --cold-memory 10000,1000000",
                     "benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 0 --cold-memory 10000,100000", 6),
    "audit-memory-kimi": ("benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 0 --tokenizer kimi "
                          "--cold-memory 10000,1000000",
                          "benchmarks/audit_speed.py --samples 0 --memory-samples '' --cold 0 --tokenizer kimi "
                          "--cold-memory 10000,100000", 6),
    "audit-warm": ("benchmarks/audit_speed.py --cold 0",
                   "benchmarks/audit_speed.py --cold 0 --samples 20000 --memory-samples 10000,100000", 3),
    "audit-steps": ("benchmarks/audit_steps.py", None, 0.3),
    "audit-startup": ("benchmarks/audit_startup.py", None, 1),
    "export-cost": ("benchmarks/export_cost.py", "benchmarks/export_cost.py --records 1000 --repeat 1", 3),
    "recover-heldout": ("benchmarks/recover_accuracy.py --report", None, 0.05),
    "recover-truncated": ("benchmarks/recover_accuracy.py --report --inputs data/heldout-t1.0-p0.9.jsonl "
                          "data/heldout-t1.4-m0.05.jsonl --out data/recover-heldout-truncated.jsonl", None, 0.05),
    "recover-llamacpp": ("benchmarks/recover_accuracy.py --report --inputs data/heldout-llamacpp-t0.7-p0.95.jsonl "
                         "data/heldout-llamacpp-t0.8-default.jsonl data/heldout-llamacpp-t1.4-m0.05.jsonl "
                         "--out data/recover-heldout-llamacpp.jsonl", None, 0.05),
    "recover-fresh": ("benchmarks/recover_accuracy.py --report --inputs data/heldout-llamacpp-t0.7-p0.95-s31.jsonl "
                      "data/heldout-llamacpp-t1.0-s32.jsonl --out data/recover-heldout-llamacpp-fresh.jsonl", None, 0.05),
    "slack-shortfall": ("benchmarks/llamacpp_heldout.py --shortfall data/heldout-llamacpp-t0.7-p0.95.jsonl "
                        "data/heldout-llamacpp-t0.8-default.jsonl data/heldout-llamacpp-t1.4-m0.05.jsonl", None, 9),
    "scorer-cost": ("benchmarks/scorer_cost.py", None, 1),
    "recover-searches": ("benchmarks/recover_search_cost.py --limit 16", "benchmarks/recover_search_cost.py --limit 4", 8),
    "recover-together": ("benchmarks/recover_together.py",
                         "benchmarks/recover_together.py --limit 4 --together 1,4", 8),
}
#: counts over bundled rows: the same on every run and machine (no time in their stamp)
EXACT = {"recover-heldout", "recover-truncated", "recover-llamacpp", "recover-fresh"}
#: scripts that print markdown without being asked (the others take --markdown)
PLAIN = ("llamacpp_heldout.py",)


def command(name: str, quick: bool) -> str:
    full, reduced, _ = SECTIONS[name]
    return reduced if quick and reduced else full


def run(name: str, quick: bool) -> tuple[str, float]:
    """The section's markdown (the command's stdout) and how long it took."""
    cmd = command(name, quick)
    argv = [sys.executable, *shlex.split(cmd)]
    if not any(cmd.split()[0].endswith(p) for p in PLAIN):
        argv.append("--markdown")
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"docs.py: {name}: `python {cmd}` failed (exit {done.returncode})")
    return done.stdout.strip(), took


def replace(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- bench:{re.escape(name)} -->)\n.*?(<!-- /bench:{re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"docs.py: {DOC.relative_to(ROOT)} has no <!-- bench:{name} --> ... <!-- /bench:{name} --> markers")
    return pattern.sub(lambda m: f"{m[1]}\n{body}\n{m[2]}", text, count=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--only", action="append", choices=sorted(SECTIONS), metavar="NAME",
                    help="this section only (repeatable); default: every section")
    ap.add_argument("--quick", action="store_true", help="reduced sizes for the long sections (the doc says so)")
    ap.add_argument("--list", action="store_true", help="list the sections and their commands, run nothing")
    args = ap.parse_args()
    if args.list:
        for name, (full, reduced, minutes) in SECTIONS.items():
            print(f"{name:18} ~{minutes:g} min  python {full}" + (f"\n{'':28}--quick: python {reduced}" if reduced else ""))
        return
    names = args.only or list(SECTIONS)
    for name in names:
        body, took = run(name, args.quick)
        cmd = command(name, args.quick)
        quick = " (the reduced `--quick` size)" if args.quick and SECTIONS[name][1] else ""
        how = "from the bundled rows (the same on every run)" if name in EXACT else f"in {took:.0f} s"
        stamp = f"*Made by `python {cmd}`{quick}, {how}; `python benchmarks/docs.py --only {name}" \
                f"{' --quick' if quick else ''}` runs it again.*"
        text = DOC.read_text(encoding="utf-8")  # read each time: a long run may overlap an edit of the prose
        DOC.write_text(replace(text, name, f"{stamp}\n\n{body}"), encoding="utf-8")
        print(f"{name}: {took:.1f} s", flush=True)


if __name__ == "__main__":
    main()
