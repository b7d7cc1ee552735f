"""recon's importers and vLLM scorer on what the real engine returned (``tests/data/vllm/``,
recorded from vLLM 0.32.0 on the CPU by ``python -m tests.vllm_cases --url ...``): the same checks
the live tests run, without the engine."""

from __future__ import annotations

import json

import pytest

from recon.recovery.remote import parse_prompt_logprobs

from .conftest import DATA
from .test_cli import recon
from .vllm_cases import BAD, CASES, CHAT_CASES, SOURCE, check_chat_import, check_multiturn

D = DATA / "vllm"


def load(name: str) -> dict:
    return json.loads((D / f"{name}.json").read_text())


def answer(name: str):
    fixture = load(name)
    return fixture["chunks"] if "chunks" in fixture else fixture["response"]


def test_every_fixture_is_the_live_engine_s():
    names = {p.stem for p in D.glob("*.json")}
    assert names == {*CASES, *BAD, "multiturn"}
    for name in names:
        fixture = load(name)
        assert fixture["_source"] == SOURCE
        if name in CASES:
            assert (fixture["route"], fixture["request"]) == CASES[name]  # recorded from today's requests


@pytest.mark.parametrize("name", CHAT_CASES)
def test_recon_import_vllm_gives_the_engine_s_ids_and_text(name, tokenizers, tmp_path):
    assert load(name)["status"] == 200
    check_chat_import(answer(name), tokenizers["smollm2"], tmp_path, name)


def test_a_stream_imports_as_the_same_completion_unstreamed():
    """Same request, same seed: the stream's joined ids are the non-streamed answer's ids."""
    chunks, whole = answer("chat_stream"), answer("chat")
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    assert ids == whole["choices"][0]["token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(ids)


def test_n3_gives_three_records_sharing_the_prompt(tokenizers, tmp_path):
    records = check_chat_import(answer("chat_n3"), tokenizers["smollm2"], tmp_path, "n3")
    assert [r.id for r in records] == [f"{answer('chat_n3')['id']}-{k}" for k in range(3)]
    assert len({tuple(r.output_ids) for r in records}) == 3  # three different samples


def test_recon_import_vllm_cli_on_the_recorded_answers(tmp_path):
    lines = tmp_path / "answers.jsonl"
    with open(lines, "w") as f:
        for name in ("chat", "chat_n3", "chat_tools", "chat_tokens_as_ids"):
            f.write(json.dumps(answer(name)) + "\n")
        for chunk in answer("chat_stream"):
            f.write(json.dumps({**chunk, "id": chunk["id"] + "-stream"}) + "\n")
    out = tmp_path / "out.jsonl"
    done = recon("import", "vllm", str(lines), "--out", str(out), "--engine", "vllm")
    assert done.returncode == 0, done.stderr
    assert "wrote 7 records" in done.stdout and "0 bad input lines" in done.stdout


def test_the_vllm_scorer_parses_the_engine_s_prompt_logprobs():
    fixture = load("completions_prompt_logprobs")
    ids = fixture["request"]["prompt"]
    parsed = parse_prompt_logprobs(fixture["response"], ids)
    entries = fixture["response"]["choices"][0]["prompt_logprobs"]
    assert parsed.logprobs[0] is None and entries[0] is None
    for i in range(1, len(ids)):
        assert parsed.logprobs[i] == entries[i][str(ids[i])]["logprob"]
        assert parsed.ranks[i] == entries[i][str(ids[i])]["rank"]
        assert len(parsed.top[i]) in (5, 6)  # the top 5, and the prompt's own token where it is outside them


def test_multiturn_prompts_grow_by_the_sampled_ids():
    """Each turn's prompt is the previous prompt plus the ids sampled there (re-encoded from the reply's
    text, they came back the same), then the template's close and the next user turn: ground truth
    for trajectories."""
    check_multiturn(load("multiturn")["turns"])


def test_bad_requests_are_openai_error_bodies():
    for name in BAD:
        fixture = load(name)
        assert fixture["status"] in (400, 404)
        error = fixture["response"]["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == fixture["status"]
