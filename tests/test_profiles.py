"""Profiles, parse and reconstruction on the real tokenizers of each family."""

from __future__ import annotations

import json

import pytest

from recon import ReconError
from recon.audit.profiles import ParseOptions, builtin_profiles, load_profile
from recon.audit.reconstruct import reconstruct, reconstruct_batch
from recon.samples.records import Response, ToolCall, TokenLogprob, read_records

from .conftest import ROOT

FAMILY_TOKENIZER = {"kimi-k2": "kimi", "deepseek": "deepseek-v4", "qwen3": "qwen3.6", "chatml": "smollm2"}


@pytest.fixture(scope="module")
def bound(tokenizers, kimi):
    toks = {**tokenizers, "kimi": kimi}
    return {name: load_profile(name).bind(toks[tok]) for name, tok in FAMILY_TOKENIZER.items()}


def real_texts() -> list[str]:
    """Real model text (SmolLM2 samples: prose, code, lists, unicode, emoji) plus hand-picked edge text."""
    records = read_records(ROOT / "data" / "smollm2-t0.7.jsonl").records
    texts = [r.response.content for r in records if r.response.content and "\ufffd" not in r.response.content][:40]
    return texts + [
        "def f(x):\n    return {'a': [1, 2]}\n",
        "Ünïcödé — 你好，世界！ こんにちは 😀👍🏽 ٣٤٥",
        "  leading and trailing spaces  ",
        "line one\n\nline three\n",
    ]


ARGUMENTS = [
    '{"city": "Paris"}',
    '{"query": "naïve café ☕", "filters": {"tags": ["a", "b"], "range": {"min": 1, "max": 2.5}}, "ok": true, "none": null}',
    '{"code": "print(\\"hi\\")\\n", "nested": [[1, [2, [3]]], {"k": {"k2": {}}}]}',
    "{}",
]


def views_for(profile_name: str, bound_profile) -> list[Response]:
    p = bound_profile.profile
    texts = real_texts()
    views = []
    for k, (a, b) in enumerate(zip(texts, texts[1:] + texts[:1])):
        reasoning = a if p.has_reasoning and k % 3 != 0 else None
        n_calls = (k % 4) if p.has_tools else 0
        calls = [ToolCall(bound_profile.call_id(f"tool_{j}", j), f"tool_{j}", ARGUMENTS[(k + j) % len(ARGUMENTS)]) for j in range(n_calls)]
        content = b if k % 5 != 4 or not calls else None
        finish = "tool_calls" if calls else ("length" if k % 7 == 6 else "stop")
        views.append(Response(content=content, reasoning_content=reasoning, tool_calls=calls or None, finish_reason=finish))
    if p.has_reasoning:  # cut while thinking: no close tag was sampled
        views.append(Response(content=None, reasoning_content=texts[0], finish_reason="length"))
    return views


@pytest.mark.parametrize("name", list(FAMILY_TOKENIZER))
def test_render_then_parse_gives_back_the_view(name, bound):
    b = bound[name]
    views = views_for(name, b)
    assert len(views) >= 40
    for view in views:
        ids = b.tok.encode(b.render(view))
        assert b.parse_ids(ids) == view, b.render(view)[:200]
        if view.finish_reason in ("stop", "tool_calls"):
            assert ids[-1] == b.end_id


def test_special_ids_are_looked_up_not_typed(bound):
    assert bound["kimi-k2"].special_ids["<|im_end|>"] == 163586 and bound["kimi-k2"].special_ids["</think>"] == 163607
    assert bound["deepseek"].special_ids["<｜tool▁sep｜>"] == 128814 and bound["deepseek"].end_id == 1
    assert bound["qwen3"].special_ids["<tool_call>"] == 248058 and bound["chatml"].end_id == 2


def test_kimi_render_matches_its_grammar(bound):
    b = bound["kimi-k2"]
    view = Response(content="Checking.", reasoning_content="Need weather.", finish_reason="tool_calls",
                    tool_calls=[ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}')])
    assert b.render(view) == ("Need weather.</think>Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                              '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    ids = b.tok.encode(b.render(view))
    for text in ("</think>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                 "<|tool_call_end|>", "<|tool_calls_section_end|>", "<|im_end|>"):
        assert b.special_ids[text] in ids


@pytest.mark.parametrize("name", list(FAMILY_TOKENIZER))
def test_concat_and_segments_agree_except_at_real_boundary_merges(name, bound):
    b = bound[name]
    views = views_for(name, b)
    concat = reconstruct_batch(views, b, "concat")
    segments = reconstruct_batch(views, b, "segments")
    for c, s in zip(concat, segments):
        assert c.error is None and s.error is None
        if c.ids != s.ids:
            # same text, different segmentation: a merge across a piece boundary
            assert b.tok.decode(c.ids) == b.tok.decode(s.ids)
    if name == "chatml":  # content then <|im_end|>: no text boundary inside, so always equal
        assert all(c.ids == s.ids for c, s in zip(concat, segments))


def test_a_merge_across_a_segment_boundary(bound):
    """Qwen3's grammar puts '\\n\\n' after </think>; content starting with a newline merges with it
    when encoded as one string, but not when each piece is encoded alone."""
    b = bound["qwen3"]
    view = Response(content="\nHello", reasoning_content="Think.", finish_reason="stop")
    c, s = reconstruct(view, b, "concat"), reconstruct(view, b, "segments")
    assert c.ids != s.ids and b.tok.decode(c.ids) == b.tok.decode(s.ids)
    nl3 = b.tok.encode("\n\n\n", allow_special=False)
    assert len(nl3) == 1 and nl3[0] in c.ids and nl3[0] not in s.ids


def test_content_holding_special_text_differs_between_methods(bound):
    b = bound["chatml"]
    view = Response(content="Type <|im_end|> to stop.", finish_reason="stop")
    c, s = reconstruct(view, b, "concat"), reconstruct(view, b, "segments")
    assert c.ids.count(b.end_id) == 2 and s.ids.count(b.end_id) == 1


def test_logprobs_recover_non_canonical_ids_that_concat_cannot(bound):
    b = bound["chatml"]
    records = read_records(ROOT / "data" / "smollm2-t1.3.jsonl").records
    non_canonical = [r for r in records if b.tok.encode(b.tok.decode(r.output_ids)) != r.output_ids]
    assert len(non_canonical) >= 5
    views = [r.response for r in non_canonical]
    by_logprobs = reconstruct_batch(views, b, "logprobs")
    by_concat = reconstruct_batch(views, b, "concat")
    assert all(lp.ids == r.output_ids and lp.coverage == 1.0 for lp, r in zip(by_logprobs, non_canonical))
    assert sum(c.ids != r.output_ids for c, r in zip(by_concat, non_canonical)) == len(non_canonical)
    auto = reconstruct_batch(views, b, "auto")
    assert all(a.method == "logprobs" and a.ids == r.output_ids for a, r in zip(auto, non_canonical))


def test_logprobs_for_content_only_are_spliced_in(bound):
    b = bound["deepseek"]
    content = "The answer is 42."
    entries = [TokenLogprob(b.tok.id_to_bytes(i).decode("utf-8", "replace"), list(b.tok.id_to_bytes(i)))
               for i in b.tok.encode(content)]
    view = Response(content=content, reasoning_content="Six times seven.", finish_reason="stop", logprobs=entries)
    r = reconstruct(view, b, "logprobs")
    assert r.error is None and r.ids == reconstruct(Response(content=content, reasoning_content="Six times seven.", finish_reason="stop"), b, "segments").ids


def test_partial_logprobs_report_coverage_and_auto_falls_back(bound):
    b = bound["chatml"]
    entries = [TokenLogprob("Hi", list(b"Hi")), TokenLogprob("\ufffd", None), TokenLogprob("!", [33])]
    view = Response(content="Hi\ufffd!", finish_reason="length", logprobs=entries)
    r = reconstruct(view, b, "logprobs")
    assert r.ids is None and r.coverage == pytest.approx(2 / 3) and "entry 1" in r.error
    assert reconstruct(view, b, "auto").method == "concat"
    bogus = Response(content="x", finish_reason="stop", logprobs=[TokenLogprob("zzzzqqqq", list(b"zzzzqqqq"))])
    assert "does not map to a token" in reconstruct(bogus, b, "logprobs").error


def test_parse_switches_for_server_deviations(bound):
    b = bound["deepseek"]
    text = 'Plan.</think>\n  Answer.  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a":1,"b":"é"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
    plain = b.parse_text(text)
    assert plain.content == "\n  Answer.  " and plain.tool_calls[0].arguments == '{"a":1,"b":"é"}' and plain.tool_calls[0].id == "call_0"
    assert b.parse_text(text, ParseOptions(drop_newline_after_close=True)).content == "  Answer.  "
    assert b.parse_text(text, ParseOptions(strip_content=True)).content == "Answer."
    assert b.parse_text(text, ParseOptions(reserialize_arguments=True)).tool_calls[0].arguments == '{"a": 1, "b": "\\u00e9"}'
    kimi = bound["kimi-k2"]
    ktext = '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    call = kimi.parse_text("R.</think>" + ktext).tool_calls[0]
    assert (call.id, call.name) == ("functions.get_weather:0", "get_weather")
    assert kimi.parse_text("R.</think>" + ktext, ParseOptions(renumber_ids=True)).tool_calls[0].id == "call_0"


def test_bad_input_is_a_clear_per_record_error(bound, tokenizers):
    b = bound["qwen3"]
    good = Response(content="ok", finish_reason="stop")
    bad = Response(content=None, finish_reason="tool_calls", tool_calls=[ToolCall("call_0", "f", "{not json")])
    results = reconstruct_batch([good, bad, good], b, "concat")
    assert results[0].ids and results[2].ids and results[1].ids is None
    assert "tool_calls[0].function.arguments is not JSON" in results[1].error
    with pytest.raises(ReconError, match="unknown profile 'llama9'"):
        load_profile("llama9")
    with pytest.raises(ReconError, match=r"profile 'deepseek' needs tokens .*'<｜end▁of▁sentence｜>'.* that tokenizer smollm2 does not have"):
        load_profile("deepseek").bind(tokenizers["smollm2"])
    chatml = bound["chatml"]
    assert "no tool-call grammar" in reconstruct(bad, chatml, "concat").error


def test_user_profile_from_yaml(tmp_path, tokenizers):
    path = tmp_path / "mine.yaml"
    path.write_text("smol-think:\n  reasoning_open: ''\n  reasoning_close: '<|im_start|>'\n  end: '<|im_end|>'\n")
    b = load_profile(path).bind(tokenizers["smollm2"])
    view = Response(content="B", reasoning_content="A", finish_reason="stop")
    assert b.tok.decode(reconstruct(view, b, "concat").ids) == "A<|im_start|>B<|im_end|>"
    (tmp_path / "bad.yaml").write_text("x:\n  end: '<|im_end|>'\n  colour: blue\n")
    with pytest.raises(ReconError, match=r"bad.yaml: x: unknown field\(s\) colour"):
        load_profile(tmp_path / "bad.yaml")
    assert set(builtin_profiles()) == {"kimi-k2", "deepseek", "qwen3", "chatml"}


def test_reconstruct_cli_adds_recon_ids(tmp_path):
    from .test_cli import recon

    out = tmp_path / "rec.jsonl"
    run = recon("reconstruct", "data/smollm2-t1.3.jsonl", "--tokenizer", "smollm2", "--profile", "chatml", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "wrote 160 records" in run.stdout and "logprobs: 160" in run.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["recon_ids"] == r["output_ids"] and r["recon_method"] == "logprobs" for r in rows)
    concat = tmp_path / "concat.jsonl"
    recon("reconstruct", "data/smollm2-t1.3.jsonl", "--tokenizer", "smollm2", "--profile", "chatml", "--method", "concat", "--out", str(concat))
    rows = [json.loads(line) for line in concat.read_text().splitlines()]
    assert 0 < sum(r["recon_ids"] == r["output_ids"] for r in rows) < 160  # concat can't recover non-canonical samples
    bad = recon("reconstruct", "data/smollm2-t1.3.jsonl", "--tokenizer", "smollm2", "--profile", "deepseek", "--out", str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "needs tokens" in bad.stderr


def test_roundtrip_mode_parses_output_ids_when_there_is_no_response(tokenizers):
    from recon.audit.reconstruct import reconstruct_records
    from recon.samples.records import Record

    b = load_profile("chatml").bind(tokenizers["smollm2"])
    records = [Record(r.id, r.dataset, r.output_ids) for r in read_records(ROOT / "data" / "smollm2-t0.7.jsonl").records[:30]]
    results = reconstruct_records(records, b, "concat")
    canonical = [r for r in records if b.tok.encode(b.tok.decode(r.output_ids)) == r.output_ids]
    assert canonical and all(res.ids == r.output_ids for res, r in zip(results, records) if r in canonical)


def test_skip_special_tokens_drops_stray_specials_but_keeps_the_grammar(bound):
    b = bound["chatml"]
    ids = b.tok.encode("Hello<|endoftext|> world<|im_end|>")
    assert b.parse_ids(ids).content == "Hello<|endoftext|> world"
    view = b.parse_ids(ids, ParseOptions(skip_special_tokens=True))
    assert (view.content, view.finish_reason) == ("Hello world", "stop")
