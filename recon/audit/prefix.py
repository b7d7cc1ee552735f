"""Where and why turn k's prompt + sampled ids stop being a prefix of turn k+1's prompt: the
divergence columns of a broken boundary (:mod:`recon.audit.conversations` says what the regions
and causes mean). Pure functions of the two id sequences, the prompt's length and the bound
profile: the audit engine's workers and its driver call the same ones, so where a boundary is
checked does not change its row."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile

#: why turn k's sampled ids are not a prefix of turn k+1's prompt
CAUSES = ("reasoning_dropped", "tool_arguments_reserialized", "content_stripped", "content_changed",
          "stop_token_or_separator", "retokenized", "special_token_text", "template_text")
#: where the first divergence lies, in ``prompt_ids(k) + output_ids(k)``
REGIONS = ("prompt", "reasoning", "content", "tool_call", "end", "template")
#: bytes of context either side of a divergence
CONTEXT = 40


def check(seq: list[int], p_len: int, nxt: list[int], bound: "BoundProfile") -> dict:
    """Turn k's prompt + output (``seq``, the prompt ``p_len`` ids) against turn k+1's prompt:
    ``{"status": "kept"}``, or the broken boundary's columns (:func:`classify`)."""
    if len(nxt) >= len(seq) and nxt[: len(seq)] == seq:
        return {"status": "kept"}
    return classify(bound, np.asarray(seq, dtype=np.int64), p_len, np.asarray(nxt, dtype=np.int64))


def _first_diff(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _common_bytes(a: bytes, b: bytes) -> int:
    return _first_diff(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


def classify(bound: "BoundProfile", seq: np.ndarray, p_len: int, nxt: np.ndarray) -> dict:
    """Where and why ``seq`` (turn k's prompt + output, the prompt ``p_len`` ids) is not a prefix
    of ``nxt`` (turn k+1's prompt): the boundary row's divergence columns."""
    tok = bound.tok
    at = _first_diff(seq, nxt)
    whole_p, whole_n = tok.ids_bytes(seq.tolist()), tok.ids_bytes(nxt.tolist())
    byte_at = _common_bytes(whole_p, whole_n)
    prompt_bytes = len(tok.ids_bytes(seq[:p_len].tolist()))
    region, span_end = "template", len(whole_p)
    if at < p_len:
        region, span_end = "prompt", prompt_bytes
        tag = (bound.profile.reasoning_tag or "").strip().encode()
        if tag and at >= p_len - 2 and tag in tok.ids_bytes(seq[at:p_len].tolist()):
            region = "reasoning"  # the generation prompt opened the reasoning (DeepSeek, Kimi-K2.5)
    elif at < len(seq):
        out = seq[p_len:].tolist()
        offset = sum(map(tok.token_lengths.__getitem__, out[: at - p_len]))
        for name, start, end in bound.after_prompt_ids(seq[:p_len].tolist()).regions_of_ids(out):
            if start <= offset < end:
                region, span_end = name, prompt_bytes + end
                break
    rest_p, rest_n = whole_p[byte_at:], whole_n[byte_at:]
    tail_p, tail_n = tok.ids_bytes(seq[at:].tolist()), tok.ids_bytes(nxt[at:].tolist())
    if tail_n.startswith(tail_p):  # turn k's text is all there, cut into other tokens
        specials, lengths, j, size = tok.special_ids, tok.token_lengths, at, 0
        while j < len(nxt) and size < len(tail_p):  # the next prompt's tokens that spell turn k's rest
            size, j = size + lengths[int(nxt[j])], j + 1
        cause = ("special_token_text" if sum(int(i) in specials for i in seq[at:])
                 != sum(int(i) in specials for i in nxt[at:j]) else "retokenized")
    elif region == "reasoning":
        cause = "reasoning_dropped"
    elif region == "tool_call":
        cause = "tool_arguments_reserialized"
    elif region == "end":
        cause = "stop_token_or_separator"
    elif region == "content":
        cause = "content_stripped" if not whole_p[byte_at:span_end].strip() else "content_changed"
    elif rest_p.lstrip()[:16] == rest_n.lstrip()[:16]:
        cause = "stop_token_or_separator"  # only whitespace between blocks differs
    elif region == "prompt" and _reasoning_in(bound, whole_p[byte_at:prompt_bytes], whole_n):
        cause = "reasoning_dropped"  # an earlier turn's reasoning, kept in turn k's prompt, not in k+1's
    else:
        cause = "template_text"
    return {"status": "broken", "cause": cause, "region": region, "first_diff": at, "first_diff_byte": byte_at,
            "parent_piece": tok.piece(int(seq[at])) if at < len(seq) else None,
            "next_piece": tok.piece(int(nxt[at])) if at < len(nxt) else None,
            "context_parent": whole_p[max(0, byte_at - CONTEXT): byte_at + CONTEXT].decode("utf-8", "replace"),
            "context_next": whole_n[max(0, byte_at - CONTEXT): byte_at + CONTEXT].decode("utf-8", "replace")}


def _reasoning_in(bound: "BoundProfile", part: bytes, other: bytes) -> bool:
    """``part`` (from a divergence on) holds reasoning text, up to the close tag, that ``other`` lacks."""
    p = bound.profile
    open_, close = (p.reasoning_tag or p.reasoning_open or "").strip().encode(), (p.reasoning_close or "").strip().encode()
    end = part.find(close) if close else -1
    if not open_ or end < 0:
        return False
    text = part[:end]
    start = text.find(open_)
    text = (text[start + len(open_):] if start >= 0 else text).strip()
    return bool(text) and text not in other


def pieces_around(tok, seq, nxt, at: int, width: int = 6) -> list[dict]:
    """Token by token around a divergence: position, turn k's id and piece, turn k+1's, same or not."""
    rows = []
    for k in range(max(0, at - width), at + width + 1):
        a = int(seq[k]) if k < len(seq) else None
        b = int(nxt[k]) if k < len(nxt) else None
        if a is None and b is None:
            break
        rows.append({"position": k, "turn_k_id": a, "turn_k_piece": None if a is None else tok.piece(a),
                     "next_prompt_id": b, "next_prompt_piece": None if b is None else tok.piece(b),
                     "same": a == b, "first_diff": k == at})
    return rows
