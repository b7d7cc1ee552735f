"""Records rendered back into each server's response shape: what ``recon serve`` answers with
(``to_vllm_chat``), and API-shaped files made from ground truth (a plain OpenAI-compatible API's
text-only answer, SGLang's native ``/generate``). The inverse of :mod:`recon.samples.importers`.
"""

from __future__ import annotations

import time
from typing import Any

from recon.samples.records import Record


def _openai_logprobs(rec: Record, token_ids: bool) -> dict | None:
    if rec.response is None or rec.response.logprobs is None:
        return None
    content = []
    for t in rec.response.logprobs:
        if token_ids and t.token_id is not None:
            content.append({"token": f"token_id:{t.token_id}", "logprob": t.logprob, "bytes": None, "top_logprobs": []})
        else:
            content.append({"token": t.token, "logprob": t.logprob, "bytes": t.bytes, "top_logprobs": []})
    return {"content": content}


def to_vllm_chat(rec: Record, *, model: str = "recon", return_token_ids: bool = True, tokens_as_ids: bool = False) -> dict:
    """A record as vLLM's ``/v1/chat/completions`` returns it (one choice)."""
    resp = rec.response
    message: dict[str, Any] = {"role": "assistant", "content": resp.content if resp else None, "tool_calls": []}
    if resp and resp.reasoning_content is not None:
        message["reasoning_content"] = resp.reasoning_content
    if resp and resp.tool_calls:
        message["tool_calls"] = [c.to_dict() for c in resp.tool_calls]
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": _openai_logprobs(rec, tokens_as_ids),
                              "finish_reason": resp.finish_reason if resp else None}
    out: dict[str, Any] = {"id": rec.id, "object": "chat.completion", "created": int(time.time()), "model": model,
                           "choices": [choice]}
    if return_token_ids:
        choice["token_ids"] = rec.output_ids
        out["prompt_token_ids"] = rec.prompt_ids
    completion = len(rec.output_ids) if rec.output_ids is not None else 0
    prompt = len(rec.prompt_ids) if rec.prompt_ids is not None else 0
    out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return out


def to_openai_chat(rec: Record, *, model: str = "recon") -> dict:
    """A record as a plain OpenAI-compatible API returns it: text only, no ids."""
    out = to_vllm_chat(rec, model=model, return_token_ids=False)
    message = out["choices"][0]["message"]
    if "reasoning_content" in message:
        message["reasoning"] = message.pop("reasoning_content")  # OpenRouter's name
    return out


def to_sglang(rec: Record) -> dict:
    """A record as SGLang's native ``/generate`` returns it."""
    resp = rec.response
    meta: dict[str, Any] = {"id": rec.id, "finish_reason": {"type": resp.finish_reason if resp else None},
                            "prompt_tokens": len(rec.prompt_ids or []), "completion_tokens": len(rec.output_ids or [])}
    if resp and resp.logprobs is not None and rec.output_ids is not None:
        meta["output_token_logprobs"] = [[t.logprob, i, t.token] for t, i in zip(resp.logprobs, rec.output_ids)]
    return {"text": resp.content if resp else None, "output_ids": rec.output_ids, "meta_info": meta}
