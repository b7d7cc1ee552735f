"""Reading sample files: JSONL (optionally gzipped), one JSON object a line.

Every problem names the file, the line and the field; good records go on.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, NamedTuple

from recon.errors import ReconError, one_line
from recon.kernel import digit_run


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


#: The longest line read, in bytes. A longer line is reported and skipped without being held in
#: memory, so one runaway line (or a file with no newlines) cannot exhaust it.
MAX_LINE_BYTES = 256 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"
#: a JSON escape of a UTF-16 surrogate: the only way JSON text can hold a string that is not Unicode
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


try:  # 2-3x faster on lines of ids; the standard parser stays the reference for every bad line
    import orjson as _orjson
except ImportError:  # pragma: no cover - a core dependency, but reading works without it
    _orjson = None
#: orjson reads an integer past 64 bits as a float, json keeps it an int: a line with a run of
#: this many digits or more goes to json (:func:`recon.kernel.digit_run`: one pass in C)
_LONG_NUMBER = 19


def _raw_lines(f: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """The file's lines as bytes (split at ``\\n`` only), ``None`` for a line over ``limit`` bytes,
    which is read past in pieces and never held whole."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while True:
                rest = f.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
            continue
        yield line


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(obj: Any, where: str = "") -> str | None:
    """The field (``response.content``, ``meta.note``...) of the first string holding a lone
    UTF-16 surrogate (``"\\ud800"`` in JSON), which no tokenizer or UTF-8 writer accepts."""
    if isinstance(obj, str):
        return None if _is_text(obj) else (where or "(the line)")
    if isinstance(obj, list):
        children = [(f"{where}[{k}]", v) for k, v in enumerate(obj)]
    elif isinstance(obj, dict):
        if not all(_is_text(key) for key in obj):
            return where or "(the line)"
        children = [(f"{where}.{key}" if where else key, v) for key, v in obj.items()]
    else:
        return None
    for name, value in children:
        found = _lone_surrogate(value, name)
        if found:
            return found
    return None


def _parse_line(raw: bytes, path: str | Path, lineno: int, allow_arrays: bool) -> dict | list | RecordError | None:
    """One line: the parsed object, a RecordError saying what is wrong with it, or None if blank."""
    if lineno == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]  # a UTF-8 byte-order mark (Windows editors write one) is not data
    if not raw.strip():
        return None
    if _orjson is not None and not digit_run(raw, _LONG_NUMBER):
        try:
            obj = _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # the standard parser below says what is wrong, in its words
        else:
            if isinstance(obj, dict) or (allow_arrays and isinstance(obj, list)):
                return obj  # orjson refuses invalid UTF-8 and lone surrogates, so nothing else to check
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return RecordError(str(path), lineno, "", f"not valid UTF-8 (byte {e.start} of the line)")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return RecordError(str(path), lineno, "", f"not valid JSON ({e.msg}, column {e.colno})")
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        return RecordError(str(path), lineno, "", f"not usable JSON ({one_line(e)})")
    except RecursionError:
        return RecordError(str(path), lineno, "", "not usable JSON (nested too deeply)")
    if not isinstance(obj, dict) and not (allow_arrays and isinstance(obj, list)):
        return RecordError(str(path), lineno, "", "expected a JSON object")
    if _SURROGATE_ESCAPE.search(text):
        try:
            where = _lone_surrogate(obj)
        except RecursionError:
            return RecordError(str(path), lineno, "", "not usable JSON (nested too deeply)")
        if where is not None:
            return RecordError(str(path), lineno, where, "holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape), not text")
    return obj


class LineSpan(NamedTuple):
    """Where a line lies in its plain (uncompressed) file, bytes ``start`` to ``end``: what the
    audit's reader sends a local worker instead of the bytes, which the worker reads itself
    (:func:`read_spans`): shipping a chunk's megabytes through a pipe kept both sides waiting."""

    start: int
    end: int


def iter_raw_lines(path: str | Path, *,
                   spans: bool = False) -> Iterator[tuple[int, bytes | LineSpan | RecordError]]:
    """(line number, the line's bytes or a RecordError) for each line, streaming, not parsed: what
    :func:`iter_json_lines` reads, for a caller that parses elsewhere (the audit's workers do).
    With ``spans``, a plain file's lines come as :class:`LineSpan` s instead of bytes.

    A line over :data:`MAX_LINE_BYTES` is reported; a gzip file that is cut or corrupt is read up
    to the damage, which is reported as one bad line."""
    path = Path(path)
    spans = spans and path.suffix != ".gz" and path.is_file()  # (a pipe, /dev/stdin, can't be read twice)
    try:  # (a plain file through a 64 KB buffer: lines of ids run to several KB, the default is 8)
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb", buffering=1 << 16) as f:
            lineno = offset = 0
            try:
                for lineno, raw in enumerate(_raw_lines(f, MAX_LINE_BYTES), 1):
                    if raw is None:
                        yield lineno, RecordError(str(path), lineno, "", f"line longer than {MAX_LINE_BYTES} bytes; skipped")
                        offset = f.tell() if spans else 0
                    elif spans:
                        yield lineno, LineSpan(offset, offset + len(raw))
                        offset += len(raw)
                    else:
                        yield lineno, raw
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                yield lineno + 1, RecordError(str(path), lineno + 1, "", f"file is cut or corrupt here ({one_line(e)})")
    except FileNotFoundError:
        raise ReconError(f"{path}: no such file") from None
    except OSError as e:
        raise ReconError(f"{path}: cannot read ({e.strerror or e})") from None


def read_spans(items: list[tuple[str, int, object]]) -> list[tuple[str, int, object]]:
    """``items`` (path, line, item) with every :class:`LineSpan` item made the bytes it spans:
    each file's spans read in one read from the first to the last."""
    reach: dict[str, tuple[int, int]] = {}
    for path, _, item in items:
        if type(item) is LineSpan:
            lo, hi = reach.get(path, (item.start, item.end))
            reach[path] = (min(lo, item.start), max(hi, item.end))
    if not reach:
        return items
    data = {}
    for path, (lo, hi) in reach.items():
        try:
            with open(path, "rb") as f:
                f.seek(lo)
                data[path] = f.read(hi - lo)
        except OSError as e:
            raise ReconError(f"{path}: cannot read ({e.strerror or e})") from None
        if len(data[path]) != hi - lo:
            raise ReconError(f"{path}: the file changed while it was being read")
    def bytes_of(path: str, item: LineSpan) -> bytes:
        lo = reach[path][0]
        return data[path][item.start - lo : item.end - lo]

    return [(path, line, bytes_of(path, item) if type(item) is LineSpan else item) for path, line, item in items]


def parse_line(raw: bytes | RecordError, path: str | Path, lineno: int, *, allow_arrays: bool = False) -> dict | list | RecordError | None:
    """One line from :func:`iter_raw_lines`: the parsed object, a RecordError, or None if blank."""
    if isinstance(raw, RecordError):
        return raw
    return _parse_line(raw, path, lineno, allow_arrays)


def iter_json_lines(path: str | Path, *, allow_arrays: bool = False) -> Iterator[tuple[int, dict | list | RecordError]]:
    """(line number, parsed object or RecordError) for each non-blank line, streaming.
    With ``allow_arrays`` a line may also hold a JSON array (a batched server response).

    Lines are read as bytes and decoded one by one, so a line of invalid UTF-8 is reported and
    the lines after it are still read. A UTF-8 BOM at the start of the file is skipped; CRLF line
    ends are accepted (lines end at ``\\n``); see :func:`iter_raw_lines` for long lines and damaged gzip."""
    for lineno, raw in iter_raw_lines(path):
        item = parse_line(raw, path, lineno, allow_arrays=allow_arrays)
        if item is not None:
            yield lineno, item
