"""`recon audit --check native`: the rows recon's fast paths give are the rows the tokenizer's own
encoder gives, on cold text (standard-library code, licence text, mixed scripts) for every
tokenizer; and the check fails, in one line, when they are not."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import recon

from .conftest import ROOT

MIXED = ["中文的句子，还有标点。", "한국어 문장입니다", "Съешь же ещё этих мягких булок", "مرحبا بالعالم",
         "emoji 🤖🎉👍🏽 and ZWJ 👩‍💻", "e\u0301 a\u0308 n\u0303 combining", "1234567890 3.14159 2026-12-03",
         "tab\there\r\nCRLF  two  spaces", "It's they're we'll I'd", "ÀÉÎÕÜ ßẞ ǅ ﬁ"]
PROFILES = {"smollm2": "chatml", "deepseek-v4": "deepseek", "qwen3.6": "qwen3", "kimi-k2.5": "kimi-k2", "cl100k": None}


def _texts(n: int, rng: random.Random) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(stdlib.glob("*.py"))[:60] + sorted(stdlib.glob("LICENSE*"))
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sources)
    out = []
    for k in range(n):
        start = rng.randrange(len(text) - 2000)
        piece = text[start : start + rng.randrange(200, 1600)]
        if k % 3 == 0:  # one record in three carries runs of other scripts
            at = rng.randrange(len(piece) + 1)
            piece = piece[:at] + " " + " ".join(rng.sample(MIXED, 3)) + piece[at:]
        out.append(piece)
    return out


def _split(tok, ids: list[int], rng: random.Random) -> list[int]:
    """``ids`` with one token replaced by two whose bytes join to it (a non-canonical sample)."""
    by_bytes = tok.bytes_to_id
    for k in rng.sample(range(len(ids)), len(ids)):
        data = tok.id_to_bytes(ids[k])
        for cut in range(1, len(data)):
            left, right = by_bytes.get(data[:cut]), by_bytes.get(data[cut:])
            if left is not None and right is not None and not {left, right} & tok.added_ids:
                return ids[:k] + [left, right] + ids[k + 1 :]
    return ids


def _cold_file(tok, end: str, path: Path, n: int = 240) -> int:
    """Write ``n`` records whose ids are the native encoding (one in five re-segmented); return how
    many round-trip by the native encoder itself (``encode(decode(ids)) == ids``): the oracle."""
    rng = random.Random(11)
    end_id = tok.encode(end)
    exact = 0
    with open(path, "w", encoding="utf-8") as f:
        for k, text in enumerate(_texts(n, rng)):
            ids = tok.encode(text, allow_special=False) + end_id
            if k % 5 == 0:
                ids = _split(tok, ids[:-1], rng) + end_id
            exact += tok.encode(tok.decode(ids)) == ids
            f.write(json.dumps({"id": f"cold-{k}", "output_ids": ids}) + "\n")
    return exact


@pytest.mark.parametrize("kernel", ["compiled", "python"])
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_fast_and_native_give_identical_rows_on_cold_text(name, kernel, tokenizers, kimi, kimi_dir, tmp_path):
    """Both builds of the per-id loops (recon.kernel: compiled, and the Python twins an install
    without a C compiler runs) against the native encoder."""
    tok = kimi if name == "kimi-k2.5" else tokenizers[name]
    spec = str(kimi_dir) if name == "kimi-k2.5" else name
    profile = PROFILES[name]
    end = "<|endoftext|>" if profile is None else recon.audit.profiles.load_profile(profile).end
    if profile is None:  # cl100k has no chat grammar: a user profile of one end token
        (tmp_path / "plain.yaml").write_text('plain:\n  end: "<|endoftext|>"\n')
        profile = str(tmp_path / "plain.yaml")
    data = tmp_path / "cold.jsonl"
    exact = _cold_file(tok, end, data)
    run = subprocess.run([sys.executable, "-m", "recon.cli", "audit", str(data), "--tokenizer", spec, "--profile", profile,
                          "--method", "concat", "--check", "native", "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "RECON_KERNEL": "1" if kernel == "compiled" else "0"})
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["check"] == {"encoder": "native", "rows": 240}
    assert summary["exact"] == exact  # the native encoder's own round trip
    assert 0 < summary["mismatched"] < 240


def test_the_check_fails_in_one_line_when_a_fast_path_is_wrong(monkeypatch, tmp_path, capsys, tokenizers):
    """A deliberately broken fast path (the canonical check drops the first id of every third
    text) is caught, naming the row, the sample and the column."""
    from recon.cli import main
    from recon.tokenizers.fast.canonical import CanonicalCheck

    data = tmp_path / "cold.jsonl"
    _cold_file(tokenizers["smollm2"], "<|im_end|>", data, n=30)
    real = CanonicalCheck.encode

    def broken(self, texts, guesses, decoded=None):
        return [ids[1:] if k % 3 == 1 and ids else ids for k, ids in enumerate(real(self, texts, guesses, decoded))]

    monkeypatch.setattr(CanonicalCheck, "encode", broken)
    monkeypatch.setenv("RECON_CACHE_DIR", str(tmp_path / "cache"))
    code = main(["audit", str(data), "--tokenizer", "smollm2", "--profile", "chatml", "--method", "concat",
                 "--check", "native", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("recon: check failed: row ") and err.count("\n") == 1
    assert "(sample 'cold-" in err and "--encoder fast" in err and "native" in err


def test_fast_and_native_give_identical_rows_on_the_bundled_samples():
    data = [str(ROOT / "data" / f) for f in ("smollm2-t0.7.jsonl", "smollm2-t1.3.jsonl", "heldout-t0.7.jsonl", "heldout-t1.3.jsonl")]
    run = subprocess.run([sys.executable, "-m", "recon.cli", "audit", *data, "--tokenizer", "smollm2", "--profile", "chatml",
                          "--method", "concat", "--check", "native", "--json"],
                         capture_output=True, text=True, cwd=ROOT, env=os.environ, timeout=600)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["check"] == {"encoder": "native", "rows": 640}
    assert summary["datasets"]["smollm2-t0.7"]["exact"] + summary["datasets"]["smollm2-t1.3"]["exact"] == 171
