"""Real multi-turn trajectories from the local SmolLM2 model through `recon serve`:
data/conversations/smollm2-served.responses.jsonl (what was sent and what came back, one line a
turn) and data/conversations/smollm2-served.jsonl (the same through `recon import vllm`).

Each conversation is a list of user messages; each turn sends the history (every earlier user
message and the model's own reply, its ``content`` as returned) with ``return_token_ids: true``,
so the server answers with the prompt ids it built (``prompt_token_ids``) and the ids it sampled
(``choices[0].token_ids``). The server is started here on 127.0.0.1 on a free port, and stopped.

    python benchmarks/served_conversations.py [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "conversations"

CONVERSATIONS = [
    ["Hi! What is your name?", "Tell me one fact about octopuses.", "Now say it in five words."],
    ["What is the capital of France?", "And of Japan?", "Which of the two is bigger?"],
    ["Write a haiku about rain.", "Make it about snow instead.", "Translate it to French."],
    ["List three primary colours.", "Which one is your favourite?", "Why?"],
    ["How do I boil an egg?", "How long for a soft one?", "Thanks!"],
    ["你好！你会说中文吗？", "今天天气怎么样？", "谢谢。"],
    ["Count from one to five.", "Now backwards.", "Now in Spanish."],
    ["Give me a short tip for learning Python.", "Another one?", "And one about testing?", "Summarize all three."],
]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from recon.recovery.model import LocalModel
    from recon.server.serve import make_server

    OUT.mkdir(parents=True, exist_ok=True)
    raw = OUT / "smollm2-served.responses.jsonl"
    server = make_server(LocalModel("smollm2", threads=2), "127.0.0.1", 0).start()
    try:
        with open(raw, "w", encoding="utf-8") as f:
            for c, users in enumerate(CONVERSATIONS):
                history: list = []
                for turn, text in enumerate(users):
                    history.append({"role": "user", "content": text})
                    body = {"model": "smollm2", "messages": list(history), "max_tokens": args.max_tokens,
                            "temperature": args.temperature, "seed": args.seed * 1000 + c * 10 + turn,
                            "return_token_ids": True}
                    reply = post(server.url, body)
                    f.write(json.dumps({"id": f"served-{c}-{turn}", "conversation": f"served-{c}", "turn": turn,
                                        "request": body, "response": reply}, ensure_ascii=False) + "\n")
                    history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    finally:
        server.stop()
    subprocess.run([sys.executable, "-m", "recon.cli", "import", "vllm", str(raw), "--out", str(OUT / "smollm2-served.jsonl"), "--dataset", "smollm2-served",
                    "--temperature", str(args.temperature), "--engine", "recon-serve"], check=True, cwd=ROOT)
    print(f"{raw}; {OUT / 'smollm2-served.jsonl'}")


if __name__ == "__main__":
    main()
