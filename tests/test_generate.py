"""Real ground truth: `recon generate` reproduces the bundled data; the bundled data is what it claims."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recon.errors import ReconError
from recon.recovery.model import load_prompts
from recon.samples.records import read_records

from .conftest import ROOT
from .test_cli import recon

DATA = ROOT / "data"
BUNDLED = sorted(DATA.glob("smollm2-t*.jsonl"))


def test_bundled_data_is_valid_real_and_small(tokenizers):
    tok = tokenizers["smollm2"]
    assert [p.name for p in BUNDLED] == ["smollm2-t0.7.jsonl", "smollm2-t1.3.jsonl"]
    total = 0
    for path in BUNDLED:
        result = read_records(path, vocab_size=tok.vocab_size)
        assert result.errors == []
        assert len(result.records) == 160 and path.stat().st_size < 3_000_000
        total += len(result.records)
        reasons = {r.response.finish_reason for r in result.records}
        assert reasons == {"stop", "length"}
        for r in result.records:
            assert (r.output_ids[-1] == 2) == (r.response.finish_reason == "stop")
            assert b"".join(bytes(t.bytes) for t in r.response.logprobs) == b"".join(tok.id_to_bytes(i) for i in r.output_ids)
    assert total == 320


def test_bundled_samples_do_not_all_round_trip(tokenizers):
    """The phenomenon recon measures, in real samples: re-encoding the decoded text differs."""
    tok = tokenizers["smollm2"]
    hot = read_records(DATA / "smollm2-t1.3.jsonl").records
    differ = [r for r in hot if tok.encode(tok.decode(r.output_ids)) != r.output_ids]
    assert len(differ) >= 5


#: held-out samples drawn with truncation (top-p, min-p): their first batch reproduced proves the
#: sampler flags do what the records' meta says (recovery scores under that meta)
TRUNCATED = sorted(DATA.glob("heldout-t*-[pm]*.jsonl"))


@pytest.mark.parametrize("path", BUNDLED + TRUNCATED, ids=lambda p: p.stem)
def test_generate_reproduces_the_bundled_data_from_its_seed(tmp_path, path):
    pytest.importorskip("torch", reason="generation needs the 'generate' extra")
    bundled = read_records(path).records
    meta = bundled[0].meta
    first_batch = [r for r in bundled if r.meta["batch"] == 0]
    n = sum(1 for r in bundled if r.id.startswith(bundled[0].id.rsplit("-", 1)[0] + "-"))
    prompts = len(first_batch) // n
    out = tmp_path / "again.jsonl"
    run = recon(
        "generate", str(DATA / "prompts.jsonl"), "--out", str(out), "--limit", str(prompts), "--n", str(n),
        "--temperature", str(meta["temperature"]), "--top-p", str(meta["top_p"]), "--max-new-tokens", str(meta["max_new_tokens"]),
        "--seed", str(meta["seed"]), "--batch-size", str(meta["batch_size"]), "--dataset", bundled[0].dataset, "--threads", "2",
        *[arg for key in ("top_k", "min_p") if key in meta for arg in (f"--{key.replace('_', '-')}", str(meta[key]))],
    )
    assert run.returncode == 0, run.stderr[-2000:]
    again = read_records(out).records
    assert len(again) == len(first_batch) == meta["batch_size"]
    for new, old in zip(again, first_batch):
        # ids and text exactly; each logprob (stored to 4 decimals) within 1e-3: a CPU with other
        # SIMD kernels (an AVX2-only AMD EPYC) rounds a float32 sum differently in the last digit
        assert (new.id, new.output_ids, new.prompt_ids, replace(new.response, logprobs=None)) == (
            old.id, old.output_ids, old.prompt_ids, replace(old.response, logprobs=None))
        new_lps, old_lps = new.response.logprobs or [], old.response.logprobs or []
        assert [replace(t, logprob=None) for t in new_lps] == [replace(t, logprob=None) for t in old_lps]
        assert [t.logprob for t in new_lps] == pytest.approx([t.logprob for t in old_lps], abs=1e-3)


def test_prompts_file_errors(tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"id": "b"}\n')
    with pytest.raises(ReconError, match=r"prompts.jsonl, line 2, field messages"):
        load_prompts(bad)
    for content, where in ((b'[1, 2]\n', r"line 1: expected a JSON object, got list"),
                           (b'{"messages": [{"role": "user"}]}\n\xff\xfe\n', r"line 2: not valid UTF-8"),
                           (b'{"messages": ["hi"]}\n', r"line 1, field messages\[0\]: expected an object")):
        bad.write_bytes(content)
        with pytest.raises(ReconError, match=where):
            load_prompts(bad)
    assert len(load_prompts(DATA / "prompts.jsonl")) == 40
    text = tmp_path / "prompts.txt"
    text.write_text("one\n\ntwo\n")
    assert [p.id for p in load_prompts(text)] == ["p0001", "p0003"]
