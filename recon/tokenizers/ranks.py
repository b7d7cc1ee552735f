"""tiktoken ranks files (``BASE64 RANK`` per line), read as data and checked.

Why a module of its own: a ranks file is untrusted input like any other file recon reads, so
every line is checked (a one-line error names the file and line, never a traceback), and it is
read at every start of every process that audits with a tiktoken tokenizer, so a well-formed
file is read in bulk (:func:`recon.kernel.parse_ranks`: one C pass that checks and decodes it
whole, or a regex pass then C-speed splits and decodes).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from recon.errors import TokenizerLoadError
from recon.kernel import parse_ranks



def read_ranks(path: Path, limit: int | None = None) -> dict[bytes, int]:
    """A tiktoken ranks file (``BASE64 RANK`` per line) as {token bytes: rank}, checked line by line.

    A file whose every line is well-formed (one regex pass over it) is read in bulk, its
    duplicates counted after; any other is read line by line, which names the first bad line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerLoadError(f"{path}: cannot read ({e.strerror})") from None
    if limit is None and data and (got := parse_ranks(data)) is not None:
        ranks, lines = got
        if ranks and len(ranks) == lines and b"" not in ranks and \
                (_in_rank_order(ranks) or len(set(ranks.values())) == lines):
            return ranks
    return _read_ranks_by_line(path, data.splitlines(), limit)


def _in_rank_order(ranks: dict[bytes, int]) -> bool:
    """Whether the ranks are 0, 1, 2... in the dict's order (as every published file lists them):
    then no rank repeats, and the keys listed are the tokens by rank."""
    import numpy as np

    n = len(ranks)
    return bool((np.fromiter(ranks.values(), np.int64, n) == np.arange(n)).all())


def tokens_by_rank(ranks: dict[bytes, int]) -> list[bytes]:
    """``table[rank]`` is the token of that rank, ``b""`` for a rank no token has (up to the
    largest). Ranks in order are listed as they are (one copy, no loop over the vocabulary in
    Python: this runs at every start)."""
    if _in_rank_order(ranks):
        return list(ranks)
    table = [b""] * (max(ranks.values(), default=-1) + 1)
    for data, rank in ranks.items():
        table[rank] = data
    return table


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
