"""Rows that trainers read, read by the trainers' own loading code.

``recon export --format speculators`` and ``--format specforge`` write one row per kept generation:
``input_ids`` = the prompt's ids then the sampled ids, ``loss_mask`` 0 on the prompt and 1 on
exactly the sampled ids. The oracles:

* the sample file itself, read with ``json`` (not recon): the engine's ``prompt_ids`` and
  ``output_ids`` of each record, and SmolLM2's ``<|im_end|>`` = 2 (its GGUF, by hand);
* vLLM speculators 0.9.0's ``prepare_data`` path (``load_raw_dataset`` +
  ``build_speculator_training_dataset``: pre-tokenized rows pass through, cut to ``max_length``,
  dropped under ``minimum_valid_tokens``), run in the engine's venv where it is installed
  (``recon setup vllm``: its torch 2.13.0 and transformers are the ones speculators pins);
* SpecForge 0.2.0's ``specforge/data/prompt_builder.py`` (``prepare_prompt_tasks``: a
  pre-tokenized JSONL on its standard-library-only path, which checks both columns are present,
  of equal length, one-dimensional, integer ``input_ids``, 0/1 ``loss_mask``, non-empty, cuts to
  ``max_length`` and drops rows with fewer than ``min_loss_tokens``), loaded alone from the
  published wheel: SpecForge itself pins torch 2.11 and sglang, so the package is not installed.

Outside CI a trainer that can't be had here is a skip that says why; under CI it is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from recon.cli import main

from tests.conftest import ROOT

DATA = ROOT / "data" / "smollm2-t1.3.jsonl"
IM_END = 2  # SmolLM2's <|im_end|>, read off its GGUF by hand (shared/reference/README.md)
SPECFORGE = "specforge==0.2.0"


def _unavailable(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"under CI every trainer must load: {why}")
    pytest.skip(why)


def _export(tmp_path: Path, fmt: str, *extra: str, data: Path = DATA) -> Path:
    out = tmp_path / f"{fmt}.jsonl"
    assert main(["export", str(data), "--tokenizer", "smollm2", "--profile", "chatml", "--format", fmt,
                 "--out", str(out), "--workers", "1", *extra]) == 0
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _records(path: Path = DATA) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return _export(tmp_path_factory.mktemp("export"), "speculators")


def test_rows_are_the_engines_prompt_then_the_sampled_ids(exported):
    rows, records = _rows(exported), _records()
    assert len(rows) == len(records)  # every bundled sample is exact: every one has a row
    for row in rows:
        rec = records[row["id"]]
        assert row["input_ids"] == rec["prompt_ids"] + rec["output_ids"]
        assert row["loss_mask"] == [0] * len(rec["prompt_ids"]) + [1] * len(rec["output_ids"])
        assert row["prompt_source"] == "engine" and row["ids_source"] == "ground_truth"
    stopped = [r for r in rows if records[r["id"]]["response"]["finish_reason"] == "stop"]
    assert stopped and all(r["input_ids"][-1] == IM_END and r["loss_mask"][-1] == 1 for r in stopped)


def test_a_rendered_prompt_is_what_the_engine_saw(tmp_path):
    """Records without the engine's ids get the prompt from their messages and SmolLM2's template;
    the bundled records' engine ids are the oracle."""
    records = list(_records().values())[:20]
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "prompt_ids"}) + "\n" for r in records))
    rows = _rows(_export(tmp_path, "speculators", data=bare))
    assert [r["prompt_source"] for r in rows] == ["rendered"] * len(records)
    assert [r["input_ids"] for r in rows] == [r["prompt_ids"] + r["output_ids"] for r in records]


def test_a_sample_without_a_prompt_gets_no_row_and_is_counted(tmp_path, capsys):
    records = list(_records().values())[:3]
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("prompt_ids", "messages")}) + "\n"
                            for r in records[:2]) + json.dumps(records[2]) + "\n")
    rows = _rows(_export(tmp_path, "speculators", data=bare))
    assert [r["id"] for r in rows] == [records[2]["id"]]
    assert "no_prompt 2" in capsys.readouterr().out


# -- speculators' own loader ------------------------------------------------------------------------
SPECULATORS_LOAD = """
import json, sys
import tokenizers
from transformers import PreTrainedTokenizerFast
from speculators.data_generation.preprocessing import build_speculator_training_dataset, load_raw_dataset
raw, _ = load_raw_dataset(sys.argv[1])
# the processor is only asked whether it is multimodal; pre-tokenized rows are never re-encoded
tok = PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0}, unk_token="a")))
ds = build_speculator_training_dataset(raw, tok, max_length=int(sys.argv[2]), num_proc=1,
                                       minimum_valid_tokens=int(sys.argv[3]))
print(json.dumps([{"input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist()} for r in ds]))
"""


@pytest.fixture(scope="module")
def speculators_python(tmp_path_factory) -> list[str]:
    from recon.server import vllm

    python = vllm.EngineHome.resolve().python
    if not python.exists():
        _unavailable(f"no engine venv at {python.parent.parent}: run `recon setup vllm` (it installs speculators too)")
    probe = subprocess.run([str(python), "-c", "import speculators.data_generation.preprocessing"],
                           capture_output=True, text=True, env=_clean_env(tmp_path_factory.mktemp("hf")))
    if probe.returncode:
        _unavailable(f"speculators does not import in {python}: {probe.stderr.strip().splitlines()[-1:]}")
    return [str(python)]


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(home)}


def _speculators(python: list[str], path: Path, max_length: int, min_tokens: int, home: Path) -> list[dict]:
    done = subprocess.run([*python, "-c", SPECULATORS_LOAD, str(path), str(max_length), str(min_tokens)],
                          capture_output=True, text=True, env=_clean_env(home), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_speculators_prepare_data_reads_the_rows_as_written(exported, speculators_python, tmp_path):
    loaded = _speculators(speculators_python, exported, 4096, 1, tmp_path)
    assert loaded == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in _rows(exported)]


def test_cut_and_drop_as_speculators_does(exported, speculators_python, tmp_path):
    """recon's --max-length / --min-loss-tokens give the rows speculators makes of the uncut export."""
    cut = _rows(_export(tmp_path, "speculators", "--max-length", "60", "--min-loss-tokens", "8"))
    loaded = _speculators(speculators_python, exported, 60, 8, tmp_path)
    assert len(cut) < len(_rows(exported))  # the cut drops some: the test can fail
    assert loaded == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in cut]


# -- SpecForge's prompt builder -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def prompt_builder(tmp_path_factory):
    """``specforge/data/prompt_builder.py`` from the published wheel, imported alone (its pre-tokenized
    path needs nothing but the standard library)."""
    where = Path(os.environ.get("RECON_WHEELS", tmp_path_factory.mktemp("wheels")))
    wheels = sorted(where.glob("specforge-0.2.0-*.whl"))
    if not wheels:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(where), SPECFORGE],
                              capture_output=True, text=True)
        wheels = sorted(where.glob("specforge-0.2.0-*.whl"))
        if not wheels:
            _unavailable(f"pip download {SPECFORGE} failed: {done.stderr.strip().splitlines()[-1:]}")
    source = tmp_path_factory.mktemp("specforge") / "prompt_builder.py"
    with zipfile.ZipFile(wheels[0]) as wheel:
        source.write_bytes(wheel.read("specforge/data/prompt_builder.py"))
    spec = importlib.util.spec_from_file_location("specforge_prompt_builder", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _specforge(module, path: Path, max_length: int, min_tokens: int) -> list[dict]:
    tasks = module.prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length, is_preformatted=False,
                                        train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None,
                                        min_loss_tokens=min_tokens)
    return [t["payload"] for t in tasks]


def test_specforge_prompt_builder_reads_the_rows_as_written(tmp_path, prompt_builder):
    path = _export(tmp_path, "specforge")
    assert _specforge(prompt_builder, path, 4096, 1) == [
        {"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in _rows(path)]


def test_cut_and_drop_as_specforge_does(tmp_path, prompt_builder):
    whole = _export(tmp_path, "specforge")
    cut = _rows(_export(tmp_path, "specforge", "--max-length", "60", "--min-loss-tokens", "8"))
    assert _specforge(prompt_builder, whole, 60, 8) == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}
                                                         for r in cut]


def test_specforge_refuses_what_recon_must_never_write(tmp_path, prompt_builder):
    """The checks are real: a row of unequal lengths or a mask that is not 0/1 is refused."""
    bad = tmp_path / "bad.jsonl"
    for row in ({"input_ids": [1, 2], "loss_mask": [0]}, {"input_ids": [1, 2], "loss_mask": [0, 2]}):
        bad.write_text(json.dumps(row) + "\n")
        with pytest.raises(ValueError):
            _specforge(prompt_builder, bad, 10, 1)


def test_specforge_wants_jsonl(tmp_path, capsys):
    assert main(["export", str(DATA), "--tokenizer", "smollm2", "--profile", "chatml", "--format", "specforge",
                 "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "JSONL" in err
