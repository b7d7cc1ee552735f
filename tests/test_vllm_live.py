"""recon against a real vLLM engine (vLLM 0.32.0 on the CPU, SmolLM2-135M-Instruct, started once per
run by the ``vllm_engine`` fixture of tests/conftest.py). The engine's output is the oracle: what
recon imports, collects and scores must be the engine's ids and text."""

from __future__ import annotations

import json

import pytest

from recon.samples.records import read_records
from recon.server.client import chat

from .conftest import DATA, ROOT
from .test_cli import recon
from .vllm_cases import (
    CASES,
    CHAT_CASES,
    MODEL,
    RECORDED,
    ask,
    check_chat_import,
    check_multiturn,
    engine_text,
    joined_stream,
    multiturn,
    post,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def url(vllm_engine) -> str:
    return vllm_engine.url


@pytest.mark.parametrize("name", CHAT_CASES)
def test_recon_import_vllm_on_live_answers(url, name, tokenizers, tmp_path):
    status, answer = ask(url, name)
    assert status == 200, answer
    check_chat_import(answer, tokenizers["smollm2"], tmp_path, name)


def test_streamed_and_whole_answers_carry_the_same_ids(url):
    _, whole = ask(url, "chat")
    _, chunks = ask(url, "chat_stream")
    joined = joined_stream(chunks)
    assert joined["prompt_token_ids"] == whole["prompt_token_ids"]
    assert joined["choices"][0]["token_ids"] == whole["choices"][0]["token_ids"]
    assert joined["choices"][0]["content"] == whole["choices"][0]["message"]["content"]


def test_the_recorded_fixtures_are_what_the_engine_still_says(url):
    """Seeded sampling is reproducible across restarts: the recorded answer is today's answer (else
    re-record: python -m tests.vllm_cases --url URL)."""
    _, whole = ask(url, "chat")
    recorded = json.loads((RECORDED / "chat.json").read_text())["response"]
    assert whole["prompt_token_ids"] == recorded["prompt_token_ids"]
    assert whole["choices"][0]["token_ids"] == recorded["choices"][0]["token_ids"]


def test_recon_collect_keeps_the_engine_s_ids(url, tokenizers, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    asked = [{"id": "sea", "messages": [{"role": "user", "content": "Describe the sea in one line."}]},
             {"id": "emoji", "messages": [{"role": "user", "content": "Give me three fruit emoji and their names."}]}]
    prompts.write_text("".join(json.dumps(p) + "\n" for p in asked))
    out = tmp_path / "collected.jsonl"
    done = recon("collect", str(prompts), "--url", url, "--out", str(out), "--model", MODEL, "--n", "2",
                 "--max-tokens", "16", "--seed", "40", "--temperature", "0.8")
    assert done.returncode == 0, done.stderr
    records = read_records(out).records
    assert len(records) == 4
    tok = tokenizers["smollm2"]
    for k, prompt in enumerate(asked):  # the same requests, sent again: the engine answers the same
        body = {"model": MODEL, "messages": prompt["messages"], "n": 2, "temperature": 0.8, "top_p": 1.0,
                "max_tokens": 16, "seed": 40 + k, "logprobs": True, "return_token_ids": True}
        again = chat(url, body)
        mine = [r for r in records if r.messages == prompt["messages"]]
        assert [r.output_ids for r in mine] == [c["token_ids"] for c in again["choices"]]
        assert all(r.prompt_ids == again["prompt_token_ids"] for r in mine)
        for r, c in zip(mine, again["choices"]):
            assert r.response.content == c["message"]["content"]
            assert engine_text(tok, r.output_ids, c["finish_reason"]) == c["message"]["content"]


def test_the_vllm_scorer_recovers_what_the_local_scorer_recovers(url, tokenizers):
    """recon recover's vLLM scorer (prompt_logprobs on /v1/completions) and the local torch scorer
    on the same held-out samples of CI's subset: the same ids, the sampled ones. (p006-3 of that
    subset is left out: there the vLLM scorer, which sees the top 20 and the prompt's own token
    but not the candidates' alternatives, picks another segmentation; docs/engine.md.)"""
    pytest.importorskip("torch", reason="the local scorer needs the 'generate' extra")
    from recon.audit.profiles import load_profile
    from recon.recovery.model import LocalModel
    from recon.recovery.recover import recover
    from recon.recovery.remote import ServerScorer
    from recon.recovery.scorers import LocalScorer

    ci = {c["id"] for c in map(json.loads, (DATA / "recover-ci.jsonl").read_text().splitlines())
          if c["dataset"] == "heldout-t0.7"}
    wanted = ["p001-0", "p010-0", "p029-1"]
    assert set(wanted) <= ci
    picked = [r for r in read_records(ROOT / "data" / "heldout-t0.7.jsonl").records if r.id in wanted]
    bound = load_profile("chatml").bind(tokenizers["smollm2"])
    remote = list(recover(picked, bound, ServerScorer(url, model=MODEL, concurrency=1), temperature=1.0, progress=False))
    local = list(recover(picked, bound, LocalScorer(LocalModel("smollm2", threads=1)), temperature=1.0, progress=False))
    for rec, a, b in zip(picked, remote, local):
        assert a.error is None and b.error is None, (rec.id, a.error, b.error)
        assert a.ids == b.ids, rec.id
        assert a.ids == rec.output_ids, rec.id


def test_multiturn_prompt_ids_grow_by_the_sampled_ids(url):
    check_multiturn(multiturn(url))


def test_prompt_ids_the_engine_reports_against_recon_s_rendering(url, tokenizers):
    """The hook for trajectories: the prompt ids vLLM reports equal recon's render of the same
    messages (recon.prompts: SmolLM2's chat template, its special-token variables) encoded with
    special tokens as their ids."""
    from recon.prompts.sources import find_chat_template, special_token_variables

    tok = tokenizers["smollm2"]
    template = find_chat_template("smollm2")
    assert template is not None
    for name in ("chat", "chat_tools"):
        body = CASES[name][1]
        status, answer = post(url, "/chat/completions", {**body, "max_tokens": 1})
        assert status == 200, answer
        text = template.render(body["messages"], tools=body.get("tools"), add_generation_prompt=True,
                               special_tokens=special_token_variables(tok))
        assert tok.encode(text, allow_special=True) == answer["prompt_token_ids"], name
    for turn in multiturn(url):
        text = template.render(turn["request"]["messages"], special_tokens=special_token_variables(tok))
        assert tok.encode(text, allow_special=True) == turn["prompt_token_ids"]


def test_the_workbench_collects_audits_and_shows_a_live_engine(vllm_engine, tmp_path):
    """`recon report` on a params file naming the live engine runs notebook 06 against it: every
    sample the engine returned is collected with its ids and audited (the engine's answers are the
    oracle: as many records as prompts x n, each with the engine's sampled and prompt ids)."""
    import subprocess
    import sys

    import yaml

    from recon.notebook.report import read_records
    from tests.conftest import ROOT

    params = yaml.safe_load((ROOT / "params" / "vllm-live.yaml").read_text())
    params["engine"] = vllm_engine.url
    params["notebooks"]["06_live_engine"].update(engine_url=vllm_engine.url, prompts=3, n=2, max_tokens=24,
                                                 prompts_path=str(ROOT / "data" / "prompts.jsonl"))
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(params))
    run = subprocess.run([sys.executable, "-m", "recon.cli", "report", str(path), "--out", str(tmp_path / "out"),
                          "--no-html"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    found = read_records(tmp_path / "out" / "live" / "06_live_engine.ipynb")
    assert found["collected"] == 6 and found["summary"]["samples"] == 6
    assert sum(r["records"] for r in found["prompts"] if r["prompt_source"] == "engine") == 6
