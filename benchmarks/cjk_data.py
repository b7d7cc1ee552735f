"""CJK-heavy benchmark data: distinct records of real translated text found on this machine.

The text is every message translation of the gettext catalogs that Debian packages install for
Chinese, Japanese and Korean (``/usr/share/locale/{zh_CN,zh_TW,ja,ko}/LC_MESSAGES/*.mo`` and the
same under ``/usr/share/vim``), read with Python's own ``gettext`` parser, in file order; a
translation already seen is skipped, and short ones are joined (with a newline) until a record
holds 200 to 900 characters. So no two records hold the same text and nothing is tuned on: the
catalogs are whatever the image ships. Each record is encoded with the tokenizer's own encoder
and ends with its end-of-turn token; one record in seven has one multi-byte token replaced by a
non-canonical split into two tokens spelling the same bytes (as ``cold_data.py`` does), so
exactly those records do not round-trip.

    python benchmarks/cjk_data.py write FILE N [TOKENIZER]
"""

from __future__ import annotations

import gettext
import json
import random
import sys
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_data import ODD_ONE, end_text, splits  # noqa: E402

LANGUAGES = ("zh_CN", "zh_TW", "ja", "ko")
ROOTS = (Path("/usr/share/locale"), Path("/usr/share/vim"))
SHORTEST, LONGEST = 200, 900


def catalog_paths() -> list[Path]:
    found = []
    for root in ROOTS:
        if root.is_dir():
            for lang in LANGUAGES:
                found += sorted(p for p in root.rglob("*.mo") if f"/{lang}/" in str(p) or f"/{lang}." in str(p))
    return found


def translations() -> Iterator[str]:
    """Every distinct non-empty translation, catalog by catalog."""
    seen: set[str] = set()
    for path in catalog_paths():
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        for key, text in catalog._catalog.items():  # the parsed catalog: what gettext would answer
            if isinstance(text, str) and text.strip() and key and text not in seen and not text.isascii():
                seen.add(text)
                yield text


def texts() -> Iterator[str]:
    """Records' texts: translations joined until 200-900 characters (longer ones cut)."""
    buf: list[str] = []
    size = 0
    for t in translations():
        t = t[:LONGEST]
        if size + len(t) > LONGEST and size >= SHORTEST:
            yield "\n".join(buf)
            buf, size = [], 0
        buf.append(t)
        size += len(t) + 1
        if size >= SHORTEST and size <= LONGEST and len(buf) > 3:
            yield "\n".join(buf)
            buf, size = [], 0
    if size >= SHORTEST:
        yield "\n".join(buf)


def cjk_records(n: int, seed: int = 11, tokenizer: str = "smollm2") -> Iterator[dict]:
    for record, _ in cjk_records_marked(n, seed, tokenizer):
        yield record


def write_cjk(path: Path, n: int, seed: int = 11, tokenizer: str = "smollm2") -> list[int]:
    """Write up to ``n`` CJK records to ``path`` as JSONL; the indices made non-canonical."""
    odd = []
    with open(path, "w", encoding="utf-8") as f:
        for k, (record, changed) in enumerate(cjk_records_marked(n, seed, tokenizer)):
            f.write(json.dumps(record) + "\n")
            if changed:
                odd.append(k)
    return odd


def cjk_records_marked(n: int, seed: int = 11, tokenizer: str = "smollm2") -> Iterator[tuple[dict, bool]]:
    """``cjk_records``' records, each with whether its ids were made non-canonical."""
    import recon

    tok = recon.load_tokenizer(tokenizer)
    end = tok.encode(end_text(tokenizer))
    rng, cache, k = random.Random(seed), {}, 0
    for text in texts():
        if k >= n:
            return
        ids = tok.encode(text, allow_special=False)
        changed = False
        if k % ODD_ONE == 0:
            multi = [j for j, i in enumerate(ids) if len(tok.id_to_bytes(i)) > 1 and splits(tok, i, cache)]
            if multi:
                j = rng.choice(multi)
                ids = ids[:j] + list(rng.choice(splits(tok, ids[j], cache))) + ids[j + 1:]
                changed = True
        yield {"id": f"cjk-{k}", "output_ids": ids + end}, changed
        k += 1


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[1] != "write":
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    path, n = Path(sys.argv[2]), int(sys.argv[3])
    tokenizer = sys.argv[4] if len(sys.argv) > 4 else "smollm2"
    wrote = 0
    with open(path, "w", encoding="utf-8") as f:
        for rec in cjk_records(n, tokenizer=tokenizer):
            f.write(json.dumps(rec) + "\n")
            wrote += 1
    print(f"wrote {wrote} records to {path} (asked for {n}; the catalogs on this machine hold what they hold)")


if __name__ == "__main__":
    main()
