"""The house's rules, read off the source: data flows one way down the floors, and the modules of
the first, flat layout still import as the very modules that hold them now."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import recon

PACKAGE = Path(recon.__file__).parent
#: the floors of docs/architecture.md; a room imports from lower floors (and its own room) only
FLOORS = {"errors": 0, "kernel": 0, "tokenizers": 1, "samples": 1, "prompts": 2, "audit": 3, "recovery": 4, "server": 5,
          "notebook": 5, "cli": 6}


def _room(module: str) -> str | None:
    """``recon.audit.engine`` -> ``audit``; ``recon`` itself (its top-level names) -> ``tokenizers``."""
    parts = module.split(".")
    if parts[0] != "recon":
        return None
    if len(parts) == 1:
        return "tokenizers"  # `from recon import load_tokenizer`
    return recon.MOVED.get(parts[1], module).split(".")[1] if parts[1] in recon.MOVED else parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):  # function-level imports too: they are edges all the same
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "<relative>"))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_data_flows_down_the_floors(path):
    room = path.relative_to(PACKAGE).parts[0]
    assert room in FLOORS, f"{room}: a room docs/architecture.md does not draw"
    upward = []
    for line, module in _imports(path):
        assert module != "<relative>", f"{path}:{line}: a relative import (name the room)"
        other = _room(module)
        if other is None or other == room:
            continue
        if FLOORS[other] >= FLOORS[room] and other != "errors":
            upward.append(f"{path.relative_to(PACKAGE)}:{line} imports {module} ({other}, floor {FLOORS[other]})")
    assert upward == []


def test_the_rules_can_fail():
    """The floor check reads real edges: the CLI imports from the audit room, not the reverse."""
    cli = {m for _, m in _imports(PACKAGE / "cli" / "audit.py")}
    assert any(_room(m) == "audit" for m in cli)
    assert FLOORS["audit"] < FLOORS["cli"]


@pytest.mark.parametrize("old", sorted(recon.MOVED))
def test_flat_module_names_still_import_as_the_same_module(old):
    new = importlib.import_module(recon.MOVED[old])
    aliased = importlib.import_module(f"recon.{old}")
    assert aliased is new
    assert new.__spec__.name == recon.MOVED[old]  # the module keeps its own name and spec
    assert getattr(recon, old) is new  # `from recon import specials` too


def test_public_names_the_readme_and_notebooks_use():
    from recon import audit, load_tokenizer, plots, specials, stats, views  # noqa: F401
    from recon.profiles import load_profile  # noqa: F401 - the flat path
    from recon.records import read_records  # noqa: F401
    from recon.report import record  # noqa: F401

    assert audit.audit_records is importlib.import_module("recon.audit.compare").audit_records
    assert specials.discover.__module__ == "recon.tokenizers.specials"


#: a module this long must say in its docstring why it is one module
LONG = 420


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_long_without_a_reason(path):
    lines = path.read_text().count("\n")
    if lines > LONG:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "one module because" in doc, f"{path.relative_to(PACKAGE)}: {lines} lines and no reason in its docstring"
