"""Notebooks run headless with every params file; their recorded values are checked.
(nbval checks the committed notebooks themselves: `pytest` collects notebooks/*.ipynb.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recon.notebook.report import load_params, notebook_parameters, read_records

from .conftest import ROOT

PARAMS = sorted((ROOT / "params").glob("*.yaml"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_params_and_notebooks():
    assert {p.stem for p in PARAMS} >= {"smollm2", "deepseek-v4", "qwen3.6", "cl100k", "kimi-k2.5"}
    assert {"01_token_discovery", "02_roundtrip_audit", "03_mismatch_stats"} <= {n.stem for n in NOTEBOOKS}


@pytest.mark.parametrize("params_path", PARAMS, ids=lambda p: p.stem)
def test_params_keys_exist_in_the_notebooks_parameters_cell(params_path):
    """papermill only warns on unknown parameters; a typo would silently run the defaults."""
    params = load_params(params_path, expand=False)
    for name, values in params.notebooks.items():
        notebook = ROOT / "notebooks" / f"{name}.ipynb"
        assert notebook.is_file(), f"{params_path.name}: no notebook {name}"
        unknown = set(values) - set(notebook_parameters(notebook))
        assert not unknown, f"{params_path.name}: {sorted(unknown)} not parameters of {name}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_one_tagged_parameters_cell_with_literal_defaults(notebook):
    import ast

    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    for node in ast.parse(tagged[0].source).body:
        assert isinstance(node, ast.Assign)
        ast.literal_eval(node.value)  # raises if a default is not a literal
    assert nb.metadata["kernelspec"]["name"] == "python3"


def run_report(tmp_path: Path, *params: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recon.cli", "report", *params, "--out", str(tmp_path), "--no-html"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=900,
    )


def test_report_runs_every_params_file(tmp_path, kimi_dir):
    run = run_report(tmp_path, env={"KIMI_K25_DIR": str(kimi_dir)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "skipped params/vllm-live.yaml: no engine answers at http://127.0.0.1:8100/v1" in run.stdout
    for params_path in PARAMS:
        notebooks = yaml.safe_load(params_path.read_text())["notebooks"]
        if "01_token_discovery" not in notebooks:
            continue
        expected = notebooks["01_token_discovery"]["expected_ids"]
        records = read_records(tmp_path / params_path.stem / "01_token_discovery.ipynb")
        assert records["verdict"]["level"] == "PASS", (params_path.stem, records["verdict"])
        assert {r["content"]: r["actual_id"] for r in records["expected"]} == expected
        assert all(records["specials"][text] == i for text, i in expected.items())
    # the audit notebooks on the bundled data: counts agree with a plain decode -> encode comparison
    audit = read_records(tmp_path / "smollm2" / "02_roundtrip_audit.ipynb")
    assert audit["plain_exact"] == audit["roundtrip_exact"] == audit["summary"]["exact"] == 28
    assert audit["drilldown"].startswith("sample p001-0 differs at position 29 of 96: original 'it' (269)")
    compared = read_records(tmp_path / "smollm2" / "03_mismatch_stats.ipynb")
    assert compared["summary"]["exact"] == 171 and compared["summary"]["mismatched"] == 149
    assert compared["method_comparison"]["logprobs"] == {"smollm2-t0.7": 1.0, "smollm2-t1.3": 1.0}
    # the recovery section: docs/benchmarks.md's table, from the bundled held-out rows
    recovery = compared["recovery"]
    assert (recovery["all"]["non-canonical"], recovery["all"]["recovered exactly"], recovery["all"]["exact made wrong"]) == (129, 66, 0)
    assert recovery["heldout-t0.7"]["recovered exactly"] == 6 and recovery["heldout-t1.3"]["recovered exactly"] == 60
    # 05: the prefix audit of multi-turn trajectories, one params file per template family
    kimi = read_records(tmp_path / "conversations-kimi-k2-thinking" / "05_conversations.ipynb")
    assert kimi["conversations"]["by_cause"] == {"reasoning_dropped": 3, "tool_arguments_reserialized": 2}
    assert kimi["drilldown"].startswith("kimi-k2-thinking-math-1 (turn 1 of kimi-k2-thinking-math) breaks at token 36")
    served = read_records(tmp_path / "conversations-smollm2" / "05_conversations.ipynb")["conversations"]
    assert (served["boundaries"], served["prefix_kept"], served["by_cause"]) == (17, 13, {"retokenized": 4})
    for family in ("qwen3", "deepseek-v3.1"):
        found = read_records(tmp_path / f"conversations-{family}" / "05_conversations.ipynb")["conversations"]
        assert found["boundaries"] == 6 and found["by_cause"].get("reasoning_dropped", 0) >= 4


def test_report_skips_a_user_tokenizer_that_is_not_configured(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KIMI_K25_DIR"}
    run = subprocess.run(
        [sys.executable, "-m", "recon.cli", "report", "--out", str(tmp_path), "--no-html"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=900,
    )
    assert run.returncode == 0
    assert "skipped params/kimi-k2.5.yaml: notebooks.01_token_discovery.tokenizer uses ${KIMI_K25_DIR}, which is not set" in run.stdout
    assert not (tmp_path / "kimi-k2.5").exists()


def test_a_wrong_expected_id_stops_the_report(tmp_path, kimi_dir):
    params = tmp_path / "kimi-wrong.yaml"
    params.write_text(
        "notebooks:\n  01_token_discovery:\n"
        f"    tokenizer: {kimi_dir}\n"
        "    expected_ids: {'<|im_end|>': 163533}\n"
    )
    run = run_report(tmp_path, str(params))
    assert run.returncode == 1
    assert "FAILED" in run.stdout and "SpecialTokenMismatch" in run.stdout
    assert "expected id 163533, but the tokenizer has it at 163586" in run.stdout
    assert (tmp_path / "kimi-wrong" / "01_token_discovery.ipynb").is_file()  # the record of the failed run


def test_empirical_end_token_check_in_the_notebook(tmp_path, tokenizers):
    import json

    tok = tokenizers["smollm2"]
    samples = tmp_path / "samples.jsonl"
    texts = ["Paris is the capital of France.", "Here is some code:\n```python\nprint(1)\n```", "Hi!"]
    lines = [json.dumps({"id": str(k), "output_ids": ids + [2]}) for k, ids in enumerate(tok.encode_batch(texts))]
    lines.insert(1, json.dumps({"id": "bad", "output_ids": [1, -4]}))
    samples.write_text("\n".join(lines) + "\n")
    params = tmp_path / "smol-empirical.yaml"
    params.write_text(
        "notebooks:\n  01_token_discovery:\n    tokenizer: smollm2\n"
        f"    samples_path: {samples}\n    end_token: '<|im_end|>'\n"
    )
    run = run_report(tmp_path, str(params))
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "smol-empirical" / "01_token_discovery.ipynb"
    assert read_records(out)["end_check"] == {"end_id": 2, "samples": 3, "share": 1.0, "ok": True}
    assert f"{samples}, line 2, field output_ids: item 1 is -4, outside the vocabulary" in out.read_text()
