"""The requests sent to the real vLLM engine, the checks its answers must pass in recon's
importers, and the recorder of ``tests/data/vllm/`` (the engine's own answers, kept so that tests
without the engine still check the importers on real shapes).

Regenerate the fixtures from a running engine (``recon engine start --port 8100``)::

    python -m tests.vllm_cases --url http://127.0.0.1:8100/v1
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path

from recon.samples.importers import iter_import
from recon.samples.io import RecordError

RECORDED = Path(__file__).resolve().parent / "data" / "vllm"
SOURCE = "vLLM 0.32.0 CPU, live"
MODEL = "smollm2"

SEA = [{"role": "user", "content": "Write one sentence about the sea, with an emoji."}]
WEATHER = [{"role": "system", "content": "You can call tools."},
           {"role": "user", "content": "What is the weather in Paris today?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}]
CHAT = {"model": MODEL, "messages": SEA, "max_tokens": 24, "temperature": 0.7, "seed": 7, "logprobs": True,
        "top_logprobs": 3, "return_token_ids": True}

#: name -> (route, request body); the chat ones are imported with `recon import vllm`
CASES: dict[str, tuple[str, dict]] = {
    "chat": ("/chat/completions", CHAT),
    "chat_stream": ("/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "chat_n3": ("/chat/completions", {**CHAT, "n": 3, "seed": 11, "max_tokens": 16}),
    "chat_tokens_as_ids": ("/chat/completions", {**CHAT, "return_tokens_as_token_ids": True, "max_tokens": 12}),
    "chat_plain": ("/chat/completions", {"model": MODEL, "messages": SEA, "max_tokens": 12, "temperature": 0.7,
                                         "seed": 3}),
    # vLLM's "auto" tool choice needs a tool-call parser flag; "none" still renders the schema into the prompt
    "chat_tools": ("/chat/completions", {"model": MODEL, "messages": WEATHER, "tools": TOOLS, "tool_choice": "none",
                                         "max_tokens": 24, "temperature": 0.7, "seed": 5, "logprobs": True,
                                         "return_token_ids": True}),
    "completions_prompt_logprobs": ("/completions", {"model": MODEL, "prompt": [1, 504, 3575, 282, 4649, 314, 7042, 30],
                                                     "max_tokens": 1, "echo": True, "prompt_logprobs": 5,
                                                     "temperature": 0}),
}
CHAT_CASES = [name for name, (route, _) in CASES.items() if route == "/chat/completions"]

#: bad requests: name -> (route, raw body); vLLM's status and error body are recorded
BAD = {
    "bad_temperature": ("/chat/completions", json.dumps({"model": MODEL, "messages": SEA, "temperature": -1})),
    "bad_n": ("/chat/completions", json.dumps({"model": MODEL, "messages": SEA, "n": 0})),
    "bad_top_logprobs": ("/chat/completions", json.dumps({"model": MODEL, "messages": SEA, "logprobs": True,
                                                          "top_logprobs": 25})),
    "bad_model": ("/chat/completions", json.dumps({"model": "nope", "messages": SEA})),
    "bad_missing_messages": ("/chat/completions", json.dumps({"model": MODEL})),
    "bad_json": ("/chat/completions", '{"model": "smollm2", "messages": ['),
}

MULTITURN_SYSTEM = None  # SmolLM2's template adds its own system prompt
MULTITURN_USER = ["Hi! What is your name?", "Tell me one fact about octopuses.", "Now say it in five words."]


def post(url: str, route: str, body: dict | str, *, stream: bool = False, timeout: float = 300.0):
    """(status, parsed answer): the JSON object, or for a stream the list of its chunks ([DONE] dropped)."""
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(url.rstrip("/") + route, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    if not stream:
        return status, json.loads(raw)
    chunks = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[len("data: "):]))
    assert raw.decode().rstrip().endswith("data: [DONE]")
    return status, chunks


def ask(url: str, name: str):
    route, body = CASES[name]
    return post(url, route, body, stream=bool(body.get("stream")))


def multiturn(url: str, turns: list[str] = MULTITURN_USER, seed: int = 21) -> list[dict]:
    """Three turns, each reply fed back as the assistant's message; the prompt ids vLLM reports each time."""
    messages: list[dict] = []
    out = []
    for k, text in enumerate(turns, 1):
        messages.append({"role": "user", "content": text})
        body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0.7, "seed": seed + k,
                "return_token_ids": True}
        status, reply = post(url, "/chat/completions", body)
        assert status == 200, reply
        choice = reply["choices"][0]
        out.append({"turn": k, "request": json.loads(json.dumps(body)), "prompt_token_ids": reply["prompt_token_ids"],
                    "token_ids": choice["token_ids"], "text": choice["message"]["content"],
                    "finish_reason": choice["finish_reason"]})
        messages.append({"role": "assistant", "content": choice["message"]["content"]})
    return out


def engine_text(tok, ids: list[int], finish_reason: str | None) -> str:
    """The text vLLM returns for ``ids``: decoded with special tokens skipped; a reply cut by
    max_tokens inside a character ends before that character's bytes (vLLM's detokenizer holds
    back an incomplete UTF-8 sequence and never emits U+FFFD for it)."""
    text = tok.decode([i for i in ids if i not in tok.special_ids])
    return text.rstrip("\ufffd") if finish_reason == "length" else text


# -- the checks: recon's importer on the engine's answer gives the engine's ids and text ----------------------
def import_answer(answer, tmp_path: Path, name: str) -> list:
    """The answer as `recon import vllm` reads it (one response a line; a stream, one chunk a line)."""
    path = tmp_path / f"{name}.jsonl"
    lines = answer if isinstance(answer, list) else [answer]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    items = list(iter_import("vllm", path))
    errors = [i for i in items if isinstance(i, RecordError)]
    assert errors == [], errors
    return items


def joined_stream(chunks: list[dict]) -> dict:
    """The chunks' ids and text per choice, as the engine sent them (the oracle for a stream)."""
    choices: dict[int, dict] = {}
    prompt = None
    for c in chunks:
        prompt = prompt or c.get("prompt_token_ids")
        for ch in c["choices"]:
            one = choices.setdefault(ch["index"], {"token_ids": [], "content": "", "logprobs": []})
            one["token_ids"] += ch.get("token_ids") or []
            one["content"] += ch["delta"].get("content") or ""
            one["logprobs"] += (ch.get("logprobs") or {}).get("content") or []
            one["finish_reason"] = ch.get("finish_reason") or one.get("finish_reason")
    return {"prompt_token_ids": prompt, "choices": [choices[k] for k in sorted(choices)]}


def check_chat_import(answer, tok, tmp_path: Path, name: str) -> list:
    """recon's vLLM importer on one chat answer (or stream): every record's ids are the engine's ids,
    its prompt ids the engine's, its text the engine's text, and that text is what the ids decode to
    (special tokens skipped); logprob bytes, where the engine gave them, spell the ids' bytes."""
    records = import_answer(answer, tmp_path, name)
    if isinstance(answer, list):
        oracle = joined_stream(answer)
        choices = [{"token_ids": c["token_ids"], "text": c["content"], "logprobs": c["logprobs"],
                    "finish_reason": c["finish_reason"]} for c in oracle["choices"]]
    else:
        oracle = answer
        choices = [{"token_ids": c.get("token_ids"), "text": c["message"]["content"],
                    "logprobs": (c.get("logprobs") or {}).get("content"), "finish_reason": c["finish_reason"]}
                   for c in answer["choices"]]
    assert len(records) == len(choices)
    for rec, choice in zip(records, choices):
        assert rec.response.content == choice["text"]
        assert rec.response.finish_reason == choice["finish_reason"]
        assert rec.output_ids == choice["token_ids"]
        assert rec.prompt_ids == oracle.get("prompt_token_ids")
        if rec.output_ids is not None:
            assert engine_text(tok, rec.output_ids, choice["finish_reason"]) == choice["text"]
        if choice["logprobs"]:
            entries = [e.to_dict() for e in rec.response.logprobs]
            assert len(entries) == len(choice["logprobs"]) == len(rec.output_ids)
            as_ids = [e.get("token_id") for e in entries]
            if all(i is not None for i in as_ids):  # return_tokens_as_token_ids: the ids themselves
                assert as_ids == rec.output_ids
            else:
                assert b"".join(bytes(e["bytes"]) for e in entries) == tok.ids_bytes(rec.output_ids)
    return records


def check_multiturn(turns: list[dict]) -> None:
    """Each turn's prompt starts with the previous prompt and the ids sampled there (<|im_end|> where
    the turn stopped; the template closes a turn cut by max_tokens), then the next user turn."""
    assert len(turns) == 3
    for before, after in zip(turns, turns[1:]):
        grown = before["prompt_token_ids"] + before["token_ids"]
        assert after["prompt_token_ids"][:len(grown)] == grown
        rest = after["prompt_token_ids"][len(grown):]
        closing = [198] if before["finish_reason"] == "stop" else [2, 198]  # (<|im_end|>) "\n"
        assert rest[:len(closing) + 2] == closing + [1, 4093]  # <|im_start|> user


# -- the recorder ---------------------------------------------------------------------------------------------
def record(url: str, out: Path = RECORDED) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(name: str, payload: dict) -> None:
        path = out / f"{name}.json"
        path.write_text(json.dumps({"_source": SOURCE, **payload}, indent=1, ensure_ascii=False) + "\n")
        written.append(path)

    for name, (route, body) in CASES.items():
        status, answer = ask(url, name)
        save(name, {"route": route, "request": body, "status": status,
                    ("chunks" if body.get("stream") else "response"): answer})
    for name, (route, raw) in BAD.items():
        status, answer = post(url, route, raw)
        save(name, {"route": route, "raw_request": raw, "status": status, "response": answer})
    save("multiturn", {"turns": multiturn(url)})
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description="record the real vLLM engine's answers into tests/data/vllm/")
    parser.add_argument("--url", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8100/v1")
    parser.add_argument("--out", type=Path, default=RECORDED)
    for path in record(parser.parse_args().url, parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
