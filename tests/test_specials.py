"""Special-token discovery, look-ups, expected-id checks and the empirical end-token check."""

from __future__ import annotations

import json
import shutil

import pytest

import recon
from recon import SpecialTokenMismatch, specials
from recon.notebook.plots import specials_overview_data

EXPECTED = {
    "smollm2": {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2},
    "deepseek-v4": {"<｜end▁of▁sentence｜>": 1, "<think>": 128821, "</think>": 128822, "<｜tool▁sep｜>": 128814},
    "qwen3.6": {"<|im_end|>": 248046, "<think>": 248068, "</think>": 248069, "<tool_call>": 248058},
    "cl100k": {"<|endoftext|>": 100257, "<|endofprompt|>": 100276},
}


def test_discovery_finds_every_added_token_and_they_round_trip(tokenizers):
    counts = {}
    for name, tok in tokenizers.items():
        table = specials.discover(tok)
        counts[name] = len(table)
        assert table["roundtrip"].all(), table[~table["roundtrip"]]
        assert specials.check_expected(tok, EXPECTED[name])["ok"].all()
        ids = dict(zip(table["content"], table["id"]))
        assert all(ids[text] == i for text, i in EXPECTED[name].items())
    assert counts == {"smollm2": 17, "deepseek-v4": 1283, "qwen3.6": 33, "cl100k": 5}


def test_config_checks(tokenizers, kimi):
    kimi_table = specials.discover(kimi)
    assert kimi_table["config_check"].value_counts().to_dict() == {"filled": 233, "match": 23}
    assert set(specials.discover(tokenizers["qwen3.6"])["config_check"]) == {"match"}
    # a GGUF is its own declaration; its roles come from its metadata
    smol = specials.discover(tokenizers["smollm2"])
    assert set(smol["config_check"]) == {"undeclared"}
    assert smol.set_index("content").loc["<|im_end|>", "roles"] == "eos,pad"


def test_shifted_ids_in_a_converted_tokenizer_are_caught(tmp_path, tokenizers):
    """A tokenizer.json whose added ids moved away from what tokenizer_config.json declares
    (as transformers' Kimi conversion did) fails loudly."""
    source = tokenizers["deepseek-v4"].source
    shutil.copy(source, tmp_path / "tokenizer.json")
    declared = {"128822": {"content": "</think>", "special": False}, "1": {"content": "<｜end▁of▁sentence｜>", "special": True},
                "128899": {"content": "<|not_in_tokenizer|>", "special": True}}
    declared["128821"] = {"content": "<think>", "special": False}
    declared["128820"] = declared.pop("128821")  # declared one below where the tokenizer has it
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": declared}))
    tok = recon.load_tokenizer(tmp_path)
    table = specials.discover(tok).set_index("content")
    assert table.loc["</think>", "config_check"] == "match"
    assert table.loc["<think>", "config_check"] == "mismatch" and table.loc["<think>", "config_id"] == 128820
    assert table.loc["<|not_in_tokenizer|>", "config_check"] == "missing"
    v = specials.verdict(tok, specials.discover(tok))
    assert v.level == "FAIL"
    assert any("'<think>': config declares id 128820, tokenizer has id 128821" in line for line in v.lines)


@pytest.mark.parametrize(
    "name, query, first_id",
    [
        ("deepseek-v4", "</think>", 128822),
        ("deepseek-v4", "end of sentence", 1),
        ("deepseek-v4", "tool_sep", 128814),
        ("smollm2", "im_end", 2),
        ("qwen3.6", "tool_call", 248058),
    ],
)
def test_find_ranks_the_right_token_first(tokenizers, name, query, first_id):
    found = specials.find(specials.discover(tokenizers[name]), query)
    assert found["id"].iloc[0] == first_id
    assert found["score"].is_monotonic_decreasing


def test_find_by_name_does_not_confuse_similar_tokens(tokenizers):
    found = specials.find(specials.discover(tokenizers["deepseek-v4"]), "im_end")
    # DeepSeek has no im_end; '<｜fim▁end｜>' contains the letters but not the words
    assert found["match"].iloc[0] == "contains" and found["score"].iloc[0] < 0.5
    assert specials.find(specials.discover(tokenizers["cl100k"]), "</think>").empty


def test_the_kimi_wrong_id_is_loud(kimi):
    with pytest.raises(SpecialTokenMismatch) as e:
        specials.assert_expected(kimi, {"<|im_end|>": 163533, "</think>": 163607, "<|im_foo|>": 163600})
    message = str(e.value)
    assert "'<|im_end|>': expected id 163533, but the tokenizer has it at 163586; id 163533 is" in message
    assert "'<|im_foo|>': expected id 163600, but the tokenizer has no such added token" in message
    assert "</think>" not in message  # the right one is not reported
    assert specials.assert_expected(kimi, {"<|im_end|>": 163586, "</think>": 163607})["ok"].all()


CHATS = [
    "Sure! Here is a haiku:\nLeaves fall in silence\nthe river keeps no record\nof the autumn light",
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b",
    "I can't help with that, but here's a related idea 😀",
]


def test_end_token_check_on_real_token_ids(tokenizers):
    tok = tokenizers["smollm2"]
    samples = [ids + [2] for ids in tok.encode_batch(CHATS)] + [tok.encode("cut off mid sent")]
    check = specials.check_end_token(tok, samples, "<|im_end|>")
    assert check.ok and check.ending_with_end == 4 and check.samples == 5
    assert check.histogram.iloc[0][["id", "piece", "count"]].tolist() == [2, "<|im_end|>", 4]
    wrong = specials.check_end_token(tok, samples, "<|endoftext|>")
    assert not wrong.ok and wrong.ending_with_end == 0
    assert "the most common last token is '<|im_end|>' (2), 4 samples" in wrong.message()


def test_overview_plot_data(kimi, tokenizers):
    data = specials_overview_data(specials.discover(kimi))
    assert data.to_dict(orient="index") == {"match": {"round-trips": 23, "fails": 0}, "filled": {"round-trips": 233, "fails": 0}}
    assert specials_overview_data(specials.discover(tokenizers["cl100k"])).loc["match", "round-trips"] == 5


def test_verdict_fails_when_samples_end_with_another_token(tokenizers):
    tok = tokenizers["smollm2"]
    table = specials.discover(tok)
    samples = [ids + [2] for ids in tok.encode_batch(CHATS)]
    good = specials.verdict(tok, table, None, specials.check_end_token(tok, samples, "<|im_end|>"))
    assert good.level == "PASS" and "end token: 4/4 samples (100.0%) end with '<|im_end|>' (2)" in good.lines
    bad = specials.verdict(tok, table, None, specials.check_end_token(tok, samples, "<|endoftext|>"))
    assert bad.level == "FAIL"
    assert any(line.startswith("end token is not what ends the samples: 0/4") for line in bad.lines)
