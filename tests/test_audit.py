"""Audits: every cause backed by a real example, modes, errors, statistics, CLI and export."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recon import stats
from recon.audit import CAUSES, audit_records, describe, drilldown
from recon.samples.export import export_table
from recon.audit.profiles import Profile, load_profile
from recon.samples.records import Record, Response, ToolCall, read_records

from .conftest import ROOT
from .test_cli import recon

DATA = ROOT / "data"


@pytest.fixture(scope="module")
def chatml(tokenizers):
    return load_profile("chatml").bind(tokenizers["smollm2"])


@pytest.fixture(scope="module")
def bundled():
    return {name: {r.id: r for r in read_records(DATA / f"{name}.jsonl").records} for name in ("smollm2-t0.7", "smollm2-t1.3")}


def one(rows: pd.DataFrame) -> pd.Series:
    assert len(rows) == 1
    return rows.iloc[0]


# -- each cause, from a real tokenizer and (where the bundle has one) a real sample --------------------
def test_non_canonical_bpe_the_nor_sample(chatml, bundled):
    rec = bundled["smollm2-t0.7"]["p016-0"]  # "What does the logical operator NOR do?"
    row = one(audit_records([rec], chatml, "concat"))
    assert (row.status, row.cause, row["mode"]) == ("mismatch", "non_canonical_bpe", "paired")
    assert (row.truth_piece, row.recon_piece) == ("ĠN", "ĠNOR")
    line = describe(row, chatml.tok)
    assert line.startswith(f"sample p016-0 differs at position {row.first_diff} of {len(rec.output_ids)}: original ' N' (")
    assert "reconstruction ' NOR' (" in line
    table = drilldown(row, chatml.tok)
    assert table.loc[table["differs"], "position"].iloc[0] == row.first_diff


def test_invalid_utf8_a_sample_cut_inside_a_character(chatml, bundled):
    rec = bundled["smollm2-t0.7"]["p005-1"]  # five fruits with emoji, cut at max_new_tokens
    row = one(audit_records([rec], chatml, "concat"))
    assert (row.status, row.cause) == ("mismatch", "invalid_utf8")
    data = b"".join(chatml.tok.id_to_bytes(i) for i in rec.output_ids)
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    assert rec.response.finish_reason == "length" and rec.response.content.endswith("\ufffd")


def test_special_text_collision(chatml):
    tok = chatml.tok
    text = "To end a turn, the template writes <|im_end|> after the message."
    truth = tok.encode(text, allow_special=False) + [chatml.end_id]  # the model spelled it out
    rec = Record("c1", "d", truth, Response(content=text, finish_reason="stop"))
    row = one(audit_records([rec], chatml, "concat"))
    assert (row.status, row.cause) == ("mismatch", "special_text_collision")
    assert "<|im_end|>" in row.recon_pieces and "<|im_end|>" not in row.truth_pieces
    assert one(audit_records([rec], chatml, "segments")).status == "exact"  # segments keep the text as text


def test_special_token_mismatch_wrong_end_token(chatml):
    tok = chatml.tok
    content = "Paris is the capital of France."
    eot = tok.added_by_content["<|endoftext|>"].id
    rec = Record("s1", "d", tok.encode(content) + [eot], Response(content=content, finish_reason="stop"))
    row = one(audit_records([rec], chatml, "concat"))
    assert (row.cause, row.truth_piece, row.recon_piece) == ("special_token_mismatch", "<|endoftext|>", "<|im_end|>")


def test_whitespace_trim_an_api_that_strips(chatml, bundled):
    rec = bundled["smollm2-t0.7"]["p024-3"]  # a markdown table ending in "\n"
    stripped = replace(rec, response=replace(rec.response, content=rec.response.content.strip(), logprobs=None))
    row = one(audit_records([stripped], chatml, "concat"))
    assert (row.status, row.cause) == ("mismatch", "whitespace_trim")
    assert one(audit_records([rec], chatml, "concat")).status == "exact"


def test_tool_call_format_reserialized_arguments_and_renumbered_ids(tokenizers, kimi):
    deepseek = load_profile("deepseek").bind(tokenizers["deepseek-v4"])
    sampled = Response(content=None, reasoning_content="Look it up.", finish_reason="tool_calls",
                       tool_calls=[ToolCall("call_0", "get_weather", '{"city":"Paris","unit":"°C"}')])
    truth = deepseek.tok.encode(deepseek.render(sampled))
    served = replace(sampled, tool_calls=[ToolCall("call_0", "get_weather", json.dumps({"city": "Paris", "unit": "°C"}))])
    row = one(audit_records([Record("t1", "d", truth, served)], deepseek, "concat"))
    assert (row.status, row.cause) == ("mismatch", "tool_call_format")
    k2 = load_profile("kimi-k2").bind(kimi)
    sampled = replace(sampled, tool_calls=[ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}')])
    truth = kimi.encode(k2.render(sampled))
    renumbered = replace(sampled, tool_calls=[ToolCall("call_0", "get_weather", '{"city": "Paris"}')])
    row = one(audit_records([Record("t2", "d", truth, renumbered)], k2, "concat"))
    assert (row.status, row.cause) == ("mismatch", "tool_call_format")


def test_missing_end_token_truncated_sample(chatml, bundled):
    rec = bundled["smollm2-t0.7"]["p003-0"]  # cut at max_new_tokens: no <|im_end|>
    assert rec.output_ids[-1] != chatml.end_id
    claims_stop = replace(rec, response=replace(rec.response, finish_reason="stop", logprobs=None))
    row = one(audit_records([claims_stop], chatml, "concat"))
    assert (row.cause, row.truth_piece, row.recon_piece) == ("missing_end_token", "(end)", "<|im_end|>")


def test_other_an_api_that_changed_the_text(chatml, bundled):
    rec = bundled["smollm2-t0.7"]["p003-0"]
    edited = replace(rec, response=replace(rec.response, content=rec.response.content.replace("the", "teh", 1), logprobs=None))
    assert one(audit_records([edited], chatml, "concat")).cause == "other"


def test_every_cause_name_is_known():
    assert CAUSES == ("non_canonical_bpe", "invalid_utf8", "special_text_collision", "special_token_mismatch",
                      "whitespace_trim", "tool_call_format", "missing_end_token", "other")


# -- modes, errors ------------------------------------------------------------------------------------
def test_modes_follow_from_the_record(chatml, bundled):
    rec = bundled["smollm2-t0.7"]["p003-1"]
    rows = audit_records([rec, Record(rec.id + "-ids", "d", rec.output_ids), Record(rec.id + "-api", "d", None, rec.response)], chatml, "concat")
    assert rows["mode"].tolist() == ["paired", "roundtrip", "reconstruct-only"]
    assert rows["status"].tolist() == ["exact", "exact", "unverified"]
    assert "truncated" in rows["flags"].iloc[2]


def test_a_record_that_fails_is_reported_and_the_rest_go_on(tokenizers):
    tok = tokenizers["cl100k"]
    bound = Profile("plain", end="<|endoftext|>").bind(tok)
    records = [Record("a", "d", tok.encode("hello")), Record("b", "d", [15339, 100256, 1917]), Record("c", "d", tok.encode("world"))]
    rows = audit_records(records, bound, "concat")
    assert rows["status"].tolist() == ["exact", "error", "exact"]
    assert "output_ids[1] = 100256 is not a token of cl100k" in rows["error"].iloc[1]


END_TOKENS = {"smollm2": "<|im_end|>", "deepseek-v4": "<｜end▁of▁sentence｜>", "qwen3.6": "<|im_end|>", "cl100k": "<|endoftext|>"}


@pytest.mark.parametrize("name", sorted(END_TOKENS))
def test_property_random_ids_never_crash_the_audit(name, tokenizers):
    tok = tokenizers[name]
    bound = Profile("plain", end=END_TOKENS[name]).bind(tok)
    specials = [t.id for t in tok.added_tokens]

    @settings(max_examples=int(os.environ.get("RECON_HYPOTHESIS_EXAMPLES", 60)), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.lists(st.one_of(st.integers(0, tok.vocab_size - 1), st.sampled_from(specials)), min_size=1, max_size=40),
                    min_size=1, max_size=6))
    def check(batch):
        records = [Record(str(k), "random", ids) for k, ids in enumerate(batch)]
        rows = audit_records(records, bound, "concat", keep_ids=True)
        assert len(rows) == len(records)
        assert set(rows["status"]) <= {"exact", "mismatch", "error"}
        for rec, status, recon_ids, error in zip(records, rows["status"], rows["recon_ids"], rows["error"]):
            assert (status == "exact") == (recon_ids == rec.output_ids)
            assert (status == "error") == pd.notna(error)
            if status == "error":
                assert any(i in tok.gap_ids for i in rec.output_ids)
            else:  # the oracle: the native encoder's own round trip (one text, its own single encode)
                assert recon_ids == tok.encode(tok.decode(rec.output_ids))
    check()


# -- statistics, CLI, export --------------------------------------------------------------------------
def test_counts_agree_with_a_plain_decode_encode_comparison(chatml, bundled):
    records = [r for d in bundled.values() for r in d.values()]
    rows = audit_records(records, chatml, "concat", mode="roundtrip")
    plain = sum(r.output_ids == chatml.tok.encode(chatml.tok.decode(r.output_ids)) for r in records)
    summary = stats.summary(rows)
    assert summary["exact"] == plain == 171 and summary["mismatched"] == 149
    assert sum(summary["by_cause"].values()) == summary["mismatched"]
    assert {k: v["exact"] for k, v in summary["datasets"].items()} == {"smollm2-t0.7": 143, "smollm2-t1.3": 28}
    assert stats.cause_table(rows).values.sum() == 149
    assert (stats.divergence_positions(rows)["rel_pos"].between(0, 1)).all()


def test_method_comparison_on_real_samples(chatml, bundled):
    from recon.audit import audit_methods

    records = [r for d in bundled.values() for r in d.values()]
    table = stats.method_comparison(audit_methods(records, chatml, ("concat", "logprobs")))
    assert table["logprobs"].tolist() == [1.0, 1.0]
    assert table["concat"].round(4).tolist() == [0.8938, 0.175]


def test_audit_cli_json_summary(tmp_path):
    run = recon("audit", "data/smollm2-t0.7.jsonl", "data/smollm2-t1.3.jsonl", "--tokenizer", "smollm2",
                "--profile", "chatml", "--method", "concat", "--json", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert {"samples", "exact", "mismatched", "errors", "by_cause", "datasets"} <= set(summary)
    assert (summary["samples"], summary["exact"], summary["mismatched"], summary["errors"]) == (320, 171, 149, 0)
    assert summary["datasets"]["smollm2-t1.3"]["by_cause"] == {"non_canonical_bpe": 130, "invalid_utf8": 2}
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    assert len(samples) == 320 and (samples["status"] == "exact").sum() == 171
    assert json.loads((tmp_path / "summary.json").read_text())["exact"] == 171


def test_audit_cli_unusable_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\nnot json\n')
    run = recon("audit", str(bad), "--tokenizer", "smollm2", "--profile", "chatml")
    assert run.returncode == 2 and "recon: error: no usable records" in run.stderr and "Traceback" not in run.stderr


def test_export_policies(chatml, bundled, tmp_path):
    records = list(bundled["smollm2-t0.7"].values())[:40] + [Record("api-only", "d", None, Response(content="Hi", finish_reason="stop"))]
    rows = audit_records(records, chatml, "concat", keep_ids=True)
    exact = int((rows["status"] == "exact").sum())
    kept = {p: int(export_table(records, rows, p)["keep"].sum()) for p in ("exact-only", "fallback", "drop-mismatches")}
    assert kept == {"exact-only": exact, "fallback": 41, "drop-mismatches": exact + 1}
    table = export_table(records, rows, "fallback")
    assert table["ids"].iloc[0] == records[0].output_ids and table["ids_source"].iloc[-1] == "reconstruction"
    run = recon("export", "data/smollm2-t1.3.jsonl", "--tokenizer", "smollm2", "--profile", "chatml", "--method", "concat",
                "--policy", "exact-only", "--out", str(tmp_path / "train.parquet"))
    assert "wrote 160 samples" in run.stdout and "28 kept under policy exact-only" in run.stdout
    assert pd.read_parquet(tmp_path / "train.parquet")["keep"].sum() == 28


def test_first_cause_is_the_earliest_divergence(chatml, bundled):
    """A sample re-segmented early and cut inside a character at the end: both found, in order."""
    rec = bundled["smollm2-t1.3"]["p008-0"]
    row = one(audit_records([rec], chatml, "concat", mode="roundtrip"))
    assert row.causes == ["non_canonical_bpe", "invalid_utf8"] and row.cause == "non_canonical_bpe" and row.first_diff == 4


def test_stretches_found_for_a_whole_batch_match_the_walk_one_pair_at_a_time(tokenizers, bundled):
    from recon.audit.classify import _resegmented, _resegmented_batch

    tok = tokenizers["smollm2"]
    truths = [r.output_ids for d in bundled.values() for r in d.values()]
    pairs = [(t, r) for t, r in zip(truths, tok.encode_batch(tok.decode_batch(truths))) if t != r]
    a, b = tok.encode("日本"), tok.encode(" café")
    pairs += [([5], []), ([], [5]), (a, a[::-1]), (a + b, b + a), ([100, 200], [100, 201])]  # different bytes: None
    got = _resegmented_batch(tok, pairs)
    want = [_resegmented(tok, t, r) if tok.ids_bytes(t) == tok.ids_bytes(r) else None for t, r in pairs]
    assert got == want
    assert got[-5:] == [None] * 5 and sum(g is not None for g in got) == 136  # 136 real pure re-segmentations
    assert _resegmented_batch(tok, pairs[-5:]) == [None] * 5  # a batch where no pair re-segments
