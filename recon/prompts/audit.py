"""The prompt audit: the engine's prompt ids against the record's request rendered by the chat
template, exact or the first divergence with a region and a cause.

Where a record has both (vLLM's ``prompt_token_ids`` and the request's ``messages``), they must
agree for a rendered prompt to be trusted anywhere the engine's is missing. When they don't, the
reason is nearly always one of a few things real pipelines do, and the audit names it:

* ``bos`` — one side starts with the BOS token and the other doesn't (an encode that added it);
* ``default_system_prompt`` — a system block one side has before the first message and the
  other hasn't (Kimi's templates add one when the request has none);
* ``tools_declared`` — the tool schemas the template writes differ (tools missing from the record);
* ``reasoning_dropped`` — an earlier assistant turn's reasoning is in one side and not the other
  (templates drop reasoning from the history, clients strip or keep it);
* ``tool_arguments`` — a tool call's arguments differ (re-serialized JSON: key order, spacing,
  ``ensure_ascii``);
* ``content_changed`` — a message's text differs (stripped whitespace, edited history);
* ``separator`` — only whitespace between blocks differs;
* ``generation_prompt`` — everything up to the last message agrees and the generation prompt or
  thinking prefix differs (``enable_thinking`` / ``thinking`` not recorded);
* ``special_token_text`` — the same text, but special-token text encoded as special ids on one
  side and as plain text on the other;
* ``segmentation`` — the same bytes, cut into other tokens (the engine tokenized pieces apart);
* ``template_text`` — none of the above: the template's own text differs (another template).

The region says where the first divergence lies in the render: the role of the message it falls
in (``system``, ``user``, ``assistant``, ``tool``), ``preamble`` (before the first message's text:
a default system prompt, the tool declarations) or ``generation_prompt`` (after the last one).
"""

from __future__ import annotations

import json
from typing import Any

from recon.errors import ReconError
from recon.prompts.render import Prompt, PromptMaker
from recon.samples.records import Record

STATUSES = ("exact", "diverged", "engine_only", "rendered_only", "none", "error")
CAUSES = ("bos", "default_system_prompt", "tools_declared", "reasoning_dropped", "tool_arguments", "content_changed",
          "separator", "generation_prompt", "special_token_text", "segmentation", "template_text")
COLUMNS = ["prompt_source", "prompt_status", "prompt_cause", "prompt_region", "prompt_message", "prompt_first_diff",
           "prompt_len_engine", "prompt_len_rendered", "prompt_engine_piece", "prompt_rendered_piece",
           "prompt_context_engine", "prompt_context_rendered", "prompt_error"]
#: bytes of context either side of a divergence
CONTEXT = 40


def _row(**kw: Any) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(kw)
    return row


#: Arrow types of the columns that are not strings
SCHEMA_TYPES = {"prompt_message": "int64", "prompt_first_diff": "int64", "prompt_len_engine": "int64",
                "prompt_len_rendered": "int64"}


def prompts_audited(maker: PromptMaker, records: list[Record], *, audit: bool = True) -> tuple[list[Prompt], list[dict] | None]:
    """Each record's prompt (:meth:`PromptMaker.prompt`) and, with ``audit``, its prompt-audit
    columns, rendering each record once."""
    prompts, rows = [], [] if audit else None
    for record in records:
        if not audit or not record.messages or maker.template is None:
            prompts.append(maker.prompt(record))
            if audit:
                rows.append(audit_prompt(maker, record))
            continue
        row, rendered = _audit(maker, record)
        rows.append(row)
        if record.prompt_ids is not None:
            prompts.append(Prompt(list(record.prompt_ids), "engine"))
        elif rendered is not None:
            prompts.append(Prompt(rendered, "rendered"))
        else:
            prompts.append(Prompt(None, "none", row["prompt_error"]))
    return prompts, rows


def counts(row: dict) -> tuple[str, str, str | None, str | None]:
    """(source, status, cause, region) of one record's prompt audit: what the summary counts."""
    return row["prompt_source"], row["prompt_status"], row["prompt_cause"], row["prompt_region"]


def audit_prompt(maker: PromptMaker, record: Record) -> dict:
    """One record's prompt-audit columns (:data:`COLUMNS`)."""
    return _audit(maker, record)[0]


def _audit(maker: PromptMaker, record: Record) -> tuple[dict, list[int] | None]:
    """The prompt-audit columns, and the rendered ids when there are any."""
    engine = record.prompt_ids
    if not record.messages:
        return _row(prompt_source="engine" if engine is not None else "none",
                    prompt_status="engine_only" if engine is not None else "none",
                    prompt_len_engine=None if engine is None else len(engine)), None
    if maker.template is None:
        return _row(prompt_source="engine" if engine is not None else "none",
                    prompt_status="engine_only" if engine is not None else "none",
                    prompt_len_engine=None if engine is None else len(engine), prompt_error="no chat template"), None
    try:
        rendered = maker.rendered_ids(record)
    except ReconError as e:
        return _row(prompt_source="engine" if engine is not None else "none", prompt_status="error",
                    prompt_len_engine=None if engine is None else len(engine), prompt_error=str(e)), None
    if engine is None:
        return _row(prompt_source="rendered", prompt_status="rendered_only", prompt_len_rendered=len(rendered)), rendered
    base = dict(prompt_source="engine", prompt_len_engine=len(engine), prompt_len_rendered=len(rendered))
    if list(engine) == rendered:
        return _row(prompt_status="exact", **base), rendered
    return _row(prompt_status="diverged", **base, **_divergence(maker, record, list(engine), rendered)), rendered


def _first_diff(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def _divergence(maker: PromptMaker, record: Record, engine: list[int], rendered: list[int]) -> dict:
    tok = maker.tok
    at = _first_diff(engine, rendered)
    e_bytes, r_bytes = tok.ids_bytes(engine), tok.ids_bytes(rendered)
    byte_at = _common_prefix(e_bytes, r_bytes)
    region, message = _region(maker, record, r_bytes, byte_at)
    found = dict(
        prompt_first_diff=at, prompt_region=region, prompt_message=message,
        prompt_engine_piece=tok.piece(engine[at]) if at < len(engine) else None,
        prompt_rendered_piece=tok.piece(rendered[at]) if at < len(rendered) else None,
        prompt_context_engine=e_bytes[max(0, byte_at - CONTEXT) : byte_at + CONTEXT].decode("utf-8", "replace"),
        prompt_context_rendered=r_bytes[max(0, byte_at - CONTEXT) : byte_at + CONTEXT].decode("utf-8", "replace"),
    )
    found["prompt_cause"] = _cause(maker, record, engine, rendered, at, e_bytes, r_bytes, byte_at, region, message)
    return found


def _message_ends(maker: PromptMaker, record: Record, full: bytes) -> list[int] | None:
    """Where each message's render ends in the full render, in bytes: the render of the first k
    messages agrees with the full render up to there (templates that look ahead, such as
    Qwen3's last-query index, still agree up to the message before). None when a template
    refuses a prefix of the conversation (some insist on ending with a user turn)."""
    ends = []
    for k in range(1, len(record.messages) + 1):
        try:
            text = maker.render_text(record, add_generation_prompt=False, messages=record.messages[:k])
        except ReconError:
            return None
        ends.append(_common_prefix(text.encode("utf-8"), full))
    return ends


def _text_start(record: Record, full: bytes) -> int:
    """Where the first message's own text starts in the render (the preamble ends there)."""
    first = record.messages[0].get("content") if isinstance(record.messages[0], dict) else None
    if isinstance(first, str) and first:
        where = full.find(first.encode("utf-8"))
        if where >= 0:
            return where
    return 0


def _region(maker: PromptMaker, record: Record, full: bytes, byte_at: int) -> tuple[str, int | None]:
    ends = _message_ends(maker, record, full)
    if ends is None:
        return "unknown", None
    if byte_at >= ends[-1]:
        return "generation_prompt", None
    if byte_at < _text_start(record, full) and record.messages[0].get("role") != "system":
        return "preamble", None
    k = next(k for k, end in enumerate(ends) if byte_at < end)
    role = record.messages[k].get("role")
    return (role if role in ("system", "user", "assistant", "tool") else "unknown"), k


def _args_texts(message: dict) -> list[str]:
    texts = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, str):
            texts.append(args)
        elif args is not None:
            texts += [json.dumps(args, ensure_ascii=False), json.dumps(args)]
    return texts


def _in_one(texts: list[str], a: bytes, b: bytes) -> bool:
    """Some of ``texts`` are in one side and not the other."""
    return any((t.encode("utf-8") in a) != (t.encode("utf-8") in b) for t in texts if t)


def _cause(maker: PromptMaker, record: Record, engine: list[int], rendered: list[int], at: int,
           e_bytes: bytes, r_bytes: bytes, byte_at: int, region: str, message: int | None) -> str:
    tok = maker.tok
    specials = tok.special_ids
    if e_bytes == r_bytes:
        window = slice(at, at + 8)
        if any(i in specials for i in engine[window]) != any(i in specials for i in rendered[window]):
            return "special_token_text"
        return "segmentation"
    bos = tok.roles.get("bos")
    bos_id = tok.added_by_content[bos].id if bos in tok.added_by_content else None
    if bos_id is not None and any(len(a) == len(b) + 1 and at < len(a) and a[at] == bos_id and a[:at] + a[at + 1:] == b
                                  for a, b in ((engine, rendered), (rendered, engine))):
        return "bos"  # one BOS more on one side: an encode that added it to a template that writes one
    # what differs, once the common prefix and suffix are cut off
    tail = 0
    while (tail < len(e_bytes) - byte_at and tail < len(r_bytes) - byte_at
           and e_bytes[-1 - tail] == r_bytes[-1 - tail]):
        tail += 1
    e_diff, r_diff = e_bytes[byte_at : len(e_bytes) - tail], r_bytes[byte_at : len(r_bytes) - tail]
    msg = record.messages[message] if message is not None else {}
    if region == "assistant":  # before whitespace: re-serialized JSON often differs only in spaces
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if isinstance(reasoning, str) and _in_one([reasoning], e_bytes, r_bytes):
            return "reasoning_dropped"
        if _in_one(_args_texts(msg), e_bytes, r_bytes):
            return "tool_arguments"
    if not e_diff.strip() and not r_diff.strip():
        return "separator"
    if region == "generation_prompt":
        return "generation_prompt"
    if region == "preamble":
        names = [t.get("function", {}).get("name") for t in record.tools or [] if isinstance(t, dict)]
        if names and _in_one([n for n in names if isinstance(n, str)], e_bytes, r_bytes):
            return "tools_declared"
        return "default_system_prompt"
    content = msg.get("content")
    if isinstance(content, str) and content and _in_one([content], e_bytes, r_bytes):
        return "content_changed"
    return "template_text"
