"""Cold data for benchmarks/audit_speed.py: distinct records cut from real text on this machine.

The text is every ``*.py`` of the Python standard library (not site-packages; files that are not
UTF-8 or cannot be read are skipped) and the licence texts found (/usr/share/common-licenses/*,
LICENSE* under the standard library). Pass p cuts every text into 1,600-character slices starting
at offset p * 97 % 1600, so later passes give new slices; a slice already seen is skipped, so no
two records hold the same text. Each slice is encoded with recon's smollm2 tokenizer (or the one
named) and ends with its end-of-turn token (``<|im_end|>``; ``<|endoftext|>`` for cl100k, ``<｜end▁of▁sentence｜>`` for
DeepSeek-V4); one
record in seven has one multi-byte token replaced by a non-canonical split into two tokens that
spell the same bytes (so exactly those records do not round-trip; a record with no multi-byte
token, rare, passes the split on to the next). With ``mixed``, one record in three (or in ``every``,
audit_speed.py's ``--mix-every``) also carries three runs of other scripts (CJK, Hangul, Cyrillic,
Arabic, emoji, combining marks, digit runs).

    python benchmarks/cold_data.py write FILE N [TOKENIZER [mixed]]  # write N records as JSONL
    python benchmarks/cold_data.py floor FILE [TOKENIZER]  # the native floor on FILE, as JSON (HF: run it
                                                # with TOKENIZERS_PARALLELISM=true for the multi-core floor;
                                                # tiktoken: its batch calls with num_threads=2)
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterator

SLICE = 1600
STEP = 97  # pass p starts its slices at p * STEP % SLICE: 1600 distinct offsets, as gcd(97, 1600) = 1
BATCH = 2000
ODD_ONE = 7  # one record in ODD_ONE gets a non-canonical split
MIXED_ONE = 3  # with mixed: one record in MIXED_ONE gets runs of other scripts
MIXED = ["中文的句子，还有标点。", "한국어 문장입니다", "Съешь же ещё этих мягких булок", "مرحبا بالعالم",
         "emoji 🤖🎉👍🏽 and ZWJ 👩‍💻", "é ä ñ combining", "1234567890 3.14159 2026-12-03",
         "tab\there\r\nCRLF  two  spaces", "It's they're we'll I'd", "ÀÉÎÕÜ ßẞ ǅ ﬁ", "日本語のテキストです。"]


def end_text(tokenizer: str) -> str:
    return {"cl100k": "<|endoftext|>", "deepseek-v4": "<｜end▁of▁sentence｜>"}.get(tokenizer, "<|im_end|>")


def source_paths() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inside = [p for p in [*stdlib.rglob("*.py"), *stdlib.rglob("LICENSE*")] if "site-packages" not in p.parts]
    licences = Path("/usr/share/common-licenses")
    return sorted(inside) + sorted(licences.glob("*") if licences.is_dir() else [])


def source_texts() -> list[str]:
    texts = []
    for path in source_paths():
        try:
            texts.append(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return [t for t in texts if t]


def slices() -> Iterator[str]:
    """Distinct slices of the source texts, pass after pass, until every offset is used."""
    texts, seen = source_texts(), set()
    for p in range(SLICE):
        offset = p * STEP % SLICE
        for text in texts:
            for start in range(offset, len(text), SLICE):
                piece = text[start : start + SLICE]
                key = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                if key not in seen:
                    seen.add(key)
                    yield piece
    raise ValueError(f"only {len(seen)} distinct slices in the source texts")


def splits(tok, token_id: int, cache: dict) -> list[tuple[int, int]]:
    """The pairs of tokens whose bytes spell ``token_id``'s bytes (empty for one-byte tokens)."""
    if token_id not in cache:
        data, ids = tok.token_bytes[token_id], tok.bytes_to_id
        cache[token_id] = [(ids[data[:i]], ids[data[i:]]) for i in range(1, len(data))
                           if data[:i] in ids and data[i:] in ids]
    return cache[token_id]


def mixed_in(piece: str, k: int, rng: random.Random, every: int = MIXED_ONE) -> str:
    """One slice in ``every`` (default MIXED_ONE) with three runs of other scripts put in at a random place."""
    if k % every:
        return piece
    at = rng.randrange(len(piece) + 1)
    return piece[:at] + " " + " ".join(rng.sample(MIXED, 3)) + piece[at:]


def cold_records(n: int, seed: int = 7, tokenizer: str = "smollm2", mixed: bool = False,
                 every: int = MIXED_ONE) -> Iterator[tuple[dict, bool]]:
    """``n`` records {"id", "dataset", "output_ids"}, each with whether its ids were made non-canonical."""
    from recon import load_tokenizer

    tok = load_tokenizer(tokenizer)
    end = tok.piece_to_id(end_text(tokenizer))
    assert end is not None, f"{tokenizer} has no end-of-turn token"
    rng, cache, source, k, due = random.Random(seed), {}, slices(), 0, False
    mixer = random.Random(seed + 1)
    while k < n:
        batch = [next(source) for _ in range(min(BATCH, n - k))]
        if mixed:
            batch = [mixed_in(piece, k + j, mixer, every) for j, piece in enumerate(batch)]
        for ids in tok.encode_batch(batch):
            due = due or k % ODD_ONE == ODD_ONE - 1  # a record without a multi-byte token passes it on
            spots = [i for i, t in enumerate(ids) if t not in tok.added_ids and splits(tok, t, cache)] if due else []
            if spots:
                i = rng.choice(spots)
                ids[i : i + 1] = rng.choice(splits(tok, ids[i], cache))
                due = False
            yield {"id": str(k), "dataset": "cold", "output_ids": [*ids, end]}, bool(spots)
            k += 1


def write_cold(path: Path, n: int, seed: int = 7, tokenizer: str = "smollm2", mixed: bool = False,
               every: int = MIXED_ONE) -> list[int]:
    """Write ``n`` cold records to ``path`` as JSONL, streaming; the indices made non-canonical.
    ``every``: with ``mixed``, one record in ``every`` carries other scripts (1: every record)."""
    odd = []
    with open(path, "w") as f:
        for k, (record, changed) in enumerate(cold_records(n, seed, tokenizer, mixed, every)):
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
            if changed:
                odd.append(k)
    return odd


def floor(path: Path, tokenizer: str = "smollm2") -> dict:
    """The tokenizer's native floor on ``path``: one batched decode plus one batched encode (HF
    ``tokenizers``: its fast batch calls; tiktoken: ``decode_batch`` and ``encode_batch(...,
    allowed_special="all", num_threads=2)``).

    Loading the tokenizer and reading the ids are not timed."""
    from recon import load_tokenizer

    core = load_tokenizer(tokenizer).core
    with open(path) as f:
        ids = [json.loads(line)["output_ids"] for line in f]
    hf = hasattr(core, "encode_batch_fast")
    start, cpu = time.perf_counter(), time.process_time()
    if hf:
        texts = core.decode_batch(ids, skip_special_tokens=False)
        encoded = [e.ids for e in core.encode_batch_fast(texts, add_special_tokens=False)]
    else:
        texts = core.decode_batch(ids, errors="replace", num_threads=2)
        encoded = core.encode_batch(texts, allowed_special="all", num_threads=2)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu  # cpu: every thread's
    mismatched = [k for k, (e, sample) in enumerate(zip(encoded, ids)) if e != sample]
    return {"seconds": seconds, "cpu_s": cpu, "samples": len(ids), "exact": len(ids) - len(mismatched), "mismatched": mismatched,
            "text_mb": sum(len(t.encode()) for t in texts) / 1e6}


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        name = sys.argv[4] if len(sys.argv) > 4 else "smollm2"
        print(len(write_cold(Path(sys.argv[2]), int(sys.argv[3]), tokenizer=name, mixed=sys.argv[5:6] == ["mixed"])),
              "non-canonical")
    elif sys.argv[1:2] == ["floor"]:
        print(json.dumps(floor(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "smollm2")))
    else:
        raise SystemExit(__doc__)
