"""Held-out samples drawn by llama.cpp, the engine people run SmolLM2's GGUF on.

    pip install llama-cpp-python==0.3.36     # no wheel: pip builds llama.cpp from the sdist (~5 min, 2 cores)
    python benchmarks/llamacpp_heldout.py --temperature 0.7 --top-p 0.95 --seed 21 \\
        --out data/heldout-llamacpp-t0.7-p0.95.jsonl
    python benchmarks/llamacpp_heldout.py --temperature 1.4 --min-p 0.05 --seed 22 \\
        --out data/heldout-llamacpp-t1.4-m0.05.jsonl
    python benchmarks/llamacpp_heldout.py --temperature 0.8 --top-k 40 --top-p 0.95 --min-p 0.05 --seed 23 \\
        --out data/heldout-llamacpp-t0.8-default.jsonl     # llama.cpp's own defaults
    # issue 37's untouched sets (new seeds): recovered once, when the search is final:
    python benchmarks/llamacpp_heldout.py --temperature 0.7 --top-p 0.95 --seed 31 \\
        --out data/heldout-llamacpp-t0.7-p0.95-s31.jsonl
    python benchmarks/llamacpp_heldout.py --temperature 1.0 --seed 32 \\
        --out data/heldout-llamacpp-t1.0-s32.jsonl         # no cut: top-k 0, top-p 1, min-p 0
    python benchmarks/llamacpp_heldout.py --judge data/recover-heldout-llamacpp.jsonl \
        --inputs data/heldout-llamacpp-*.jsonl              # each failure scored again by llama.cpp

The other held-out files were drawn by transformers (``recon generate``) from float32 weights
dequantized from the GGUF. These are drawn by llama.cpp itself (llama-cpp-python's
``Llama.generate``) on the GGUF's Q4_1 weights: its kernels, its sampler chain (top-k, typical,
top-p, min-p on the raw logits, then the temperature and a seeded draw; repeat penalty 1), its
random numbers. Every cut is passed to llama.cpp, off ones too: ``--top-k`` 0, ``--top-p`` 1 and
``--min-p`` 0 by default, so nothing is truncated that is not asked for (llama.cpp's own defaults
are top-k 40, top-p 0.95, min-p 0.05). The meta names each cut, ``top_k: 0`` and ``min_p: 0.0``
where off (the three files drawn before the s31 and s32 sets leave those two out where off).
recon recovers them with its own scorer (torch, float32) under the sampler the record's meta
names (``sampler_order: llama.cpp``), so the two engines' numerics differ by what
``benchmarks/scorer_cost.py --llama-cpp`` measures, as they do for anyone recovering a llama.cpp
server's output with another engine.

The prompts and their ids are the other held-out files' (``--prompts-from``, default
``data/heldout-t0.7.jsonl``: the same 40 prompts rendered with SmolLM2's chat template), each
sampled ``--n`` times, up to ``--max-new-tokens``; a sample ends at the end-of-turn token the
GGUF names (kept in ``output_ids``, ``finish_reason: stop``) or at the limit (``length``).
``response.content`` is what a server returns: the ids' text with special tokens skipped. Each
sample's seed is ``seed * 1000 + index`` (the records in file order), so a file is reproducible on
the same build. Not run in CI (no llama.cpp there); the files it made are bundled, and
``benchmarks/recover_accuracy.py`` recovers them like the others.

``--judge`` scores each failure of a rows file again with llama.cpp's own logits under the same
sampler (the issue's way of telling a search error from a model error), beside recon's scorer's
verdict: where the two engines disagree, the answer was decided by their numerics.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def engine_scores(llm, sequences, prompt_len: int, sampling) -> list[float]:
    """log P(ids | prompt) of each sequence (prompt + ids) under ``sampling``, from llama.cpp's own
    logits (every position of one evaluation), as the engine that sampled them scores them."""
    import numpy as np
    import torch

    out = []
    for seq in sequences:
        llm.reset()
        llm.eval(seq)
        logits = torch.from_numpy(np.array(llm.scores[: len(seq) - 1]))
        lps = sampling.log_probs(logits)
        out.append(float(sum(lps[j - 1, seq[j]] for j in range(prompt_len, len(seq)))))
    return out


def judge(rows_path: Path, inputs: list[Path], threads: int) -> None:
    """Each failure of a rows file (benchmarks/recover_accuracy.py), scored again by llama.cpp:
    does the engine that sampled the text also prefer the returned ids to the sampled ones? (Where
    it does not, the answer was decided by the two engines' numerics, not by the search.)"""
    import json
    import math

    import llama_cpp

    from recon.recovery.sampling import Sampling
    from recon import load_tokenizer
    from recon.samples.records import read_records

    gguf = load_tokenizer("smollm2").source  # the GGUF recon's tokenizer (and its local scorer) read
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=1024, n_threads=threads, n_threads_batch=threads, logits_all=True,
                          verbose=False)
    records = {(r.dataset, r.id): r for path in inputs for r in read_records(path).records}
    failed = [r for r in map(json.loads, rows_path.read_text().splitlines()) if r.get("failure") in ("search", "model")]
    print("| dataset | id | recon's verdict | recon: returned - sampled | llama.cpp: returned - sampled | llama.cpp prefers |")
    print("|---|---|---|---:|---:|---|")
    agree = outside = 0
    for row in failed:
        rec = records[row["dataset"], row["id"]]
        # with the record's slack: llama.cpp scoring a whole sequence at once (prefill) does not
        # reproduce its own logits of drawing it token by token (decode) at the cut either
        sampling = Sampling.from_meta(rec.meta)
        got, want = engine_scores(llm, [rec.prompt_ids + row["returned_ids"], rec.prompt_ids + rec.output_ids],
                                  len(rec.prompt_ids), sampling)
        strict = engine_scores(llm, [rec.prompt_ids + rec.output_ids], len(rec.prompt_ids), Sampling.from_meta(rec.meta, slack=0.0))
        outside += strict[0] == -math.inf
        kind = "the sampled ids" if want > got + 1e-4 else "the returned ids"
        agree += kind == "the returned ids"
        print(f"| {row['dataset']} | {row['id']} | {row['failure']} | {row['returned_score'] - row['sampled_score']:.2f} "
              f"| {got - want:.2f} | {kind} |")
    print(f"llama.cpp prefers the returned ids in {agree} of {len(failed)} failures; without slack, its own prefill "
          f"puts the sampled ids of {outside} of them outside its cut")


SLACKS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)


def shortfall(inputs: list[Path]) -> None:
    """How far the sampled ids fall outside recon's truncation: per sample, the least slack
    (:class:`~recon.recovery.sampling.Sampling`, of :data:`SLACKS`) at which recon's scorer (torch,
    float32) gives every sampled id a probability, under the sampler the record's meta names."""
    import math

    import torch

    from recon.recovery.model import LocalModel
    from recon.recovery.sampling import ENGINE_SLACK, Sampling
    from recon.samples.records import read_records

    model = LocalModel("smollm2", threads=1)
    print(f"| file | samples | inside the cut | least slack that keeps every sampled id: {' / '.join(f'{v:g}' for v in SLACKS[1:])} "
          f"| outside {ENGINE_SLACK:g} |")
    print("|---|---:|---:|---|---:|")
    for path in inputs:
        records = read_records(path).records
        least = []
        for rec in records:
            seq = rec.prompt_ids + rec.output_ids
            with torch.inference_mode():
                logits = model.model(input_ids=torch.tensor([seq])).logits[0, len(rec.prompt_ids) - 1 : -1]
            rows = torch.arange(len(rec.output_ids))
            need = math.inf
            for slack in SLACKS:
                lps = Sampling.from_meta(rec.meta, slack=slack).log_probs(logits)[rows, torch.tensor(rec.output_ids)]
                if bool(torch.isfinite(lps).all()):
                    need = slack
                    break
            least.append(need)
        counts = [sum(v == s for v in least) for s in SLACKS]
        print(f"| {path.name} | {len(records)} | {counts[0]} | {' / '.join(map(str, counts[1:]))} "
              f"| {sum(v > ENGINE_SLACK for v in least)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", type=Path, metavar="ROWS",
                        help="instead of sampling: score each failure in ROWS again with llama.cpp (needs --inputs)")
    parser.add_argument("--inputs", type=Path, nargs="+", help="with --judge: the sample files ROWS came from")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--prompts-from", type=Path, default=ROOT / "data" / "heldout-t0.7.jsonl",
                        help="records whose prompt ids and messages are reused (the first sample of each prompt)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int, default=0, help="0: off")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dataset", help="default: the output file's name")
    parser.add_argument("--shortfall", type=Path, nargs="+", metavar="FILE",
                        help="instead of sampling: how far each file's sampled ids fall outside recon's truncation (no llama.cpp needed)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.shortfall:
        return shortfall(args.shortfall)
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llamacpp_heldout: needs llama-cpp-python (pip install llama-cpp-python==0.3.36)")
    if args.judge:
        if not args.inputs:
            sys.exit("llamacpp_heldout: --judge needs --inputs (the sample files the rows came from)")
        return judge(args.judge, args.inputs, args.threads)
    if args.out is None or args.temperature is None or args.seed is None:
        sys.exit("llamacpp_heldout: sampling needs --out, --temperature and --seed")
    from recon import load_tokenizer
    from recon.samples.records import Record, Response, read_records, write_records

    tok = load_tokenizer("smollm2")
    gguf = tok.source  # the GGUF recon's tokenizer (and its local scorer) read
    eos = tok.added_by_content[tok.roles["eos"]].id  # the end-of-turn token the GGUF names, looked up by its text
    prompts = {}
    for rec in read_records(args.prompts_from).records:
        prompts.setdefault(rec.id.rsplit("-", 1)[0], rec)
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads,
                          verbose=False)
    if llm.token_eos() != eos:
        sys.exit(f"llamacpp_heldout: llama.cpp's end-of-turn id {llm.token_eos()} is not recon's {eos} for {tok.roles['eos']!r}")
    dataset = args.dataset or args.out.stem
    records, index = [], 0
    for pid, first in prompts.items():
        for k in range(args.n):
            seed = args.seed * 1000 + index
            index += 1
            llm.set_seed(seed)
            ids: list[int] = []
            for t in llm.generate(first.prompt_ids, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, typical_p=1.0,
                                  temp=args.temperature, repeat_penalty=1.0, reset=True):
                ids.append(int(t))
                if t == eos or len(ids) >= args.max_new_tokens:
                    break
            reason = "stop" if ids and ids[-1] == eos else "length"
            text = tok.decode([i for i in ids if i not in tok.special_ids])
            # every cut the chain ran, off ones too (top-k 0, min-p 0): llama.cpp's own defaults are on
            # (top-k 40, top-p 0.95, min-p 0.05), so a missing key would not say what was used
            truncation = {"top_k": args.top_k, "min_p": args.min_p}
            records.append(Record(
                id=f"{pid}-{k}", dataset=dataset, output_ids=ids, prompt_ids=first.prompt_ids, messages=first.messages,
                response=Response(content=text, finish_reason=reason),
                meta={"model": "smollm2", "engine": "llama.cpp", "weights": gguf.name, "llama_cpp_python": llama_cpp.__version__,
                      "sampler_order": "llama.cpp", "temperature": args.temperature, "top_p": args.top_p, **truncation,
                      "max_new_tokens": args.max_new_tokens, "seed": seed},
            ))
            print(f"\r{index} samples", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    write_records(records, args.out)
    print(f"wrote {len(records)} samples to {args.out}")


if __name__ == "__main__":
    main()
