"""``recon report``: the main job: notebooks executed into reports/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recon.errors import ReconError


def cmd_report(args: argparse.Namespace) -> int:
    from recon.notebook.report import MissingVariable, engine_down, load_params, run_params

    explicit = bool(args.params)
    paths = [Path(p) for p in args.params] or sorted(Path("params").glob("*.yaml"))
    if not paths:
        raise ReconError("no params files given and none in ./params (run from the repository root)")
    failed = 0
    for path in paths:
        try:
            params = load_params(path)
        except MissingVariable as e:
            if explicit:
                raise
            print(f"skipped {path}: {str(e).split(': ', 1)[1]}")
            continue
        down = engine_down(params.engine) if params.engine else None
        if down:
            if explicit:
                raise ReconError(f"{path}: {down}; start one first (recon engine start)")
            print(f"skipped {path}: {down} (start one: recon engine start)")
            continue
        for r in run_params(params, notebooks_dir=Path(args.notebooks), out_dir=Path(args.out), html=not args.no_html):
            status = "FAILED" if r.error else "ok"
            print(f"{status:6} {r.output}" + (f"  ({r.error.splitlines()[0][:200]})" if r.error else ""))
            failed += bool(r.error)
    if failed:
        print(f"{failed} notebook run(s) failed; the executed notebooks show where", file=sys.stderr)
        return 1
    return 0


def add_report(sub) -> None:
    p = sub.add_parser("report", help="execute the notebooks for params files into reports/")
    p.add_argument("params", nargs="*", help="params files (default: params/*.yaml)")
    p.add_argument("--notebooks", default="notebooks", help="notebook folder (default notebooks)")
    p.add_argument("--out", default="reports", help="output folder (default reports)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML copies")
    p.set_defaults(func=cmd_report)
