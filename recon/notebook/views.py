"""Tables and HTML for looking at tokens: the pure functions behind :mod:`recon.notebook.widgets`.

Everything here takes plain values and returns a DataFrame or an HTML string, so the widgets
stay thin and the tests assert on what a user would see.
"""

from __future__ import annotations

import html
from typing import Sequence

import pandas as pd

from recon.tokenizers.tokenizer import Tokenizer

PALETTE = ("#dbeafe", "#dcfce7", "#fef9c3", "#fce7f3", "#e0e7ff", "#ffedd5")
SPECIAL_STYLE = "background:#1f2937;color:#f9fafb;font-weight:bold"
DIFF_STYLE = "outline:2px solid #dc2626"


def token_text(tok: Tokenizer, token_id: int) -> str:
    """A token's text as it reads (bytes decoded, invalid UTF-8 shown as U+FFFD)."""
    return tok.id_to_bytes(token_id).decode("utf-8", "replace")


def token_table(tok: Tokenizer, ids: Sequence[int]) -> pd.DataFrame:
    """One row per token: position, id, vocabulary piece, text, bytes (hex), special?"""
    special = {t.id for t in tok.added_tokens}
    rows = [
        dict(pos=k, id=i, piece=tok.id_to_piece(i), text=token_text(tok, i), bytes=tok.id_to_bytes(i).hex(" "),
             special=i in special)
        for k, i in enumerate(ids)
    ]
    return pd.DataFrame(rows, columns=["pos", "id", "piece", "text", "bytes", "special"])


def _visible(text: str) -> str:
    return html.escape(text).replace(" ", "␣").replace("\n", "↵<br>").replace("\t", "→")


def spans_html(tok: Tokenizer, ids: Sequence[int], *, highlight: set[int] | None = None) -> str:
    """The tokens as coloured spans over the text; special tokens dark; ``highlight`` positions outlined.
    Each span's tooltip gives position, id and piece."""
    special = {t.id for t in tok.added_tokens}
    out = []
    for k, i in enumerate(ids):
        style = SPECIAL_STYLE if i in special else f"background:{PALETTE[k % len(PALETTE)]}"
        if highlight and k in highlight:
            style += ";" + DIFF_STYLE
        title = html.escape(f"#{k} id {i} {tok.id_to_piece(i)!r}", quote=True)
        out.append(f'<span class="recon-token" data-id="{i}" title="{title}" style="{style};padding:1px 0;margin:0 1px;'
                   f'border-radius:3px;font-family:monospace">{_visible(token_text(tok, i))}</span>')
    return '<div class="recon-spans" style="line-height:2">' + "".join(out) + "</div>"


def inspect_text(tok: Tokenizer, text: str, *, allow_special: bool = True) -> tuple[list[int], pd.DataFrame, str]:
    """How ``tok`` splits ``text``: ids, the token table and the spans."""
    ids = tok.encode(text, allow_special=allow_special)
    return ids, token_table(tok, ids), spans_html(tok, ids)


def canonical_comparison(tok: Tokenizer, ids: Sequence[int]) -> dict:
    """Given ids next to the canonical re-encoding of their text: do they round-trip, and where not?"""
    ids = list(ids)
    canonical = tok.encode(tok.decode(ids))
    first = next((k for k, (a, b) in enumerate(zip(ids, canonical)) if a != b), None)
    if first is None and len(ids) != len(canonical):
        first = min(len(ids), len(canonical))
    return {"ids": ids, "canonical": canonical, "roundtrip": ids == canonical, "first_diff": first}


def comparison_html(tok: Tokenizer, ids: Sequence[int]) -> str:
    c = canonical_comparison(tok, ids)
    mark = {c["first_diff"]} if c["first_diff"] is not None else set()
    verdict = ("round-trips: the canonical encoding is the same ids" if c["roundtrip"]
               else f"does not round-trip: first difference at position {c['first_diff']}")
    return (f"<p><b>{html.escape(verdict)}</b></p><p>given ids:</p>{spans_html(tok, c['ids'], highlight=mark)}"
            f"<p>canonical re-encoding:</p>{spans_html(tok, c['canonical'], highlight=mark)}")


def parse_ids(text: str) -> list[int]:
    """``"1, 2 3"`` or ``"[1, 2, 3]"`` -> [1, 2, 3]; raises ValueError naming the bad item."""
    items = text.replace("[", " ").replace("]", " ").replace(",", " ").split()
    out = []
    for item in items:
        if not item.lstrip("-").isdigit():
            raise ValueError(f"{item!r} is not an integer id")
        out.append(int(item))
    return out


# -- samples ------------------------------------------------------------------------------------------
def filter_rows(rows: pd.DataFrame, *, dataset: str | None = None, status: str | None = None, cause: str | None = None,
                region: str | None = None) -> pd.DataFrame:
    """Audit rows of one dataset / status / cause / region of the first divergence (None: any)."""
    keep = pd.Series(True, index=rows.index)
    if dataset:
        keep &= rows["dataset"] == dataset
    if status:
        keep &= rows["status"] == status
    if cause:
        keep &= rows["cause"] == cause
    if region:
        keep &= rows["region"] == region
    return rows[keep]


def sample_html(tok: Tokenizer, row: pd.Series, truth: Sequence[int] | None, recon: Sequence[int] | None) -> str:
    """One audited sample: its verdict, then ground truth and reconstruction as spans, the first
    divergence outlined on both, then the decoded context around it."""
    from recon.audit.compare import describe

    parts = [f"<p><b>{html.escape(describe(row, tok))}</b></p>"]
    if row["status"] == "mismatch":
        k = int(row["first_diff"])
        lo = max(0, k - 24)
        parts.append(f"<p>ground truth, tokens {lo}–{k + 24}:</p>" + spans_html(tok, list(truth)[lo : k + 24], highlight={k - lo}))
        j = k  # the reconstruction diverges at the same index: everything before it is equal
        parts.append(f"<p>reconstruction, tokens {lo}–{j + 24}:</p>" + spans_html(tok, list(recon)[lo : j + 24], highlight={j - lo}))
        parts.append("<p>context:</p><pre>" + html.escape(f"truth: {row['context_truth']!r}\nrecon: {row['context_recon']!r}") + "</pre>")
    elif truth is not None:
        parts.append(spans_html(tok, list(truth)[:200]))
    return "\n".join(parts)
