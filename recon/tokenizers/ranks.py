"""tiktoken ranks files (``BASE64 RANK`` per line), read as data and checked.

Why a module of its own: a ranks file is untrusted input like any other file recon reads, so
every line is checked (a one-line error names the file and line, never a traceback), and it is
read at every start of every process that audits with a tiktoken tokenizer, so a well-formed
file is read in bulk (one regex pass checks it whole, then C-speed splits and decodes).
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from recon.errors import TokenizerLoadError

#: A whole ranks file of well-formed lines (what :func:`read_ranks` checks in one pass first).
_RANKS_FILE = re.compile(rb"(?:[A-Za-z0-9+/]+={0,2} [0-9]{1,10}\r?\n)*(?:[A-Za-z0-9+/]+={0,2} [0-9]{1,10}\r?\n?)?")


def read_ranks(path: Path, limit: int | None = None) -> dict[bytes, int]:
    """A tiktoken ranks file (``BASE64 RANK`` per line) as {token bytes: rank}, checked line by line.

    A file whose every line is well-formed (one regex pass over it) is read in bulk, its
    duplicates counted after; any other is read line by line, which names the first bad line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerLoadError(f"{path}: cannot read ({e.strerror})") from None
    if limit is None and data and _RANKS_FILE.fullmatch(data):
        parts = data.split()  # token, rank, token, rank... (each line is exactly one of each)
        try:
            ranks = dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2])))
        except (ValueError, binascii.Error):  # (a padding error, say): the slow path says where
            ranks = {}
        lines = len(parts) // 2
        if ranks and len(ranks) == lines and len(set(ranks.values())) == lines and b"" not in ranks:
            return ranks
    return _read_ranks_by_line(path, data.splitlines(), limit)


def _read_ranks_by_line(path: Path, lines: list[bytes], limit: int | None) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    seen_ranks: set[int] = set()
    for lineno, line in enumerate(lines, 1):
        if limit is not None and len(ranks) >= limit:
            break
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > 10:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            shown = line[:60].decode("utf-8", "replace")
            raise TokenizerLoadError(f"{path}, line {lineno}: expected 'BASE64 RANK', got {shown!r}") from None
        if not token:
            raise TokenizerLoadError(f"{path}, line {lineno}: empty token (rank {rank})")
        if token in ranks or rank in seen_ranks:
            raise TokenizerLoadError(f"{path}, line {lineno}: duplicate rank or token (rank {rank})")
        ranks[token] = rank
        seen_ranks.add(rank)
    if not ranks:
        raise TokenizerLoadError(f"{path}: no ranks in this file")
    return ranks
