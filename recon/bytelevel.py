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


def bytes_to_piece(data: bytes) -> str:
    table = byte_to_char()
    return "".join(table[b] for b in data)


def piece_to_bytes(piece: str) -> bytes | None:
    """Bytes of a byte-level piece, or None if the piece is not in the byte-level alphabet."""
    table = char_to_byte()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:
        return None
