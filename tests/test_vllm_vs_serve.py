"""`recon serve` held to the real thing: the same requests (same seeds) to vLLM 0.32.0 on the CPU and
to `recon serve`, compared field by field: names, types, which fields appear when, the stream's
chunk layout, usage, error statuses and bodies. Every difference left is in ALLOWED, with why."""

from __future__ import annotations

import pytest

from .vllm_cases import BAD, CASES, ask, post

pytestmark = pytest.mark.vllm

#: where recon serve differs from vLLM on purpose: path (as shape() writes it) -> why
ALLOWED = {
    ".system_fingerprint": "vLLM names its build (vllm-0.32.0-<hash>); recon is not vLLM",
    ".service_tier": "vLLM-only null field (OpenAI's scheduling tier); recon does not model it",
    ".kv_transfer_params": "vLLM-only null field (disaggregated prefill); recon does not model it",
    ".ec_transfer_params": "vLLM-only null field (encoder cache transfer); recon does not model it",
    ".metrics": "vLLM-only null field (request metrics); recon does not model it",
    ".prompt_text": "vLLM-only null field (the prompt's text, with return_prompt_text); recon does not model it",
    ".choices[].routed_experts": "vLLM-only null field (MoE routing); recon does not model it",
    ".usage.prompt_tokens_details": "vLLM writes null (no cached-token count); recon leaves it out",
    ".usage.completion_tokens_details": "vLLM writes null (no reasoning-token count); recon leaves it out",
    # return_tokens_as_token_ids: vLLM gives the sampled token's real bytes but, in top_logprobs,
    # the bytes of the string "token_id:N"; recon writes null for both (the ids are the data)
    ".choices[].logprobs.content[].bytes": "tokens as ids: vLLM's bytes are mixed (see above); recon null",
    ".choices[].logprobs.content[].bytes[]": "tokens as ids: as above",
    ".choices[].logprobs.content[].top_logprobs[].bytes": "tokens as ids: vLLM's are the text 'token_id:N'",
    ".choices[].logprobs.content[].top_logprobs[].bytes[]": "tokens as ids: as above",
}
#: whole requests recon answers otherwise, on purpose: name -> why
ALLOWED_CASES = {
    "chat_tools": "recon serve refuses `tools` (400, param tools): its chat path renders no tool schema, and "
                  "a silent drop would give other prompt ids than an engine that renders it",
}
#: error bodies: the status and the keys agree; these values differ on purpose
ALLOWED_ERROR_VALUES = {
    "type": "recon writes OpenAI's error type (invalid_request_error); vLLM its exception's class name "
            "(BadRequestError, NotFoundError, 'Bad Request')",
    "code": "recon writes OpenAI's string codes (invalid_value, model_not_found, invalid_json); vLLM the HTTP status",
    "message": "each server's own words",
    "param": "vLLM names pydantic's location (body.messages) or none at all for n; recon the request field",
}


def shape(x, path: str = "", out: dict | None = None) -> dict:
    """Every field's path -> its JSON type (lists: their first three items)."""
    out = {} if out is None else out
    if isinstance(x, dict):
        out[path or "."] = "object"
        for k, v in x.items():
            shape(v, f"{path}.{k}", out)
    elif isinstance(x, list):
        out[path or "."] = "array"
        for v in x[:3]:
            shape(v, path + "[]", out)
    else:
        out[path] = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}[type(x)]
    return out


def stream_layout(chunks: list[dict]) -> dict:
    """A stream as its kinds of chunk: the role chunk, a token chunk, the last token chunk, the usage chunk."""
    return {"role": chunks[0], "token": chunks[1], "last": chunks[-2], "usage": chunks[-1]}


@pytest.fixture(scope="module")
def servers(vllm_engine):
    from .test_serve import SERVE_OPTIONS, shared_server

    return vllm_engine.url, shared_server(*SERVE_OPTIONS)


@pytest.mark.parametrize("name", list(CASES))
def test_recon_serve_answers_as_vllm_does(servers, name):
    vllm_url, recon_url = servers
    (vs, va), (rs, ra) = ask(vllm_url, name), ask(recon_url, name)
    if name in ALLOWED_CASES:
        assert vs == 200 and rs == 400 and ra["error"]["param"] == "tools"
        return
    assert vs == rs == 200, (va, ra)
    if isinstance(va, list):
        assert isinstance(ra, list)
        assert [len(c["choices"]) for c in va][-1] == 0 == len(ra[-1]["choices"])  # usage: a chunk of its own
        assert all("usage" not in c for c in va[:-1]) and all("usage" not in c for c in ra[:-1])
        assert va[-2]["choices"][0]["finish_reason"] and ra[-2]["choices"][0]["finish_reason"]
        va, ra = stream_layout(va), stream_layout(ra)
    want, got = shape(va), shape(ra)
    differ = {p: (want.get(p), got.get(p)) for p in set(want) | set(got) if want.get(p) != got.get(p)}
    unexplained = {p: d for p, d in differ.items() if p.split(".", 2)[-1] not in {a.lstrip(".") for a in ALLOWED}
                   and not any(p.endswith(a) for a in ALLOWED)}
    assert unexplained == {}, f"{name}: (vLLM, recon) types differ where recon claims vLLM's shape"


@pytest.mark.parametrize("name", list(BAD))
def test_bad_requests_get_vllm_s_status_and_an_error_object(servers, name):
    vllm_url, recon_url = servers
    route, raw = BAD[name]
    (vs, va), (rs, ra) = post(vllm_url, route, raw), post(recon_url, route, raw)
    assert vs == rs, (va, ra)
    assert set(va) == set(ra) == {"error"}
    assert set(va["error"]) == set(ra["error"]) == set(ALLOWED_ERROR_VALUES)
