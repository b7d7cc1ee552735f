"""GPT-2's byte-level alphabet: every byte as one printable character.

Byte-level BPE vocabularies (GPT-2, SmolLM2, DeepSeek, Qwen2 in HF form) store a token's bytes
as a string in this alphabet (a space is ``Ġ``, a newline ``Ċ``). recon uses the same alphabet
to show tiktoken tokens as pieces, so a piece looks the same whichever core holds the vocabulary.
"""

from functools import lru_cache


@lru_cache(maxsize=1)
def byte_to_char() -> dict[int, str]:
    """The GPT-2 map from byte value to printable character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@lru_cache(maxsize=1)
def char_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_char().items()}


@lru_cache(maxsize=1)
def _to_chars() -> dict[int, str]:
    """``str.translate`` table from a byte's Latin-1 character to its printable character."""
    return {b: c for b, c in byte_to_char().items()}


@lru_cache(maxsize=1)
def _to_bytes() -> dict[int, str]:
    """``str.translate`` table back: each printable character to its byte's Latin-1 character.
    A character outside the alphabet below U+0100 (a raw space, say) would pass through as a byte
    of its own, so those map to U+FFFF, which Latin-1 can't encode."""
    table = {ord(c): chr(b) for c, b in char_to_byte().items()}
    for code in range(256):
        table.setdefault(code, "\uffff")
    return table


def bytes_to_piece(data: bytes) -> str:
    return data.decode("latin-1").translate(_to_chars())


def piece_to_bytes(piece: str) -> bytes | None:
    """Bytes of a byte-level piece, or None if the piece is not in the byte-level alphabet.
    (Both directions are ``str.translate`` calls: the whole vocabulary converts in milliseconds.)"""
    try:
        return piece.translate(_to_bytes()).encode("latin-1")
    except UnicodeEncodeError:
        return None


def pieces_to_bytes(pieces: list[str | None]) -> list[bytes | None]:
    """:func:`piece_to_bytes` of each piece (None stays None), the table fetched once: a whole
    vocabulary at every start."""
    table, out = _to_bytes(), []
    for piece in pieces:
        try:
            out.append(None if piece is None else piece.translate(table).encode("latin-1"))
        except UnicodeEncodeError:
            out.append(None)
    return out
