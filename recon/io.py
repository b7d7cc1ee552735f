"""Reading sample files: JSONL (optionally gzipped), one JSON object a line.

Every problem names the file, the line and the field; good records go on.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import ReconError


@dataclass(frozen=True)
class RecordError:
    """One bad record: where it is and what is wrong with it."""

    path: str
    line: int
    field: str
    problem: str

    def __str__(self) -> str:
        field = f", field {self.field}" if self.field else ""
        return f"{self.path}, line {self.line}{field}: {self.problem}"


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, dict | RecordError]]:
    """(line number, parsed object or RecordError) for each non-blank line, streaming."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lineno = 0
            try:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        yield lineno, RecordError(str(path), lineno, "", f"not valid JSON ({e.msg}, column {e.colno})")
                        continue
                    if not isinstance(obj, dict):
                        yield lineno, RecordError(str(path), lineno, "", "expected a JSON object")
                        continue
                    yield lineno, obj
            except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
                yield lineno + 1, RecordError(str(path), lineno + 1, "", f"file is cut or corrupt here ({e})")
    except FileNotFoundError:
        raise ReconError(f"{path}: no such file") from None
    except OSError as e:
        raise ReconError(f"{path}: cannot read ({e.strerror or e})") from None


def read_output_ids(path: str | Path, vocab_size: int | None = None) -> tuple[list[list[int]], list[RecordError]]:
    """The ``output_ids`` of every record that has valid ones, and an error for every other record."""
    ids_list: list[list[int]] = []
    errors: list[RecordError] = []
    for lineno, obj in iter_json_lines(path):
        if isinstance(obj, RecordError):
            errors.append(obj)
            continue
        ids = obj.get("output_ids")
        problem = _check_ids(ids, vocab_size)
        if problem:
            errors.append(RecordError(str(path), lineno, "output_ids", problem))
        else:
            ids_list.append(ids)
    return ids_list, errors


def _check_ids(ids, vocab_size: int | None) -> str | None:
    if ids is None:
        return "missing"
    if not isinstance(ids, list):
        return f"expected a list of ints, got {type(ids).__name__}"
    for k, i in enumerate(ids):
        if isinstance(i, bool) or not isinstance(i, int):
            return f"item {k} is {i!r}, not an int"
        if i < 0 or (vocab_size is not None and i >= vocab_size):
            return f"item {k} is {i}, outside the vocabulary (0..{vocab_size - 1 if vocab_size else '?'})"
    return None
