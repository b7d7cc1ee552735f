"""``recon tokens``: special tokens: discover, look up, check expected ids."""

from __future__ import annotations

import argparse
import json

from recon.errors import ReconError

TABLE_COLUMNS = ["id", "content", "special", "roles", "config_check", "roundtrip"]


def _json_rows(table) -> list[dict]:
    return json.loads(table.to_json(orient="records", force_ascii=False))


def _parse_expect(items: list[str]) -> dict[str, int]:
    expected = {}
    for item in items:
        text, sep, value = item.rpartition("=")
        if not sep or not text or not value.lstrip("-").isdigit():
            raise ReconError(f"--expect {item!r}: expected TEXT=ID, e.g. --expect '<|im_end|>=2'")
        expected[text] = int(value)
    return expected


def cmd_tokens(args: argparse.Namespace) -> int:
    import pandas as pd

    from recon import load_tokenizer
    from recon.tokenizers import specials

    tok = load_tokenizer(args.spec, family=args.family)
    table = specials.discover(tok)
    expected = specials.check_expected(tok, _parse_expect(args.expect)) if args.expect else None
    if args.find:
        found = [specials.find(table, q, args.limit) for q in args.find]
        shown = pd.concat(found, ignore_index=True) if found else table.iloc[:0]
        misses = [q for q, f in zip(args.find, found) if f.empty]
    else:
        shown, misses = table, []
    if args.json:
        print(json.dumps(_json_rows(shown), ensure_ascii=False, indent=1))
    else:
        print(f"{tok.name}: {tok.kind}, vocab_size {tok.vocab_size}, {len(tok.added_tokens)} added tokens")
        cols = (["query", "score"] if args.find else []) + TABLE_COLUMNS
        if len(shown):
            print(shown[cols].to_string(index=False))
        for q in misses:
            ids = tok.encode(q, allow_special=False)
            print(f"no added token matches {q!r}; as ordinary text it encodes to {len(ids)} ids: {ids}")
        print(specials.verdict(tok, table, expected))
    if expected is not None and not expected["ok"].all():
        specials.assert_expected(tok, _parse_expect(args.expect))  # raises with every mismatch named
    return 0


def add_tokens(sub) -> None:
    p = sub.add_parser("tokens", help="discover and check a tokenizer's special/added tokens")
    p.add_argument("spec", help="short name (smollm2, deepseek-v4, qwen3.6, cl100k), tokenizer.json, directory or .gguf")
    p.add_argument("--family", help="pre-tokenizer family for a tiktoken ranks file (kimi, qwen3.5, cl100k)")
    p.add_argument("--find", action="append", default=[], metavar="TEXT", help="look a token up by text or name (repeatable)")
    p.add_argument("--limit", type=int, default=5, help="candidates per --find (default 5)")
    p.add_argument("--expect", action="append", default=[], metavar="TEXT=ID", help="fail unless TEXT has id ID (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(func=cmd_tokens)
