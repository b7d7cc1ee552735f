"""The importers on responses as vLLM, SGLang, OpenAI and OpenRouter document or record them.

Each fixture in ``tests/data/importers`` says where its shape came from (``SOURCES.md``); every
expected value below was read off the fixture by hand, never produced by recon's renderers.
"""

from __future__ import annotations

import json
import random

from recon.samples.importers import from_chat_completion, from_sglang, iter_import
from recon.samples.io import RecordError
from recon.samples.records import read_records

from .conftest import DATA
from .test_cli import recon

D = DATA / "importers"
SMOL_PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]  # chatml: capital of France
APPLE_PROMPT = [1, 4093, 198, 5820, 253, 4354, 30, 2, 198, 1, 520, 9531, 198]  # chatml: "Name a fruit."
APPLE_IDS = [4590, 314, 354, 11977, 42, 15107, 231, 232, 2]  # "Here is an apple: 🍎" + <|im_end|>


def run(kind: str, name: str):
    items = list(iter_import(kind, D / name))
    good = [i for i in items if not isinstance(i, RecordError)]
    return {r.id: r for r in good}, [(e.line, e.field, e.problem) for e in items if isinstance(e, RecordError)]


def test_sglang_native_generate_from_the_docs():
    recs, errors = run("sglang", "sglang_send_request.jsonl")
    assert errors == []
    gen = recs["1b4ec09a276240ff9729329e02ad79fc"]
    assert gen.output_ids == [12095, 13, 1084, 374, 279, 7772, 3283, 304, 4505, 323, 279, 2086, 7772, 3283, 304, 279,
                              1879, 13, 1084, 374, 7407, 304, 279, 9806, 315, 9625, 11, 389, 279, 13959, 315, 279]
    assert gen.response.content == (" Paris. It is the largest city in Europe and the second largest city in the world."
                                    " It is located in the south of France, on the banks of the")
    assert gen.response.finish_reason == "length"  # meta_info.finish_reason = {"type": "length", "length": 32}
    assert (gen.response.logprobs, gen.response.reasoning_content, gen.prompt_ids) == (None, None, None)


def test_sglang_openai_chat_through_recon_import_sglang():
    recs, _ = run("sglang", "sglang_send_request.jsonl")
    chat = recs["43455fd0ad5743988ea1edbdba20cd3a"]  # SGLang's /v1/chat/completions, not /generate
    assert chat.response.content == "The capital of France is Paris."
    assert (chat.response.finish_reason, chat.response.reasoning_content, chat.response.tool_calls) == ("stop", None, None)
    assert chat.output_ids is None
    assert chat.meta == {"model": "qwen/qwen2.5-0.5b-instruct", "created": 1772580182, "completion_tokens": 8}  # usage


def test_the_token_count_servers_report_is_the_count_of_ids_they_sampled():
    """``usage.completion_tokens`` (``meta_info.completion_tokens`` on SGLang's /generate) is kept in
    meta, where recovery takes it as the sampled ids' count: checked against every fixture whose
    engine also recorded the ids (vLLM and SGLang ``token_ids``, SGLang's logprob triples)."""
    checked = 0
    for kind, name in [("vllm", "vllm_chat_logprobs.jsonl"), ("vllm", "vllm_completions.jsonl"),
                       ("sglang", "sglang_chat.jsonl"), ("sglang", "sglang_generate_logprobs.jsonl")]:
        recs, errors = run(kind, name)
        for rec in recs.values():
            if rec.output_ids is not None and "completion_tokens" in rec.meta:
                assert rec.meta["completion_tokens"] == len(rec.output_ids), (name, rec.id)
                checked += 1
    assert checked >= 5
    many = from_chat_completion({"choices": [{"index": i, "message": {"content": "a"}, "finish_reason": "stop"} for i in (0, 1)],
                                 "usage": {"completion_tokens": 7}})
    assert all("completion_tokens" not in r.get("meta", {}) for r in many)  # with n > 1 the count is the choices' sum


def test_sglang_chat_tool_calls_reasoning_and_token_ids_on_the_choice(tokenizers):
    recs, errors = run("sglang", "sglang_chat.jsonl")
    assert errors == []
    tools = recs["eb2e23fc4e504c718a4b54060751d4d0"]
    assert [(c.id, c.name, c.arguments) for c in tools.response.tool_calls] == [
        ("call_40c8585c48ce4b5dbb1f7d73", "get_current_weather", '{"city": "Boston", "state": "MA", "unit": "celsius"}'),
        ("call_279e65d7f9bd4b7d9e7de949", "get_current_weather", '{"city": "Boston", "state": "MA", "unit": "fahrenheit"}')]
    assert tools.response.content.startswith("To determine the current weather in Boston, I will use")
    assert tools.response.finish_reason == "tool_calls"
    reason = recs["separate-reasoning-doc"]
    assert reason.response.reasoning_content == ("First, I recognize that the problem is asking for the sum of 1 and 3.\n\n"
                                                 "Next, I add the two numbers together.\n\nFinally, I arrive at the result of 4.\n")
    assert reason.response.content.startswith("**Solution:**\n\nWe are asked") and reason.response.content.endswith("\\(\\boxed{4}\\).")
    ids = recs["return-token-ids-schema"]  # prompt_token_ids and token_ids sit on the choice in SGLang
    assert ids.prompt_ids == SMOL_PROMPT and ids.output_ids == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    smol = tokenizers["smollm2"]
    assert smol.decode(ids.prompt_ids) == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert smol.decode(ids.output_ids) == "The capital of France is Paris.<|im_end|>"
    same, _ = run("openai", "sglang_chat.jsonl")  # the OpenAI importer reads SGLang's chat the same way
    assert {k: (r.output_ids, r.prompt_ids, r.response) for k, r in same.items()} == {
        k: (r.output_ids, r.prompt_ids, r.response) for k, r in recs.items()}


def test_sglang_generate_logprob_triples_and_batches():
    recs, errors = run("sglang", "sglang_generate_logprobs.jsonl")
    assert errors == []
    ids = [504, 3575, 282, 4649, 314, 7042, 30, 2]
    bare, text = recs["logprob-no-text"], recs["logprob-text"]
    assert [t.token for t in bare.response.logprobs] == [f"token_id:{i}" for i in ids]  # text null in the triple
    assert [t.token for t in text.response.logprobs] == ["The", " capital", " of", " France", " is", " Paris", ".", "<|im_end|>"]
    for rec in (bare, text):
        assert [t.token_id for t in rec.response.logprobs] == ids == rec.output_ids
        assert [t.logprob for t in rec.response.logprobs] == [-0.0312, -0.25, -0.0041, -0.0007, -0.0105, -0.0019, -0.122, -0.0003]
        assert all(t.bytes is None for t in rec.response.logprobs) and rec.response.finish_reason == "stop"
    assert (recs["batch-0"].output_ids, recs["batch-0"].response.finish_reason) == ([38634, 2], "stop")  # line 3: an array
    assert (recs["batch-1"].output_ids, recs["batch-1"].response.content) == ([38634, 30], "Paris.")


def test_vllm_recorded_gpt_oss_answer_issue_28246():
    recs, errors = run("vllm", "vllm_chat_gptoss_issue28246.jsonl")
    assert errors == []
    (rec,) = recs.values()
    assert rec.id == "chatcmpl-a19161b8131141e2a79495025adb40eb"
    assert rec.response.reasoning_content == 'The user says "Hello!" We should respond politely. No special instructions. Just greet back.'
    assert rec.response.content == "Hello! How can I help you today?" and rec.response.finish_reason == "stop"
    assert rec.output_ids is None  # "token_ids": null, the bug the issue reports: not taken for ids
    assert rec.prompt_ids == [200006, 17360, 200008, 3575, 553] and rec.response.tool_calls is None  # "tool_calls": []


def test_vllm_logprob_bytes_of_a_replacement_character_are_dropped(tokenizers):
    recs, errors = run("vllm", "vllm_chat_logprobs.jsonl")
    assert errors == []
    rec = recs["chatcmpl-vllm-utf8"]
    assert rec.output_ids == APPLE_IDS and rec.prompt_ids == APPLE_PROMPT
    assert rec.response.content == "Here is an apple: 🍎" and rec.response.reasoning_content is None  # "reasoning": null
    lp = rec.response.logprobs
    assert [t.token for t in lp] == ["Here", " is", " an", " apple", ":", " \ufffd", "\ufffd", "\ufffd", "<|im_end|>"]
    assert [t.bytes for t in lp[:5]] == [[72, 101, 114, 101], [32, 105, 115], [32, 97, 110], [32, 97, 112, 112, 108, 101], [58]]
    assert [t.bytes for t in lp[5:8]] == [None, None, None]  # vLLM sent [32, 239, 191, 189], [239, 191, 189] x2
    assert lp[8].bytes == list(b"<|im_end|>") and [t.logprob for t in lp][5] == -1.3
    # why: those bytes are the replacement character's, and SmolLM2 has a token for it, so they would
    # read as id 24211 where the model sampled 15107, 231, 232 (whose true bytes are the emoji's)
    smol = tokenizers["smollm2"]
    assert smol.bytes_to_id[bytes([239, 191, 189])] == 24211
    assert [smol.id_to_bytes(i) for i in rec.output_ids[5:8]] == [b" \xf0\x9f", b"\x8d", b"\x8e"]
    as_ids = recs["chatcmpl-vllm-token-ids"]  # return_tokens_as_token_ids
    assert [t.token_id for t in as_ids.response.logprobs] == APPLE_IDS
    assert all(t.bytes is None for t in as_ids.response.logprobs)  # the decoded text's bytes, not the id's


def test_vllm_completions_carry_ids_on_the_choice():
    recs, errors = run("vllm", "vllm_completions.jsonl")
    assert errors == []
    rec = recs["cmpl-vllm-return-token-ids"]
    assert (rec.response.content, rec.output_ids, rec.prompt_ids) == (" Paris.", [7042, 30], [504, 3575, 282, 4649, 314])
    assert rec.response.finish_reason == "length"


def test_vllm_streams_joined_with_token_ids_through_the_cli(tmp_path):
    out = tmp_path / "stream.jsonl"
    run_ = recon("import", "vllm", str(D / "vllm_chat_stream.jsonl"), "--out", str(out))
    assert run_.returncode == 0, run_.stderr
    assert "wrote 2 records" in run_.stdout and run_.stderr == ""  # the usage-only last chunk is no record
    recs = {r.id: r for r in read_records(out).records}
    reasoning = recs["chatcmpl-123"]
    assert reasoning.response.reasoning_content == "9.11 is smaller than 9.8."  # delta.reasoning, as vLLM documents
    assert (reasoning.response.content, reasoning.response.finish_reason) == ("9.8 is greater.", "stop")
    ids = recs["chatcmpl-ids"]
    assert ids.output_ids == APPLE_IDS and ids.prompt_ids == APPLE_PROMPT  # prompt ids on the first chunk only
    assert ids.response.content == "Here is an apple: 🍎"


def test_openai_reference_examples():
    recs, errors = run("openai", "openai_chat.jsonl")
    assert errors == []
    lp = recs["chatcmpl-123"]
    tokens = lp.response.logprobs
    assert [t.token for t in tokens] == ["Hello", "!", " How", " can", " I", " assist", " you", " today", "?"]
    assert tokens[0].bytes == [72, 101, 108, 108, 111] and tokens[0].logprob == -0.31725305 and tokens[4].logprob == -3.7697225e-6
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == lp.response.content == "Hello! How can I assist you today?"
    assert lp.output_ids is None and all(t.token_id is None for t in tokens)
    call = recs["chatcmpl-abc123"].response
    assert [(c.id, c.type, c.name, c.arguments) for c in call.tool_calls] == [
        ("call_abc123", "function", "get_current_weather", '{\n"location": "Boston, MA"\n}')]
    assert (call.content, call.finish_reason) == (None, "tool_calls")
    legacy = recs["chatcmpl-function-call"].response  # message.function_call, before tool_calls existed
    assert [(c.name, c.arguments) for c in legacy.tool_calls] == [("get_current_weather", '{\n  "location": "Boston, MA"\n}')]
    assert legacy.finish_reason == "function_call"


def test_openai_stream_batch_output_and_escaped_bytes():
    recs, errors = run("openai", "openai_chat_stream.jsonl")
    assert errors == [] and list(recs) == ["chatcmpl-123"]
    assert (recs["chatcmpl-123"].response.content, recs["chatcmpl-123"].response.finish_reason) == (
        "Hello! How can I assist you today?", "stop")
    recs, errors = run("openai", "openai_batch_output.jsonl")
    assert list(recs) == ["request-2"] and recs["request-2"].response.content == "2 + 2 equals 4."
    assert errors == [
        (2, "error", "the server answered with an error, not a completion: "
                     "This request could not be executed before the completion window expired."),
        (3, "error", "the server answered with an error, not a completion: Invalid 'messages': empty array.")]
    recs, _ = run("openai", "openai_compatible_escaped_bytes.jsonl")
    tokens = recs["deepseek-escaped"].response.logprobs
    assert [t.bytes for t in tokens] == [[240, 159, 140], [141]]  # true bytes beside escaped text: kept
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == "🌍"


def test_openrouter_reasoning_reasoning_details_tool_calls_and_errors():
    recs, errors = run("openai", "openrouter_chat.jsonl")
    assert recs["gen-reasoning"].response.reasoning_content == "Count the r's: st-r-awbe-r-r-y. That is 3."
    assert recs["gen-reasoning"].response.content == 'There are 3 r\'s in "strawberry".'
    assert recs["gen-details-only"].response.reasoning_content == "s-t-r: one. b-e-r-r: two more."  # reasoning.text parts
    summary = recs["gen-summary-only"].response  # a summary and an encrypted blob are not the sampled text
    assert (summary.reasoning_content, summary.content) == (None, "3")
    tool = recs["gen-tool"].response
    assert [(c.id, c.name, c.arguments) for c in tool.tool_calls] == [
        ("toolu_01A57N7TgYAqcFmiMY9Q7TT4", "get_weather", '{"location":"Paris"}')]
    assert tool.finish_reason == "tool_calls"
    assert errors == [(5, "error", "the server answered with an error, not a completion: Rate limit exceeded: free-models-per-day")]
    recs, errors = run("openai", "openrouter_chat_stream.jsonl")
    assert errors == [] and list(recs) == ["gen-stream"]
    stream = recs["gen-stream"].response
    assert stream.reasoning_content == "I need the weather tool."
    assert [(c.id, c.name, c.arguments) for c in stream.tool_calls] == [("toolu_01", "get_weather", '{"location":"Paris"}')]
    assert stream.finish_reason == "tool_calls"


def test_bad_and_partial_lines_are_named_and_good_ones_go_on(tmp_path):
    path = D / "bad_openai.jsonl"
    out = tmp_path / "out.jsonl"
    run_ = recon("import", "openai", str(path), "--out", str(out))
    assert run_.returncode == 0 and "wrote 3 records" in run_.stdout and "7 bad input lines" in run_.stdout
    assert sorted(r.id for r in read_records(out).records) == ["cut-stream", "good-1", "good-2"]
    problems = run_.stderr.splitlines()
    assert problems[0] == (f"{path}, line 2, field error: the server answered with an error, not a completion: "
                           "The model `llama` does not exist.")
    fields = [(e.line, e.field) for e in iter_import("openai", path) if isinstance(e, RecordError)]
    assert fields == [(2, "error"), (3, "choices[0]"), (4, ""), (5, "choices[0].message"),
                      (6, "response.logprobs.content[0].bytes"), (7, "output_ids"), (9, "choices[0].delta.content")]
    assert len(problems) == len(fields) and all(p.startswith(f"{path}, line ") for p in problems)
    cut = read_records(out).records[[r.id for r in read_records(out).records].index("cut-stream")]
    assert (cut.response.content, cut.response.finish_reason) == ("The answer is", None)  # what arrived, unfinished
    recs, errors = run("sglang", "bad_sglang.jsonl")
    assert sorted(recs) == ["sg-good-1", "sg-good-2"]
    assert [(line, field) for line, field, _ in errors] == [
        (2, "meta_info.output_token_logprobs[1]"), (3, "meta_info"), (4, "error"), (5, "output_ids")]
    assert errors[0][2] == "expected [logprob, token_id, text], got [-0.2]"


def test_the_converters_on_one_object():
    line = json.loads((D / "sglang_send_request.jsonl").read_text().splitlines()[0])
    (rec,) = from_sglang(line)
    assert rec["id"] == "1b4ec09a276240ff9729329e02ad79fc" and len(rec["output_ids"]) == 32
    (rec,) = from_chat_completion(json.loads((D / "vllm_completions.jsonl").read_text()), "mine")
    assert (rec["id"], rec["output_ids"], rec["prompt_ids"]) == ("mine", [7042, 30], [504, 3575, 282, 4649, 314])


def test_broken_copies_of_every_fixture_never_stop_the_import(tmp_path):
    """A field of a documented response replaced by a value of the wrong type, at any depth: every
    line comes out as a record or as a RecordError, and the import never raises."""
    rng = random.Random(20)
    objects = []
    for path in sorted(D.glob("*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                objects.append(json.loads(text))
            except ValueError:
                pass  # bad_openai.jsonl's line cut short
    odd = [None, 1, -1, 1.5, True, "x", [], {}, [1], [[1]], {"index": [1]}]

    def broken(obj, depth=0):
        if isinstance(obj, (dict, list)) and obj and depth < 6:
            obj = dict(obj) if isinstance(obj, dict) else list(obj)
            key = rng.choice(list(obj)) if isinstance(obj, dict) else rng.randrange(len(obj))
            obj[key] = broken(obj[key], depth + 1) if rng.random() < 0.6 else rng.choice(odd)
            return obj
        return rng.choice(odd)

    path = tmp_path / "broken.jsonl"
    for _ in range(150):
        path.write_text("".join(json.dumps(broken(rng.choice(objects))) + "\n" for _ in range(4)))
        for kind in ("openai", "sglang"):
            items = list(iter_import(kind, path))
            assert {e.line for e in items if isinstance(e, RecordError)} <= {1, 2, 3, 4}


def test_the_sampler_the_requests_asked_for_goes_into_meta(tmp_path):
    """Responses do not say how they were sampled; `recon import --temperature/--top-p/...` keeps
    what the requests asked for in each record's meta, beside what the response gave (usage's
    completion_tokens), and recovery reads its sampler from there (another engine: the cut's slack)."""
    from recon.recovery.sampling import ENGINE_SLACK, Sampling

    out = tmp_path / "chat.jsonl"
    run_ = recon("import", "vllm", str(D / "vllm_chat_logprobs.jsonl"), "--out", str(out), "--temperature", "0.6",
                 "--top-p", "0.95", "--top-k", "20", "--engine", "vllm")
    assert run_.returncode == 0, run_.stderr
    recs = read_records(out).records
    plain = {r.id: r for r in run("vllm", "vllm_chat_logprobs.jsonl")[0].values()}
    assert recs and len(recs) == len(plain)
    for rec in recs:
        assert rec.meta == {**plain[rec.id].meta, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "engine": "vllm"}
        assert Sampling.from_meta(rec.meta) == Sampling(0.6, 0.95, 20, 0.0, "hf", ENGINE_SLACK)
    bad = recon("import", "vllm", str(D / "vllm_chat_logprobs.jsonl"), "--out", str(out), "--top-p", "1.5")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--top-p 1.5" in bad.stderr
