"""docs/benchmarks.md: every table sits between markers that benchmarks/docs.py knows, and the
tables made from bundled rows are exactly what their command prints now."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def load_docs_script():
    spec = importlib.util.spec_from_file_location("benchmarks_docs", ROOT / "benchmarks" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sections(text: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"<!-- bench:([\w-]+) -->\n(.*?)\n<!-- /bench:\1 -->", text, re.S)}


def test_every_section_has_a_command_and_every_table_a_section():
    docs = load_docs_script()
    text = DOC.read_text(encoding="utf-8")
    found = sections(text)
    assert set(found) == set(docs.SECTIONS)
    outside = re.sub(r"<!-- bench:([\w-]+) -->\n.*?\n<!-- /bench:\1 -->", "", text, flags=re.S)
    assert not re.search(r"^\|", outside, re.M), "a table outside the bench markers: nothing recomputes it"
    for name, body in found.items():
        assert body.startswith(f"*Made by `python {docs.command(name, '--quick' in body.splitlines()[0])}`"), name


@pytest.mark.parametrize("name", sorted(load_docs_script().EXACT))
def test_tables_from_bundled_rows_are_what_their_command_prints(name):
    docs = load_docs_script()
    printed, _ = docs.run(name, quick=False)
    body = sections(DOC.read_text(encoding="utf-8"))[name]
    assert body.split("\n\n", 1)[1] == printed
