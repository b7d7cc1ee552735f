"""SGLang's native ``POST /generate`` over the local model: prompt logprobs in SGLang's shape.

It exists so that the SGLang scorer (:class:`recon.recovery.remote.SGLangScorer`) is tested live
against a server answering exactly what SGLang answers, as the vLLM scorer is against
``/v1/completions`` (:mod:`recon.server.responses`). The shape, read off SGLang's own source
(``python/sglang/srt/managers/scheduler_output_processor_mixin.py`` and
``tokenizer_manager.py`` of sgl-project/sglang):

* ``meta_info.input_token_logprobs`` is one ``[logprob, token_id, text]`` per input token from
  ``logprob_start_len`` on (``-1``, the default: the last one only), and the first of them has a
  null logprob, whatever ``logprob_start_len`` is (SGLang pads the first with None and drops the
  logprob of the token that would be sampled next); ``text`` is null unless
  ``return_text_in_logprobs``;
* ``input_top_logprobs`` (with ``top_logprobs_num`` > 0) and ``input_token_ids_logprobs`` (with
  ``token_ids_logprob``, every asked id at every position, in the order asked) hold one list of
  such triples per position, null at the first;
* the ``output_*`` lists do the same for generated tokens; ``max_new_tokens: 0`` generates none
  (``finish_reason {"type": "length", "length": 0}``);
* a logprob that is not finite is null (SGLang's ORJSON writes -inf as null).

Temperature, as SGLang applies it: prompt logprobs are the model's own distribution (a request's
``temp_scaled_logprobs`` is off unless a server sets it, so ``sampling_params.temperature`` does
not change them), while output logprobs are at the sampling temperature (SGLang's sampler takes
``log_softmax(logits / T)``; temperature 0 is greedy and scored at 1). vLLM, for comparison,
reports prompt logprobs from the raw logits at any temperature too (``_get_prompt_logprobs_dict``
in ``vllm/v1/worker/gpu_model_runner.py``).

The scores come from one teacher-forced pass per sequence (:func:`score`): the model's hidden
states once, then its output layer over chunks of positions, so a long prompt never holds a
``positions x vocabulary`` tensor at once.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from recon.recovery.model import LocalModel, batch_seed
from recon.server.counts import Counts, sampled_positions
from recon.server.responses import MAX_PROMPT_TOKENS, _bad, check_context, context_length
from recon.server.schemas import GenerateRequest

CHUNK = 512  # positions through the output layer at once: 512 x 49,152 float32 logits = 100 MB
#: logprob entries (positions x (1 + top-k + asked ids)) one /generate answer may hold
MAX_ENTRIES = 1_000_000


@dataclass
class Scored:
    """Per position of one sequence (index 0 has no context: None and empty lists)."""

    logprobs: list[float | None] = field(default_factory=lambda: [None])
    ranks: list[int | None] = field(default_factory=lambda: [None])
    top: list[list[tuple[int, float]]] = field(default_factory=lambda: [[]])
    #: the logprob of every asked id, in the order asked
    asked: list[list[float]] = field(default_factory=lambda: [[]])
    #: positions the pass ran through the model (none for a sequence of one id: nothing to score)
    positions: int = 0


def score(model: LocalModel, ids: Sequence[int], *, top_k: int = 0, wanted: Sequence[int] = (),
          temperature: float = 1.0, tempered_from: int | None = None) -> Scored:
    """Teacher-forced logprobs of ``ids``: log P(ids[i] | ids[:i]), its rank, the ``top_k`` most
    likely ids and the ``wanted`` ids at every position i >= 1. Positions from ``tempered_from``
    on are at ``temperature`` (softmax of logits / T), the others at 1."""
    torch, net = model.torch, model.model
    out = Scored()
    if len(ids) < 2:
        return out
    out.positions = len(ids)
    config = getattr(net, "config", None)
    plain_head = not (getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None))
    with torch.inference_mode():
        batch = torch.tensor([list(ids)])
        if plain_head:  # logits = output layer (hidden states), as LlamaForCausalLM.forward computes them
            hidden = net.base_model(input_ids=batch).last_hidden_state[0, :-1]
            head = net.get_output_embeddings()
        else:
            hidden, head = net(input_ids=batch).logits[0, :-1], None
        targets = torch.tensor(list(ids[1:])).unsqueeze(-1)
        asked = torch.tensor(list(wanted), dtype=torch.long) if len(wanted) else None
        for start in range(0, len(ids) - 1, CHUNK):
            stop = min(start + CHUNK, len(ids) - 1)
            logits = (head(hidden[start:stop]) if head is not None else hidden[start:stop]).float()
            if temperature != 1.0 and tempered_from is not None:
                first = max(tempered_from - 1 - start, 0)  # row j predicts ids[start + j + 1]
                if first < stop - start:
                    logits[first:] /= temperature
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(-1, targets[start:stop])
            out.ranks += ((logits > picked).sum(-1) + 1).tolist()
            out.logprobs += (picked.squeeze(-1) - lse).tolist()
            if top_k:
                values, indices = logits.topk(top_k, dim=-1)
                out.top += [list(zip(i, v)) for i, v in zip(indices.tolist(), (values - lse.unsqueeze(-1)).tolist())]
            else:
                out.top += [[] for _ in range(stop - start)]
            if asked is not None:
                out.asked += (logits[:, asked] - lse.unsqueeze(-1)).tolist()
            else:
                out.asked += [[] for _ in range(stop - start)]
    return out


def _value(lp: float | None) -> float | None:
    return lp if lp is not None and math.isfinite(lp) else None


def generate_response(model: LocalModel, req: GenerateRequest, ids: list[int], out_ids: list[int], finish: str,
                      scored: Scored | None, asked: list[int] | None, started: float) -> dict:
    """One prompt's answer in SGLang's shape (see the module docstring)."""
    tok = model.tokenizer
    with_text = req.return_text_in_logprobs

    def triple(lp: float | None, tid: int) -> list:
        return [_value(lp), tid, tok.id_to_bytes(tid).decode("utf-8", "replace") if with_text else None]

    n = len(ids)
    reason = {"type": "stop", "matched": out_ids[-1]} if finish == "stop" else {"type": "length", "length": req.budget}
    meta: dict = {"id": uuid.uuid4().hex, "finish_reason": reason, "prompt_tokens": n, "completion_tokens": len(out_ids),
                  "cached_tokens": 0}
    if scored is not None:
        start = req.logprob_start_len if req.logprob_start_len >= 0 else n - 1
        inputs, outputs = range(start, n), range(n, n + len(out_ids))
        meta["input_token_logprobs"] = [triple(None if i == start else scored.logprobs[i], ids[i]) for i in inputs]
        meta["output_token_logprobs"] = [triple(scored.logprobs[i], out_ids[i - n]) for i in outputs]
        if req.top_logprobs_num > 0:
            meta["input_top_logprobs"] = [None if i == start else [triple(v, t) for t, v in scored.top[i]] for i in inputs]
            meta["output_top_logprobs"] = [[triple(v, t) for t, v in scored.top[i]] for i in outputs]
        if asked is not None:
            meta["input_token_ids_logprobs"] = [None if i == start else [triple(v, t) for t, v in zip(asked, scored.asked[i])]
                                                for i in inputs]
            meta["output_token_ids_logprobs"] = [[triple(v, t) for t, v in zip(asked, scored.asked[i])] for i in outputs]
    meta["e2e_latency"] = round(time.perf_counter() - started, 4)
    text = tok.decode([i for i in out_ids if i not in tok.special_ids]) if out_ids else ""
    return {"text": text, "output_ids": out_ids, "meta_info": meta}


def run_generate(model: LocalModel, req: GenerateRequest, lock: threading.Lock,
                 counts: Counts | None = None) -> dict | list[dict]:
    """Answer ``POST /generate``: sample (``max_new_tokens`` > 0) and score each prompt, holding
    the model lock; a batch of prompts gets a list of answers, in order, and ``counts`` what it
    ran (every position: no prefix cache)."""
    started = time.perf_counter()
    tok = model.tokenizer
    source = "input_ids" if req.input_ids is not None else "text"
    prompts = [tok.encode(p) if isinstance(p, str) else list(p) for p in req.prompts]
    context = context_length(model)
    entries = 0
    for k, ids in enumerate(prompts):
        where = f"{source}[{k}]" if req.batched else source
        if not ids:
            raise _bad(where, f"'{where}' encodes to no tokens")
        check_context(len(ids), req.budget, context, "sampling_params.max_new_tokens")
        if req.return_logprob and req.logprob_start_len >= len(ids):
            raise _bad("logprob_start_len", f"'logprob_start_len' is {req.logprob_start_len}; {where} has {len(ids)} tokens")
        if req.return_logprob:
            entries += (len(ids) + req.budget) * (1 + req.top_logprobs_num + len(req.asked_ids(k) or ()))
    if sum(map(len, prompts)) > MAX_PROMPT_TOKENS:
        raise _bad(source, f"at most {MAX_PROMPT_TOKENS} prompt tokens in one request, got {sum(map(len, prompts))}")
    if entries > MAX_ENTRIES:
        raise _bad("token_ids_logprob", f"the answer would hold {entries} logprobs (positions x (1 + top_logprobs_num + "
                   f"token_ids_logprob)); at most {MAX_ENTRIES} per request")
    params = req.sampling_params
    greedy = params.temperature == 0
    answers = []
    scored_positions = sampled_positions_run = 0
    with lock:
        for k, ids in enumerate(prompts):
            out_ids, finish = [], "length"
            if req.budget > 0:
                sample = model.sample([ids], temperature=params.temperature, top_p=params.top_p, max_new_tokens=req.budget,
                                      seed=batch_seed(params.sampling_seed, k))[0]
                out_ids, finish = sample.output_ids, sample.finish_reason
            asked = req.asked_ids(k)
            scored = score(model, ids + out_ids, top_k=req.top_logprobs_num, wanted=asked or (),
                           temperature=1.0 if greedy else params.temperature, tempered_from=len(ids)) \
                if req.return_logprob else None
            answers.append(generate_response(model, req, ids, out_ids, finish, scored, asked, started))
            scored_positions += scored.positions if scored else 0
            sampled_positions_run += sampled_positions(len(ids), len(out_ids))
    if counts is not None:
        counts.add("generate", prompt_tokens=sum(map(len, prompts)), scored=scored_positions, sampled=sampled_positions_run)
    return answers if req.batched else answers[0]
