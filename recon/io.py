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


def bad_record_count(errors: list[RecordError]) -> int:
    """Records with at least one problem (a record may have several)."""
    return len({(e.path, e.line) for e in errors})


def iter_json_lines(path: str | Path, *, allow_arrays: bool = False) -> Iterator[tuple[int, dict | list | RecordError]]:
    """(line number, parsed object or RecordError) for each non-blank line, streaming.
    With ``allow_arrays`` a line may also hold a JSON array (a batched server response)."""
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
                    if not isinstance(obj, dict) and not (allow_arrays and isinstance(obj, list)):
                        yield lineno, RecordError(str(path), lineno, "", "expected a JSON object")
                        continue
                    yield lineno, obj
            except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
                yield lineno + 1, RecordError(str(path), lineno + 1, "", f"file is cut or corrupt here ({e})")
    except FileNotFoundError:
        raise ReconError(f"{path}: no such file") from None
    except OSError as e:
        raise ReconError(f"{path}: cannot read ({e.strerror or e})") from None
