"""The answers of ``recon serve``, built from the model's samples and scores.

It exists to keep what goes over the wire apart from how it gets there: these functions take a
validated request (:mod:`recon.server.schemas`) and the model's output and return plain dicts in
vLLM's shapes, so they are tested without a server, and the streamed form (:func:`chat_chunks`)
is computed from the non-streamed response, which makes the chunks an exact view of it: their
concatenated content, logprobs and ids are the non-streamed ones. :func:`run_chat` and
:func:`run_completion` are the only parts that touch the model; they block (the app runs them in a
worker thread) and hold the model lock while sampling, since sampling seeds torch's global
generator and one batch at a time is what keeps a seeded request reproducible.
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from recon.recovery.model import LocalModel, Sample, batch_seed
from recon.samples.render import to_vllm_chat
from recon.samples.records import Record
from recon.server.counts import Counts, sampled_positions
from recon.server.schemas import ApiError, ChatRequest, CompletionRequest, to_json

MAX_PROMPT_TOKENS = 32_768  # tokens over all prompts of one /v1/completions request (the model is locked meanwhile)


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def check_context(prompt_len: int, max_tokens: int, context: int | None, param: str = "max_tokens") -> None:
    if context and prompt_len + max_tokens > context:
        raise _bad(param, f"This model's maximum context length is {context} tokens; the prompt has {prompt_len} "
                   f"and {param} asks for {max_tokens} more")


def _lp(value: float) -> float:
    """A logprob as vLLM writes it: the float as computed, -9999.0 for -inf (``clamp_prompt_logprobs``)."""
    return float(value) if math.isfinite(value) else -9999.0


def _token_text(tok, tid: int, as_ids: bool) -> tuple[str, list[int] | None]:
    if as_ids:
        return f"token_id:{tid}", None
    data = tok.id_to_bytes(tid)
    return data.decode("utf-8", "replace"), list(data)


def chat_response(model: LocalModel, req: ChatRequest, prompt_ids: list[int], samples: list[Sample]) -> dict:
    """The chat completion for ``samples``: vLLM's shape (``to_vllm_chat``, which the importers
    invert), with ``top_logprobs`` filled in and vLLM's id fields only when asked for."""
    request_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    choices = []
    for k, sample in enumerate(samples):
        resp = model.response(sample, logprobs=req.logprobs)
        if req.logprobs and req.tokens_as_ids:
            for entry, tid in zip(resp.logprobs, sample.output_ids):
                entry.token_id = tid
        rec = Record(request_id, "served", sample.output_ids, resp, prompt_ids)
        out = to_vllm_chat(rec, model=model.name, return_token_ids=req.return_token_ids, tokens_as_ids=req.tokens_as_ids)
        choice = out["choices"][0]
        choice["index"] = k
        _as_vllm_writes_it(choice)
        if req.logprobs and req.top_logprobs:
            for entry, top in zip(choice["logprobs"]["content"], sample.top):
                entry["top_logprobs"] = [dict(zip(("token", "bytes"), _token_text(model.tokenizer, tid, req.tokens_as_ids)),
                                              logprob=_lp(lp)) for tid, lp in top[: req.top_logprobs]]
        choices.append(choice)
    out["choices"] = choices
    out.setdefault("prompt_logprobs", None)  # vLLM's chat completion has both, null unless asked for
    out.setdefault("prompt_token_ids", None)
    completion = sum(len(s.output_ids) for s in samples)
    out["usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                    "total_tokens": len(prompt_ids) + completion}
    return out


#: the message fields vLLM 0.32.0 writes as null when it has nothing for them (tests/data/vllm/chat.json)
NULL_MESSAGE_FIELDS = ("refusal", "annotations", "audio", "function_call", "reasoning")


def _as_vllm_writes_it(choice: dict) -> None:
    """One chat choice laid out as vLLM 0.32.0 lays it out: no ``tool_calls`` key without tool
    calls, its null message fields, ``stop_reason`` (null: recon stops at EOS or max_tokens only),
    ``token_ids`` null when not asked for."""
    message = choice["message"]
    if not message.get("tool_calls"):
        message.pop("tool_calls", None)
    for name in NULL_MESSAGE_FIELDS:
        message.setdefault(name, None)
    choice.setdefault("stop_reason", None)
    choice.setdefault("token_ids", None)  # null unless return_token_ids, as vLLM writes it


def content_deltas(decode, ids: list[int], special_ids: Iterable[int], content: str) -> list[str]:
    """One piece of ``content`` per token, joined they are ``content`` exactly.

    A token that ends inside a UTF-8 character (``' \\xf0\\x9f'``, half an emoji) has no text of
    its own yet; the prefix decoded so far is only released up to where it agrees with the final
    text, so a half character is held back until the token that completes it.
    """
    special = set(special_ids)
    shown: list[int] = []
    out: list[str] = []
    sent = 0
    for tid in ids:
        if tid not in special:
            shown.append(tid)
        prefix = decode(shown)
        agree = len(os.path.commonprefix([prefix, content]))
        out.append(content[sent:max(sent, agree)])
        sent = max(sent, agree)
    if out:
        out[-1] += content[sent:]
    return out


def chat_chunks(model: LocalModel, req: ChatRequest, response: dict, samples: list[Sample]) -> Iterator[dict]:
    """The streamed form of ``response``, as vLLM streams it: per choice a role chunk, one chunk per
    token (its text, its logprobs entry, its id with ``return_token_ids``; the last one also its
    ``finish_reason``); then usage if asked, in a chunk of its own (no ``usage`` key before it)."""
    tok = model.tokenizer
    head = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"], "model": response["model"]}
    first = True
    for choice, sample in zip(response["choices"], samples):
        k = choice["index"]
        chunk = {**head, "choices": [{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]}
        if first and req.return_token_ids:
            chunk["prompt_token_ids"] = response["prompt_token_ids"]  # vLLM: in the first chunk only
        first = False
        yield chunk
        entries = (choice.get("logprobs") or {}).get("content")
        deltas = content_deltas(tok.decode, sample.output_ids, tok.special_ids, choice["message"]["content"] or "")
        last = len(sample.output_ids) - 1
        for j, (tid, delta) in enumerate(zip(sample.output_ids, deltas)):
            part = {"index": k, "delta": {"content": delta}, "logprobs": {"content": [entries[j]]} if entries else None,
                    "finish_reason": None}
            if j == last:  # vLLM: the finish reason rides on the last token's chunk
                part.update(finish_reason=choice["finish_reason"], stop_reason=None)
            if req.return_token_ids:
                part["token_ids"] = [tid]
            yield {**head, "choices": [part]}
        if last < 0:  # no token at all: a chunk of its own says why
            yield {**head, "choices": [{"index": k, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"],
                                        "stop_reason": None}]}
    if req.include_usage:
        yield {**head, "choices": [], "usage": response["usage"]}


def _legacy_logprobs(tok, ids: list[int], lps: list[float | None], tops: list[list[tuple[int, float]]],
                     k: int, as_ids: bool) -> dict:
    """OpenAI's legacy completion logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for tid, lp, top in zip(ids, lps, tops):
        text = _token_text(tok, tid, as_ids)[0]
        out["tokens"].append(text)
        out["token_logprobs"].append(None if lp is None else _lp(lp))
        if lp is None:
            out["top_logprobs"].append(None)
        else:
            best = {_token_text(tok, t, as_ids)[0]: _lp(v) for t, v in top[:k]}
            best.setdefault(text, _lp(lp))  # vLLM: the chosen token is always listed
            out["top_logprobs"].append(best)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _prompt_logprobs(tok, ids: list[int], scores, k: int) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: None for position 0, then {id: {logprob, rank, decoded_token}}
    holding the prompt's own token (first, with its rank) and the k most likely ones (ranks 1..k),
    as ``_make_logprob_dict`` in vllm/v1/engine/logprobs.py builds it; at temperature 1 whatever
    the request's temperature (vLLM scores prompts from the raw logits)."""
    out: list[dict | None] = [None]
    for i in range(1, len(ids)):
        entry = {str(ids[i]): {"logprob": _lp(scores.logprobs[i]), "rank": scores.ranks[i],
                               "decoded_token": _token_text(tok, ids[i], False)[0]}}
        for r, (t, v) in enumerate(scores.top[i][:k]):
            entry[str(t)] = {"logprob": _lp(v), "rank": r + 1, "decoded_token": _token_text(tok, t, False)[0]}
        out.append(entry)
    return out


def completion_response(model: LocalModel, req: CompletionRequest, prompt_ids: list[list[int]], texts: list[str],
                        scores: list | None, samples: list[Sample | None]) -> dict:
    """``/v1/completions`` in vLLM's shape: per prompt one choice with the (echoed) text, legacy
    ``logprobs``, and when asked ``prompt_logprobs``, ``prompt_token_ids`` and ``token_ids``."""
    tok = model.tokenizer
    k = req.logprobs or 0
    choices = []
    for index, (ids, text, sample) in enumerate(zip(prompt_ids, texts, samples)):
        out_ids = sample.output_ids if sample else []
        generated = tok.decode([i for i in out_ids if i not in tok.special_ids]) if out_ids else ""
        choice: dict[str, Any] = {"index": index, "text": (text if req.echo else "") + generated, "logprobs": None,
                                  "finish_reason": sample.finish_reason if sample else "length", "stop_reason": None}
        if req.logprobs is not None:  # over the echoed prompt (scored) and then the generated tokens
            all_ids, lps, tops = (list(ids), list(scores[index].logprobs), list(scores[index].top)) if req.echo else ([], [], [])
            if sample:
                all_ids += out_ids
                lps += sample.logprobs
                tops += sample.top or [[] for _ in out_ids]
            choice["logprobs"] = _legacy_logprobs(tok, all_ids, lps, tops, k, req.tokens_as_ids)
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = _prompt_logprobs(tok, ids, scores[index], req.prompt_logprobs)
        # vLLM writes both, null unless return_token_ids (prompt_logprobs alone gives no ids)
        choice["prompt_token_ids"] = ids if req.return_token_ids else None
        choice["token_ids"] = out_ids if req.return_token_ids else None
        choices.append(choice)
    prompt_tokens = sum(map(len, prompt_ids))
    completion = sum(len(s.output_ids) for s in samples if s)
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": model.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}}


# -- the model side ------------------------------------------------------------------------------------
def context_length(model: LocalModel) -> int | None:
    config = getattr(getattr(model, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def run_chat(model: LocalModel, req: ChatRequest, lock: threading.Lock) -> tuple[dict, list[Sample]]:
    try:
        prompt_ids = model.tokenizer.encode(model.render(req.chat_messages))
    except Exception as e:  # a template that rejects these messages is the client's problem
        raise _bad("messages", f"cannot render messages with the chat template: {str(e)[:300]}") from None
    check_context(len(prompt_ids), req.budget, context_length(model))
    with lock:
        samples = model.sample([prompt_ids] * req.n, temperature=req.temperature, top_p=req.top_p,
                               max_new_tokens=req.budget, seed=batch_seed(req.seed, 0), top_logprobs=req.top_logprobs)
    return chat_response(model, req, prompt_ids, samples), samples


def run_completion(model: LocalModel, req: CompletionRequest, lock: threading.Lock, counts: Counts | None = None) -> dict:
    """Answer ``/v1/completions``: score the prompts (with ``prompt_logprobs``, or ``echo`` and
    ``logprobs``) and sample from each, holding the model lock; ``counts`` gets what it ran."""
    tok = model.tokenizer
    prompt_ids = [tok.encode(p) if isinstance(p, str) else p for p in req.prompts]
    texts = [p if isinstance(p, str) else tok.decode(p) for p in req.prompts]
    context = context_length(model)
    for k, ids in enumerate(prompt_ids):
        if not ids:
            raise _bad(f"prompt[{k}]", f"'prompt[{k}]' encodes to no tokens")
        check_context(len(ids), req.budget, context)
    if sum(map(len, prompt_ids)) > MAX_PROMPT_TOKENS:
        raise _bad("prompt", f"at most {MAX_PROMPT_TOKENS} prompt tokens in one request, got {sum(map(len, prompt_ids))}")
    need_scores = req.prompt_logprobs is not None or (req.echo and req.logprobs is not None)
    top_k = max(req.prompt_logprobs or 0, req.logprobs or 0)
    samples: list[Sample | None] = [None] * len(prompt_ids)
    with lock:
        scores = model.token_logprobs(prompt_ids, top_k=top_k) if need_scores else None
        if req.budget > 0:
            for k, ids in enumerate(prompt_ids):
                samples[k] = model.sample([ids], temperature=req.temperature, top_p=req.top_p, max_new_tokens=req.budget,
                                          seed=batch_seed(req.seed, k), top_logprobs=req.logprobs or 0)[0]
    if counts is not None:  # no prefix cache: a scoring pass runs every prompt position
        scored = sum(map(len, prompt_ids)) if need_scores else 0
        sampled = sum(sampled_positions(len(ids), len(s.output_ids)) for ids, s in zip(prompt_ids, samples) if s)
        counts.add("completions", prompt_tokens=sum(map(len, prompt_ids)), scored=scored, sampled=sampled)
    return completion_response(model, req, prompt_ids, texts, scores, samples)


def encode_events(events: Iterable[dict], log: Callable[[str], None] = lambda line: None) -> Iterator[bytes]:
    """Server-sent events: ``data: {...}`` per event, then ``data: [DONE]``. An error while the
    events are made ends the stream with OpenAI's error object instead, and no ``[DONE]``, so a
    client that ignores the error still sees a stream that did not finish; ``log`` gets one line."""
    try:
        for event in events:
            yield b"data: " + to_json(event) + b"\n\n"
    except Exception as e:  # noqa: BLE001 - a bug while streaming: the status has gone out, the error goes in the stream
        log(f"stream: {type(e).__name__}: {e}")
        error = ApiError(500, f"internal error while streaming: {type(e).__name__}", type="server_error", code="internal_error")
        yield b"data: " + to_json(error.body()) + b"\n\n"
        return
    yield b"data: [DONE]\n\n"
