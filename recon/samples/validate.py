"""Field checks of the sample format: each problem as (file, line, field, problem), the record's
other fields checked on. :func:`recon.samples.records.parse_record` calls these."""

from __future__ import annotations

from typing import Any

from recon.kernel import ids_ok
from recon.samples.io import RecordError


class _Problems:
    def __init__(self, path: str, line: int):
        self.path, self.line, self.items = path, line, []

    def add(self, field_name: str, problem: str) -> None:
        self.items.append(RecordError(self.path, self.line, field_name, problem))


def _ids(value: Any, name: str, vocab_size: int | None, p: _Problems, allow_empty: bool = False) -> list[int] | None:
    if not isinstance(value, list):
        p.add(name, f"expected a list of ints, got {type(value).__name__}")
        return None
    if not value and not allow_empty:
        p.add(name, "empty")
        return None
    if ids_ok(value, -1 if vocab_size is None else vocab_size):
        return value  # the common case, checked in one C loop; otherwise find the first bad item
    for k, i in enumerate(value):
        if type(i) is not int:
            p.add(name, f"item {k} is {i!r} ({type(i).__name__}), not an int")
            return None
        if i < 0 or (vocab_size is not None and i >= vocab_size):
            top = f"0..{vocab_size - 1}" if vocab_size else "ids are >= 0"
            p.add(name, f"item {k} is {i}, outside the vocabulary ({top})")
            return None
    return value


def _opt_str(obj: dict, key: str, name: str, p: _Problems) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        p.add(name, f"expected a string or null, got {type(value).__name__}")
        return None
    return value


def _messages(messages: Any, p: _Problems) -> None:
    """Chat messages as a template reads them: objects with a string ``role``. Content is the
    template's business (a string, a list of parts, or null with tool calls)."""
    if not isinstance(messages, list):
        p.add("messages", "expected a list")
        return
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            p.add(f"messages[{k}]", f"expected an object, got {type(m).__name__}")
            return
        if not isinstance(m.get("role"), str):
            p.add(f"messages[{k}].role", "missing or not a string")
            return


def conversation_fields(obj: dict, p: _Problems) -> tuple[str | None, int | None]:
    """``conversation`` (a non-empty string; an int is taken as its text) and ``turn`` (an int,
    0 or more): the trajectory a record belongs to and its place in it. A ``turn`` needs a
    ``conversation``; a ``conversation`` without ``turn`` takes its place from the file's order."""
    conv, turn = obj.get("conversation"), obj.get("turn")
    if isinstance(conv, int) and not isinstance(conv, bool):
        conv = str(conv)
    if conv is not None and (not isinstance(conv, str) or not conv):
        p.add("conversation", "empty" if conv == "" else f"expected a non-empty string, got {type(conv).__name__}")
        conv = None
    if turn is not None:
        if type(turn) is not int or turn < 0:
            p.add("turn", f"expected an int 0 or more, got {turn!r}"[:120])
            turn = None
        elif obj.get("conversation") is None:
            p.add("turn", "a turn without a conversation (give both)")
    return conv, turn
