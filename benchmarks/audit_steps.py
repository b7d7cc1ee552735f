"""Where a cold audit chunk's time goes, step by step, in one process (docs/benchmarks.md).

Writes N cold mixed-script records for a tokenizer (benchmarks/cold_data.py, as audit_speed.py's
cold rows do), loads the tokenizer and profile as `recon audit` does, audits the first chunk to
warm up, then times the next chunks with a clock around each step (steps nest: `canonical`
holds `learn`, which holds `glued`; `audit_chunk` holds all but `parse`). Prints milliseconds
per 1,000-record chunk and each step's share of the chunk.

    python benchmarks/audit_steps.py                        # kimi, 10 chunks of 1,000
    python benchmarks/audit_steps.py --tokenizer qwen3.6 --chunks 6
    python benchmarks/audit_steps.py --data cjk              # CJK-heavy records (benchmarks/cjk_data.py)
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_speed import TOKENIZERS, tokenizer_spec, write_data  # noqa: E402

#: (module, owner inside it or None, function, step name)
STEPS = [
    ("recon.audit.engine", "RawChunk", "parse", "parse"),
    ("recon.audit.engine", None, "audit_chunk", "audit_chunk"),
    ("recon.tokenizers.fast.canonical", "CanonicalCheck", "encode", "canonical"),
    ("recon.tokenizers.fast.canonical", "CanonicalCheck", "_learn", "learn"),
    ("recon.tokenizers.fast.glue", "GluedEncoder", "_glued", "glued"),
    ("recon.tokenizers.fast.canonical", "CanonicalCheck", "_added_where_held", "added tokens"),
    ("recon.audit.profiles", "BoundProfile", "server_texts", "decode"),
    ("recon.audit.profiles", "BoundProfile", "parse_text", "parse_text"),
    ("recon.audit.profiles", "BoundProfile", "render", "render"),
    ("recon.audit.compare", None, "compare", "compare"),
]


def timed_steps(spent: collections.Counter) -> None:
    """Wrap each step of :data:`STEPS` so that its time adds up in ``spent``."""
    for module, owner, name, step in STEPS:
        where = importlib.import_module(module)
        where = getattr(where, owner) if owner else where
        inner = getattr(where, name)

        def clocked(*args, _inner=inner, _step=step, **kw):
            start = time.perf_counter()
            try:
                return _inner(*args, **kw)
            finally:
                spent[_step] += time.perf_counter() - start

        setattr(where, name, clocked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default="kimi", choices=sorted(TOKENIZERS))
    parser.add_argument("--chunks", type=int, default=10, help="chunks of 1,000 records timed (after one to warm up)")
    parser.add_argument("--data", default="mixed", choices=["ascii", "mixed", "cjk"],
                        help="the cold data (as benchmarks/audit_speed.py --data)")
    parser.add_argument("--markdown", action="store_true", help="print the table of docs/benchmarks.md instead")
    args = parser.parse_args()
    from recon.audit import engine

    with tempfile.TemporaryDirectory() as tmp:
        spec = tokenizer_spec(args.tokenizer, Path(tmp))
        path = Path(tmp) / "cold.jsonl"
        write_data(path, 1000 * (args.chunks + 1), spec[0], args.data, 3)
        bound = engine._bound(spec[0], None, spec[1], "fast")
        chunks = list(engine.iter_raw_chunks([path], 1000, vocab_size=bound.tok.vocab_size))
        work = (spec[0], None, spec[1], "auto", "auto", None, "fast", None)  # (no prompts audited)
        gc.freeze()  # as the audit's forked workers start
        engine.audit_chunk_counted(work, None, chunks[0])  # warm up: the first chunk learns the most
        spent: collections.Counter = collections.Counter()
        timed_steps(spent)
        start = time.perf_counter()
        for chunk in chunks[1:]:
            engine.audit_chunk_counted(work, None, chunk)
        total = time.perf_counter() - start
    n = len(chunks) - 1
    if args.markdown:
        print(f"{args.tokenizer}: {n} cold {args.data} chunks of 1,000 records after one to warm up, one process; "
              f"a chunk took {1000 * total / n:.1f} ms. Steps nest (`canonical` holds `learn`, which holds `glued`; "
              "`audit_chunk` holds all but `parse`).\n")
        print("| step | ms a chunk | share of the chunk |\n|---|---:|---:|")
        for step, seconds in spent.most_common():
            print(f"| `{step}` | {1000 * seconds / n:.1f} | {100 * seconds / total:.1f}% |")
        return
    print(f"{args.tokenizer}: {n} cold chunks of 1,000 records after one to warm up, one process")
    print(f"{'whole chunk':16} {1000 * total / n:7.1f} ms")
    for step, seconds in spent.most_common():
        print(f"{step:16} {1000 * seconds / n:7.1f} ms  {100 * seconds / total:5.1f}%")


if __name__ == "__main__":
    main()
