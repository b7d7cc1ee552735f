"""What a recovery scorer call costs with the local model: a fixed part per forward pass and a part
per position run, measured in one run (these machines are shared: compare numbers within a run).

    python benchmarks/scorer_cost.py                 # SmolLM2-135M, one torch thread (as the benchmark runs it)
    python benchmarks/scorer_cost.py --threads 2

For n new positions in one pass (the body, then the output layer over the whole vocabulary, as
:class:`recon.recovery.prefix_tree.PrefixTree` runs them) it prints the fastest of --repeat runs,
then a least-squares fit ``seconds = fixed + n * per_position``. A search's time is about
``calls * fixed + positions * per_position`` (``LocalScorer.tokens_run`` counts positions).
The same in bfloat16 is printed beside it, with how far its logprobs land from float32's: why
recovery stays in float32 (the search compares scores that differ by tenths of a nat).
Needs the ``generate`` extra.

    python benchmarks/scorer_cost.py --llama-cpp     # also llama.cpp on the same GGUF, if installed

With ``--llama-cpp`` the same passes run through llama.cpp (``llama-cpp-python``, which has no
wheel on PyPI: ``pip install llama-cpp-python`` compiles it, ~5 minutes on two cores), on the
GGUF's own quantized weights, logits for every position, and its logprobs are compared with
torch's (float32 over the dequantized weights, what recovery scores with).
"""

from __future__ import annotations

import argparse
import os
import time


def timed_pass(net, head, ids, repeat: int) -> float:
    import torch

    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeat):
            start = time.perf_counter()
            head(net(input_ids=ids).last_hidden_state[0])
            best = min(best, time.perf_counter() - start)
    return best


def fit(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least squares: seconds = fixed + n * per_position."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sum((x - mx) ** 2 for x in sizes)
    return my - slope * mx, slope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="1,8,32,128,384", help="positions per pass")
    ap.add_argument("--llama-cpp", action="store_true", help="also time llama.cpp (llama-cpp-python) on the same GGUF")
    ap.add_argument("--markdown", action="store_true", help="print the tables of docs/benchmarks.md instead")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from recon.recovery.model import LocalModel

    local = LocalModel("smollm2", threads=args.threads)
    model = local.model
    sizes = [int(s) for s in args.sizes.split(",")]
    gen = torch.Generator().manual_seed(0)
    inputs = {n: torch.randint(100, model.config.vocab_size, (1, n), generator=gen) for n in sizes}
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        net, head = model.base_model, model.get_output_embeddings()
        rows[dtype] = [timed_pass(net, head, inputs[n], args.repeat) for n in sizes]
        with torch.inference_mode():
            logits = head(net(input_ids=inputs[sizes[-1]]).last_hidden_state[0]).float()
        rows[dtype, "logp"] = torch.log_softmax(logits, dim=-1)
    model.to(torch.float32)
    if args.markdown:
        markdown(sizes, rows, args)
        return
    print(f"positions per pass  {'float32 ms':>10}  {'bfloat16 ms':>11}")
    for i, n in enumerate(sizes):
        print(f"{n:>18}  {rows[torch.float32][i] * 1e3:>10.1f}  {rows[torch.bfloat16][i] * 1e3:>11.1f}")
    for dtype in (torch.float32, torch.bfloat16):
        fixed, per = fit(sizes, rows[dtype])
        print(f"{str(dtype).removeprefix('torch.'):>9}: fixed {fixed * 1e3:.1f} ms a pass, {per * 1e3:.2f} ms a position "
              f"(one pass = {fixed / per:.0f} positions)")
    ratio = fit(sizes, rows[torch.bfloat16])[1] / fit(sizes, rows[torch.float32])[1]
    gap = (rows[torch.bfloat16, "logp"] - rows[torch.float32, "logp"]).abs()
    top = rows[torch.float32, "logp"].argmax(-1)
    print(f"bfloat16 / float32 per position: {ratio:.2f}; |logprob difference| of the most likely token: "
          f"mean {gap.gather(-1, top[:, None]).mean():.3f}, max {gap.gather(-1, top[:, None]).max():.3f} nats "
          f"(over {sizes[-1]} positions)")
    if args.llama_cpp:
        llama_cpp_rows(str(local.tokenizer.source), sizes, inputs, rows[torch.float32, "logp"], args)


def markdown(sizes: list[int], rows: dict, args) -> None:
    """The tables of docs/benchmarks.md: ms per pass by positions, the fit, bfloat16's drift."""
    import torch

    print(f"SmolLM2-135M, {args.threads} torch thread(s), fastest of {args.repeat} runs a size.\n")
    print("| positions per pass | float32 ms | bfloat16 ms |\n|---:|---:|---:|")
    for i, n in enumerate(sizes):
        print(f"| {n} | {rows[torch.float32][i] * 1e3:.1f} | {rows[torch.bfloat16][i] * 1e3:.1f} |")
    print("\n| dtype | fixed ms a pass | ms a position | a pass costs as many positions as |\n|---|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        fixed, per = fit(sizes, rows[dtype])
        print(f"| {str(dtype).removeprefix('torch.')} | {fixed * 1e3:.1f} | {per * 1e3:.2f} | {fixed / per:.0f} |")
    gap = (rows[torch.bfloat16, "logp"] - rows[torch.float32, "logp"]).abs()
    top = rows[torch.float32, "logp"].argmax(-1)
    picked = gap.gather(-1, top[:, None])
    print(f"\nbfloat16 moves the most likely token's logprob by {picked.mean():.3f} nats on average "
          f"(at most {picked.max():.3f}) over {sizes[-1]} positions.")


def llama_cpp_rows(gguf: str, sizes: list[int], inputs: dict, torch_logp, args) -> None:
    """The same passes through llama.cpp: one ``eval`` of n positions, logits at every one."""
    import numpy as np

    try:
        import llama_cpp
    except ImportError:
        print("llama.cpp: llama-cpp-python is not installed (pip install llama-cpp-python: a C++ build)")
        return
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=max(sizes) + 8, n_batch=max(sizes), n_ubatch=max(sizes),
                          n_threads=args.threads, n_threads_batch=args.threads, logits_all=True, verbose=False)
    seconds = []
    for n in sizes:
        ids = inputs[n][0].tolist()
        best = float("inf")
        for _ in range(args.repeat):
            llm.reset()
            start = time.perf_counter()
            llm.eval(ids)
            best = min(best, time.perf_counter() - start)
        seconds.append(best)
    logits = np.array(llm.scores[: sizes[-1]], dtype=np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    ours = torch_logp.double().numpy()
    top = ours.argmax(-1)
    gap = np.abs(logp[np.arange(len(top)), top] - ours[np.arange(len(top)), top])
    print(f"llama.cpp ({llama_cpp.__version__}, the GGUF's own weights) ms per pass: "
          + ", ".join(f"{n}: {s * 1e3:.1f}" for n, s in zip(sizes, seconds)))
    fixed, per = fit(sizes, seconds)
    print(f"llama.cpp: fixed {fixed * 1e3:.1f} ms a pass, {per * 1e3:.2f} ms a position; |logprob difference| from "
          f"torch float32 of the most likely token: mean {gap.mean():.3f}, max {gap.max():.3f} nats")


if __name__ == "__main__":
    main()
