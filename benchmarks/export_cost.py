"""What a trainer export costs beside the audit of the same file: `recon export --format speculators`
against `recon audit --json`, whole processes, timed in turn in one run, printed as ratios.

Data (nothing tuned on): per script, N distinct records of real text found on this machine —
``ascii`` (Python standard library sources and licence texts, ``cold_data.py``), ``mixed`` (the
same with runs of other scripts in one record in three) and ``cjk`` (the Chinese, Japanese and
Korean gettext catalogs Debian packages install, ``cjk_data.py``); one record in seven does not
round-trip. Each record gets a one-message request (the first line of its text as the user's
question) and, in the ``engine`` variant, the prompt ids an engine would report (SmolLM2's chat
template rendered and encoded); in the ``rendered`` variant only the messages, so both the audit
(its prompt audit) and the export render every prompt.

    python benchmarks/export_cost.py [--records N] [--repeat R] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cjk_data import cjk_records  # noqa: E402
from cold_data import cold_records  # noqa: E402

TOKENIZER, PROFILE = "smollm2", "chatml"


def write(path: Path, kind: str, n: int, engine: bool) -> int:
    import recon
    from recon.prompts.render import PromptMaker
    from recon.prompts.sources import find_chat_template
    from recon.samples.records import Record

    tok = recon.load_tokenizer(TOKENIZER)
    maker = PromptMaker(tok, find_chat_template(TOKENIZER))
    source = (cjk_records(n) if kind == "cjk" else (r for r, _ in cold_records(n, mixed=kind == "mixed")))
    wrote = 0
    with open(path, "w", encoding="utf-8") as f:
        for rec in source:
            text = tok.decode(rec["output_ids"][:40])
            question = (text.strip().splitlines() or ["?"])[0][:120] or "?"
            rec = {"id": rec["id"], "output_ids": rec["output_ids"], "messages": [{"role": "user", "content": question}]}
            if engine:
                rec["prompt_ids"] = maker.rendered_ids(Record(rec["id"], kind, rec["output_ids"], messages=rec["messages"]))
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            wrote += 1
    return wrote


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000, help="records per file (default 5,000)")
    parser.add_argument("--repeat", type=int, default=2, help="each command timed this many times, in turn; the least counts")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown only")
    args = parser.parse_args()
    recon = [sys.executable, "-m", "recon.cli"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="recon-export-cost-") as tmp:
        for kind in ("ascii", "mixed", "cjk"):
            for variant in ("engine", "rendered"):
                data = Path(tmp) / f"{kind}-{variant}.jsonl"
                n = write(data, kind, args.records, variant == "engine")
                common = ["--tokenizer", TOKENIZER, "--profile", PROFILE]
                audit = [*recon, "audit", str(data), *common, "--json"]
                export = [*recon, "export", str(data), *common, "--format", "speculators", "--out", str(Path(tmp) / "out.jsonl")]
                times = {"audit": [], "export": []}
                for _ in range(args.repeat):
                    times["audit"].append(timed(audit))
                    times["export"].append(timed(export))
                a, e = min(times["audit"]), min(times["export"])
                rows.append({"data": kind, "prompts": variant, "records": n, "audit_s": a, "export_s": e, "ratio": e / a})
    head = "| data | prompts | records | recon audit s | recon export s | export / audit |\n|---|---|---:|---:|---:|---:|"
    lines = [f"| {r['data']} | {r['prompts']} | {r['records']} | {r['audit_s']:.2f} | {r['export_s']:.2f} | **{r['ratio']:.2f}** |"
             for r in rows]
    if not args.markdown:
        print(f"export --format speculators against audit --json, {TOKENIZER}, least of {args.repeat} runs each "
              f"(2 shared cores: noisy)")
    print("\n".join([head, *lines]))


if __name__ == "__main__":
    main()
