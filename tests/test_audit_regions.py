"""Causes that name the place: every divergence is decided by its region first (issue 14).

Each case builds the ids a model really sampled (a real-looking output of each family, encoded by
its real tokenizer, with one deliberate deviation) and audits them against what a server returns:
paired (ids + the server's response) and roundtrip (ids only, parsed as a server would). Each
asserts the exact cause and region of the first divergence.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from recon import stats
from recon.audit import REGIONS, audit_records
from recon.audit.profiles import ParseOptions, load_profile
from recon.samples.records import Record, Response, ToolCall, read_records

from .conftest import ROOT

FAMILY = {"qwen3": "qwen3.6", "deepseek": "deepseek-v4", "kimi-k2": "kimi", "chatml": "smollm2"}
TOOLS = ("qwen3", "deepseek", "kimi-k2")

REASONING = "The user asks about the weather in Paris, so I should call the weather tool"
CONTENT = "Let me check the current weather in Paris for you."
ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'  # as json.dumps writes it: what servers return
COMPACT = '{"city":"Paris","unit":"celsius"}'       # as a model may sample it


@pytest.fixture(scope="module")
def bound(tokenizers, kimi):
    toks = {**tokenizers, "kimi": kimi}
    return {name: load_profile(name).bind(toks[tok]) for name, tok in FAMILY.items()}


def sampled(b, *, content=CONTENT, reasoning=REASONING, arguments=ARGUMENTS, calls=True, finish=None) -> Response:
    """A real-looking output of the profile's family, as an API view."""
    p = b.profile
    tool_calls = [ToolCall(b.call_id("get_weather", 0), "get_weather", arguments)] if calls and p.has_tools else None
    return Response(content=content, reasoning_content=reasoning if p.has_reasoning else None, tool_calls=tool_calls,
                    finish_reason=finish or ("tool_calls" if tool_calls else "stop"))


def audit(b, truth: list[int], response: Response | None = None, options: ParseOptions | None = None) -> pd.Series:
    """One record audited: paired when a response is given, else roundtrip."""
    rows = audit_records([Record("r", "d", truth, response)], b, "concat", options=options)
    assert len(rows) == 1 and rows["mode"].iloc[0] == ("paired" if response is not None else "roundtrip")
    return rows.iloc[0]


def offsets(tok, ids: list[int]) -> list[int]:
    out = [0]
    for i in ids:
        out.append(out[-1] + len(tok.id_to_bytes(i)))
    return out


def split_token(tok, ids: list[int], *, starting: int | None = None, ending: int | None = None) -> list[int]:
    """``ids`` with the token that starts (or ends) at a byte offset cut in two ordinary tokens:
    the same bytes, a segmentation the canonical encoder never makes (what a sampler can do)."""
    ends = offsets(tok, ids)
    k = ends.index(starting) if starting is not None else ends.index(ending) - 1
    data = tok.id_to_bytes(ids[k])
    for cut in range(1, len(data)):
        a, b = tok.bytes_to_id.get(data[:cut]), tok.bytes_to_id.get(data[cut:])
        if a is not None and b is not None:
            return ids[:k] + [a, b] + ids[k + 1:]
    raise AssertionError(f"token {data!r} has no split into two tokens")


def region_text(b, text: str, name: str) -> str:
    return "".join(text[s:e] for r, s, e in b.regions(text) if r == name)


# -- regions of a rendered output ---------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FAMILY))
def test_regions_cover_the_output_in_order_and_name_each_part(name, bound):
    b = bound[name]
    view = sampled(b)
    text = b.render(view)
    spans = b.regions(text)
    has = {"reasoning": b.profile.has_reasoning, "content": True, "tool_call": b.profile.has_tools, "end": True}
    assert [r for r, _, _ in spans] == [r for r in REGIONS if has[r]]
    assert spans[0][1] == 0 and spans[-1][2] == len(text) and all(x[2] == y[1] for x, y in zip(spans, spans[1:]))
    assert region_text(b, text, "content") == CONTENT
    assert region_text(b, text, "end") == b.profile.end
    if b.profile.has_reasoning:
        assert region_text(b, text, "reasoning") == (b.profile.reasoning_open or "") + REASONING + b.profile.reasoning_close
    if b.profile.has_tools:  # the whole calls section: wrapper literals and separator included
        calls = region_text(b, text, "tool_call")
        assert calls.startswith(b.profile.content_tools_separator + (b.profile.tools_begin or "<tool_call>"))
        assert ARGUMENTS in calls and calls.endswith(b.profile.tools_end or "</tool_call>")
    data = text.encode()
    assert [(r, data[s:e].decode()) for r, s, e in b.regions(data)] == [(r, text[s:e]) for r, s, e in spans]


@pytest.mark.parametrize("name", list(FAMILY))
def test_regions_agree_with_the_parse_on_many_real_views(name, bound):
    """Over the real-text views of tests/test_profiles.py (prose, code, unicode, 0-3 calls, cut
    while thinking): the content region is the parsed content, every call lies in the calls
    region, and the end region is there exactly when the output stopped."""
    from .test_profiles import views_for

    b = bound[name]
    for view in views_for(name, b):
        text = b.render(view)
        spans = b.regions(text)
        assert spans[0][1] == 0 and spans[-1][2] == len(text) and all(x[2] == y[1] for x, y in zip(spans, spans[1:]))
        assert region_text(b, text, "content") == (view.content or "")
        assert (region_text(b, text, "end") == b.profile.end) == (view.finish_reason in ("stop", "tool_calls"))
        calls = region_text(b, text, "tool_call")
        assert all(c.arguments in calls and c.name in calls for c in view.tool_calls or [])
        assert bool(calls) == bool(view.tool_calls)
        if view.reasoning_content is not None:
            assert view.reasoning_content in region_text(b, text, "reasoning")


def test_qwen3_finds_a_compact_tool_call_as_a_hermes_parser_does(bound):
    b = bound["qwen3"]
    text = '<think>\nok\n</think>\n\nSure.\n<tool_call>\n{"name":"f","arguments":{"x":1}}\n</tool_call><|im_end|>'
    view = b.parse_text(text)
    assert (view.content, view.tool_calls[0].name, view.tool_calls[0].arguments) == ("Sure.", "f", '{"x":1}')
    assert region_text(b, text, "tool_call") == '\n<tool_call>\n{"name":"f","arguments":{"x":1}}\n</tool_call>'


# -- the issue's case ---------------------------------------------------------------------------------
def test_issue_qwen3_compact_json_is_tool_call_format_not_whitespace_trim(bound):
    """The model sampled ``{"name":"f","arguments":{...}}``; the reconstruction renders the
    template's ``{"name": "f", "arguments": ...}``. The first divergence is a space inside the
    call's wrapper: the call's format, not a trim."""
    b = bound["qwen3"]
    text = '<think>\nCall f.\n</think>\n\n<tool_call>\n{"name":"f","arguments":{"x":1}}\n</tool_call><|im_end|>'
    truth = b.tok.encode(text)
    served = Response(content=None, reasoning_content="Call f.", finish_reason="tool_calls",
                      tool_calls=[ToolCall("call_0", "f", json.dumps({"x": 1}))])
    for row in (audit(b, truth, served), audit(b, truth)):
        assert (row.status, row.cause, row.region) == ("mismatch", "tool_call_format", "tool_call")
        assert row.causes == ["tool_call_format"] * len(row.causes)
        assert (row.truth_piece, row.recon_piece) == ('":"', '":')  # the template's space comes next
        assert row.context_recon.count('"name": "f"') == 1 and '"name":"f"' in row.context_truth


# -- labelled cases per profile: (deviation, profile) -> (cause, region), paired and roundtrip --------
def compact_json(b):
    """Arguments sampled compact; a server re-serializes them (json.dumps). qwen3 also compacts
    the template's JSON wrapper."""
    text = b.render(sampled(b, arguments=COMPACT))
    if b.profile.name == "qwen3":
        text = text.replace('{"name": "get_weather", "arguments": ', '{"name":"get_weather","arguments":')
    return b.tok.encode(text), sampled(b), ParseOptions(reserialize_arguments=True)


def content_trimmed_before_calls(b):
    """The content ends in whitespace right before the calls; the server strips it."""
    return b.tok.encode(b.render(sampled(b, content=CONTENT + "\n"))), sampled(b), ParseOptions(strip_content=True)


def content_trimmed_at_end(b):
    """The content ends in whitespace before the end token; the server strips it."""
    return (b.tok.encode(b.render(sampled(b, content=CONTENT + "\n\n", calls=False))), sampled(b, calls=False),
            ParseOptions(strip_content=True))


def content_trimmed_at_start(b):
    """The content starts with whitespace (after the reasoning, or at the start); the server strips it."""
    return (b.tok.encode(b.render(sampled(b, content="  " + CONTENT, calls=False))), sampled(b, calls=False),
            ParseOptions(strip_content=True))


def newline_after_close_dropped(b):
    """One more newline after the reasoning's close than the template writes; the server drops it."""
    return (b.tok.encode(b.render(sampled(b, content="\n" + CONTENT, calls=False))), sampled(b, calls=False),
            ParseOptions(drop_newline_after_close=True))


def resegmented_content_start(b):
    text = b.render(sampled(b, content="Paris " + CONTENT, calls=False))
    at = text.index("Paris " + CONTENT)
    return split_token(b.tok, b.tok.encode(text), starting=len(text[:at].encode())), sampled(b, content="Paris " + CONTENT, calls=False), None


def resegmented_reasoning_end(b):
    text = b.render(sampled(b, calls=False))
    at = text.index(REASONING) + len(REASONING)
    return split_token(b.tok, b.tok.encode(text), ending=len(text[:at].encode())), sampled(b, calls=False), None


def resegmented_arguments_start(b):
    text = b.render(sampled(b))
    at = text.index(ARGUMENTS)
    ids = b.tok.encode(text)
    starts = offsets(b.tok, ids)
    start = max(s for s in starts if s <= len(text[:at].encode()))  # the token holding the first byte
    return split_token(b.tok, ids, starting=start), sampled(b), None


def separator_missing_before_calls(b):
    """qwen3's template writes "\n" between the content and the first call; the model didn't."""
    text = b.render(sampled(b)).replace(CONTENT + "\n<tool_call>", CONTENT + "<tool_call>")
    return b.tok.encode(text), sampled(b), None


def cut_inside_a_call(b):
    """Cut at max_tokens inside the arguments: a server drops the unfinished call, so the
    reconstruction lacks it."""
    text = b.render(sampled(b))
    ids = b.tok.encode(text[: text.index(ARGUMENTS) + 10])
    return ids, b.parse_ids(ids), None


def wrong_special_in_calls(b):
    """The model closed the calls section with another grammar token's id (the one that opens
    it): the calls' text agrees, one special id differs."""
    close = b.profile.tools_end or "</tool_call>"
    opening = b.profile.tools_begin or "<tool_call>"
    ids = b.tok.encode(b.render(sampled(b)))
    k = len(ids) - 1 - ids[::-1].index(b.special_ids[close])
    return ids[:k] + [b.special_ids[opening]] + ids[k + 1:], sampled(b), None


def renumbered_ids(b):
    """Kimi's call ids are grammar (functions.NAME:INDEX); a server renumbers them call_0."""
    view = sampled(b)
    served = replace(view, tool_calls=[replace(view.tool_calls[0], id="call_0")])
    return b.tok.encode(b.render(view)), served, ParseOptions(renumber_ids=True)


def special_text_in_content(b):
    """The content spells the end token's text; re-encoded, it becomes the special id."""
    content = f"Chat templates close a turn with {b.profile.end} and nothing else."
    view = sampled(b, content=content, calls=False)
    parts = b.render_parts(view)
    truth = [i for part in parts for i in ([b.special_ids[part.text]] if part.kind == "special"
                                           else b.tok.encode(part.text, allow_special=False))]
    return truth, view, None


def missing_end_token(b):
    """Cut right before the end token (max_tokens), but the server says it stopped."""
    view = sampled(b, calls=False)
    return b.tok.encode(b.render(view))[:-1], view, None


def missing_end_token_after_calls(b):
    view = sampled(b)
    return b.tok.encode(b.render(view))[:-1], view, None


def wrong_end_token(b):
    """The model ended with <|endoftext|>; the grammar's end is <|im_end|>."""
    view = sampled(b, calls=False)
    return b.tok.encode(b.render(view))[:-1] + [b.tok.added_by_content["<|endoftext|>"].id], view, None


ALL, REASONING_PROFILES = tuple(FAMILY), ("qwen3", "deepseek", "kimi-k2")
#: deviation -> (profiles, cause, region, the region for a profile where it differs)
CASES = {
    compact_json: (TOOLS, "tool_call_format", "tool_call", {}),
    content_trimmed_before_calls: (TOOLS, "whitespace_trim", "content", {}),
    content_trimmed_at_end: (ALL, "whitespace_trim", "content", {}),
    content_trimmed_at_start: (ALL, "whitespace_trim", "content", {}),
    newline_after_close_dropped: (REASONING_PROFILES, "whitespace_trim", "content", {"qwen3": "reasoning"}),
    resegmented_content_start: (ALL, "non_canonical_bpe", "content", {}),
    resegmented_reasoning_end: (REASONING_PROFILES, "non_canonical_bpe", "reasoning", {}),
    resegmented_arguments_start: (TOOLS, "non_canonical_bpe", "tool_call", {}),
    separator_missing_before_calls: (("qwen3",), "tool_call_format", "tool_call", {}),
    cut_inside_a_call: (TOOLS, "tool_call_format", "tool_call", {}),
    renumbered_ids: (("kimi-k2",), "tool_call_format", "tool_call", {}),
    wrong_special_in_calls: (TOOLS, "special_token_mismatch", "tool_call", {}),
    special_text_in_content: (ALL, "special_text_collision", "content", {}),
    missing_end_token: (ALL, "missing_end_token", "end", {}),
    missing_end_token_after_calls: (TOOLS, "missing_end_token", "end", {}),
    wrong_end_token: (("chatml", "qwen3"), "special_token_mismatch", "end", {}),
}
LABELLED = [pytest.param(case, name, id=f"{case.__name__}-{name}") for case, (names, *_) in CASES.items() for name in names]
#: paired only: a roundtrip parse can't see these (ids alone say the sample was cut, or ended otherwise)
PAIRED_ONLY = {missing_end_token, missing_end_token_after_calls, wrong_end_token, wrong_special_in_calls}


@pytest.mark.parametrize("case, name", LABELLED)
def test_cause_and_region_of_each_deviation(case, name, bound):
    b = bound[name]
    _, cause, region, special = CASES[case]
    truth, served, options = case(b)
    exact = b.tok.encode(b.render(served))
    assert truth != exact  # the deviation is real: the template's ids differ from the sampled ones
    row = audit(b, truth, served)
    assert (row.status, row.cause, row.region) == ("mismatch", cause, special.get(name, region)), row.to_dict()
    if case not in PAIRED_ONLY:
        row = audit(b, truth, None, options)
        assert (row.status, row.cause, row.region) == ("mismatch", cause, special.get(name, region)), row.to_dict()
        plain = audit(b, truth)  # a server without that deviation gives back the sampled text...
        if case is compact_json and name == "qwen3":  # ...except qwen3's wrapper, which is the template's
            assert (plain.cause, plain.region) == ("tool_call_format", "tool_call")
        elif options is not None:
            assert plain.status == "exact"


# -- the region column flows ---------------------------------------------------------------------------
def test_real_samples_region_by_cause(tokenizers):
    """The bundled SmolLM2 samples (chatml: content and end only), roundtrip: every mismatch has a
    region, and the table counts them by region and cause."""
    b = load_profile("chatml").bind(tokenizers["smollm2"])
    records = [r for name in ("smollm2-t0.7", "smollm2-t1.3") for r in read_records(ROOT / "data" / f"{name}.jsonl").records]
    rows = audit_records(records, b, "concat", mode="roundtrip")
    mism = rows[rows["status"] == "mismatch"]
    assert len(mism) == 149 and mism["region"].isin(["content", "end"]).all()
    assert rows.loc[rows["status"] == "exact", "region"].isna().all()
    table = stats.region_table(rows)
    assert int(table.values.sum()) == 149
    assert table.loc["content", "non_canonical_bpe"] == (mism["cause"] == "non_canonical_bpe").sum()


def test_region_column_through_the_engine_parquet_and_filters(bound, tmp_path):
    """Records of each labelled qwen3 case, audited by the streaming engine in two worker
    processes into samples.parquet: the same regions and causes as in memory; rows filter by region."""
    from recon import views
    from recon.audit.engine import audit_files
    from recon.samples.records import write_records

    b = bound["qwen3"]
    records = []
    for case, (names, *_) in CASES.items():
        if "qwen3" in names:
            truth, served, _ = case(b)
            records += [Record(f"{case.__name__}-paired", "d", truth, served), Record(f"{case.__name__}-ids", "d", truth)]
    write_records(records, tmp_path / "cases.jsonl")
    run = audit_files([tmp_path / "cases.jsonl"], tokenizer="qwen3.6", profile="qwen3", method="concat",
                      rows_path=tmp_path / "samples.parquet", chunk_size=5, workers=2, progress=False)
    assert run.summary["samples"] == len(records)
    stored = pd.read_parquet(tmp_path / "samples.parquet")
    memory = audit_records(records, b, "concat")
    assert stored["id"].tolist() == memory["id"].tolist()
    assert stored["region"].tolist() == memory["region"].tolist() and stored["cause"].tolist() == memory["cause"].tolist()
    calls = views.filter_rows(stored, status="mismatch", region="tool_call")
    assert set(calls["cause"]) == {"tool_call_format", "non_canonical_bpe", "special_token_mismatch"}
    assert "compact_json-paired" in set(calls["id"]) and "content_trimmed_before_calls-paired" not in set(calls["id"])
