"""Read a GGUF file's metadata (where its tokenizer lives) without touching its tensors.

``gguf.GGUFReader`` maps and indexes every tensor and array element up front, which takes
about 3 s on SmolLM2-135M; a tokenizer needs only the key/value header at the start of the
file. This reader parses that header (GGUF v2/v3, little-endian) and stops.

A GGUF is a downloaded file, so every length and count in it is checked against the bytes the
file still holds *before* anything is allocated or read (an array of N strings needs at least
8*N more bytes, an array of N u32 4*N), arrays nest at most :data:`MAX_DEPTH` deep, and an
unknown type is refused. Every error names the file and the key being read, e.g.
``model.gguf: key tokenizer.ggml.tokens: array of 9223372036854775807 items does not fit in the
1234 bytes left``. Memory therefore stays proportional to the header's real size.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from recon.errors import TokenizerLoadError

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
#: Arrays of arrays are legal GGUF; real files nest one deep. Deeper is refused, not recursed into.
MAX_DEPTH = 4
#: The fewest bytes one value of each type takes (a string: its 8-byte length; an array: type + count).
_MIN_SIZE = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, STRING: 8, ARRAY: 12}


class _Header:
    """A cursor over the header that knows how many bytes are left and which key it is in."""

    def __init__(self, f: BinaryIO, path: Path, size: int):
        self.f, self.path, self.size = f, path, size
        self.field = "the file header"

    def fail(self, problem: str) -> TokenizerLoadError:
        return TokenizerLoadError(f"{self.path}: {self.field}: {problem}")

    @property
    def left(self) -> int:
        return self.size - self.f.tell()

    def read(self, n: int) -> bytes:
        if n > self.left:
            raise self.fail(f"needs {n} more bytes but the file ends {self.left} bytes on (truncated file?)")
        data = self.f.read(n)
        if len(data) != n:
            raise self.fail("the file ends early (truncated file?)")
        return data

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self, strict: bool) -> str:
        n = self.unpack("<Q")
        if n > self.left:
            raise self.fail(f"string of {n} bytes does not fit in the {self.left} bytes left")
        data = self.read(n)
        try:
            return data.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError as e:
            raise self.fail(f"string is not valid UTF-8 (byte {e.start})") from None

    def array_header(self, depth: int) -> tuple[int, int]:
        """An array's item type and count, checked: known type, nesting, and room in the file."""
        if depth >= MAX_DEPTH:
            raise self.fail(f"arrays nested more than {MAX_DEPTH} deep")
        item_type, count = self.unpack("<I"), self.unpack("<Q")
        if item_type not in _MIN_SIZE:
            raise self.fail(f"array of unknown GGUF value type {item_type}")
        if count * _MIN_SIZE[item_type] > self.left:
            raise self.fail(f"array of {count} items does not fit in the {self.left} bytes left")
        return item_type, count

    def value(self, vtype: int, strict: bool, depth: int = 0) -> Any:
        if vtype == STRING:
            return self.string(strict)
        if vtype == ARRAY:
            item_type, count = self.array_header(depth)
            if item_type in _NUMPY:
                dtype = np.dtype(_NUMPY[item_type])
                items = np.frombuffer(self.read(dtype.itemsize * count), dtype=dtype)
                return items.astype(bool).tolist() if item_type == 7 else items.tolist()
            return [self.value(item_type, strict, depth + 1) for _ in range(count)]
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        raise self.fail(f"unknown GGUF value type {vtype}")

    def _skip_strings(self, count: int) -> None:
        """Step over ``count`` strings, their lengths read from 1 MiB windows (a vocabulary of
        49,152 strings in a few milliseconds, not a read and a check per string)."""
        base, buf, off = self.f.tell(), b"", 0
        for _ in range(count):
            if off + 8 > len(buf):
                base += off
                self.f.seek(base)
                buf, off = self.f.read(1 << 20), 0
                if len(buf) < 8:
                    raise self.fail("the file ends inside an array of strings (truncated file?)")
            off += 8 + struct.unpack_from("<Q", buf, off)[0]
            if base + off > self.size:
                raise self.fail(f"string does not fit in the {self.size - base} bytes left")
        self.f.seek(base + off)

    def skip(self, vtype: int, depth: int = 0) -> None:
        """Move past a value without building it (its lengths still checked against the file)."""
        if vtype == STRING:
            n = self.unpack("<Q")
            if n > self.left:
                raise self.fail(f"string of {n} bytes does not fit in the {self.left} bytes left")
            self.f.seek(n, os.SEEK_CUR)
        elif vtype == ARRAY:
            item_type, count = self.array_header(depth)
            if item_type in _SCALARS:
                self.f.seek(_MIN_SIZE[item_type] * count, os.SEEK_CUR)
            elif item_type == STRING:
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.skip(item_type, depth + 1)
        elif vtype in _SCALARS:
            self.f.seek(_MIN_SIZE[vtype], os.SEEK_CUR)
        else:
            raise self.fail(f"unknown GGUF value type {vtype}")


def _shown(key: str) -> str:
    """A key as an error message shows it: as is if it is a short printable name, else quoted and cut."""
    return key if key.isprintable() and len(key) <= 80 else repr(key[:80])


def read_gguf_metadata(path: Path, keys: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (tokenizer arrays included), as Python values; with
    ``keys``, only the keys it accepts (the others are stepped over unbuilt: a chat template is
    read without decoding 49,152 vocabulary strings).

    Strings under ``tokenizer.*`` must be valid UTF-8 (a vocabulary with bytes replaced would be
    silently wrong); elsewhere invalid bytes become U+FFFD."""
    try:
        with open(path, "rb") as f:
            h = _Header(f, path, os.fstat(f.fileno()).st_size)
            if h.left < 4 or h.read(4) != b"GGUF":
                raise TokenizerLoadError(f"{path}: not a GGUF file (no 'GGUF' magic at the start)")
            version = h.unpack("<I")
            if version not in (2, 3):
                raise TokenizerLoadError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            h.unpack("<Q")  # tensor count: the tensors are not read
            h.field = "the key/value count"
            n_kv = h.unpack("<Q")
            if n_kv * (8 + 4) > h.left:  # each entry: a key length and a type, at least
                raise h.fail(f"{n_kv} entries do not fit in the {h.left} bytes left (truncated file?)")
            meta: dict[str, Any] = {}
            previous = None
            for k in range(n_kv):
                h.field = f"key #{k}" + (f" (after {previous})" if previous else "")
                key = h.string(strict=True)
                h.field = f"key {_shown(key)}"
                if key in meta:
                    raise h.fail("appears twice in the header")
                if keys is not None and not keys(key):
                    h.skip(h.unpack("<I"))
                    previous = _shown(key)
                    continue
                meta[key] = h.value(h.unpack("<I"), strict=key.startswith("tokenizer."))
                previous = _shown(key)
            return meta
    except OSError as e:
        raise TokenizerLoadError(f"{path}: cannot read ({e.strerror or e})") from None
