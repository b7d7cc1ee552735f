"""Read a GGUF file's metadata (where its tokenizer lives) without touching its tensors.

``gguf.GGUFReader`` maps and indexes every tensor and array element up front, which takes
about 3 s on SmolLM2-135M; a tokenizer needs only the key/value header at the start of the
file. This reader parses that header (GGUF v2/v3, little-endian) and stops.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .errors import TokenizerLoadError

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


class _Header:
    def __init__(self, f: BinaryIO, path: Path):
        self.f, self.path = f, path

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise TokenizerLoadError(f"{self.path}: GGUF header ends early (truncated file?)")
        return data

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type == STRING:
                return [self.string() for _ in range(count)]
            if item_type in _NUMPY:
                dtype = np.dtype(_NUMPY[item_type])
                return np.frombuffer(self.read(dtype.itemsize * count), dtype=dtype).tolist()
            return [self.value(item_type) for _ in range(count)]
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        raise TokenizerLoadError(f"{self.path}: unknown GGUF value type {vtype} in the header")


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (tokenizer arrays included), as Python values."""
    try:
        with open(path, "rb") as f:
            h = _Header(f, path)
            if h.read(4) != b"GGUF":
                raise TokenizerLoadError(f"{path}: not a GGUF file (no 'GGUF' magic at the start)")
            version = h.unpack("<I")
            if version not in (2, 3):
                raise TokenizerLoadError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            h.unpack("<Q")  # tensor count
            n_kv = h.unpack("<Q")
            meta = {}
            for _ in range(n_kv):
                key = h.string()
                meta[key] = h.value(h.unpack("<I"))
            return meta
    except OSError as e:
        raise TokenizerLoadError(f"{path}: cannot read ({e.strerror})") from None
