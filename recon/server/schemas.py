"""What ``recon serve`` accepts: one pydantic model per endpoint, and OpenAI's error object.

It exists so that every request body is checked in one place, field by field, before anything
touches the model, and so that every refusal has the same shape, ``{"error": {"message", "type",
"param", "code"}}``, with ``param`` naming the field (``messages[2].content``, ``prompt[0][3]``,
``sampling_params.top_k``) and ``code`` saying what is wrong (``invalid_type``, ``invalid_value``,
``unsupported_parameter``, ``model_not_found``). The endpoints: OpenAI's chat and text completions
(:class:`ChatRequest`, :class:`CompletionRequest`, with vLLM's extra fields) and SGLang's native
``/generate`` (:class:`GenerateRequest`).

The fields are typed with the strict validators of :mod:`recon.server.fields`; :func:`api_error`
turns the first error pydantic collected into an :class:`ApiError`. Unknown fields are ignored
(clients send ``user``, ``metadata``, ``store``, ``rid``...); the fields in :data:`UNSUPPORTED`
(and SGLang's sampling options beyond temperature and top-p) would change the output if ignored,
so they are refused unless they hold their "off" value. Server limits (``max_tokens`` cap,
vocabulary size, served name) come in through pydantic's validation context.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from recon.server.fields import (  # noqa: F401 - ApiError, to_json and parse_body are imported from here too
    MAX_TOP_LOGPROBS,
    ApiError,
    Flag,
    Invalid,
    Off,
    Penalty,
    Seed,
    Temperature,
    TopK,
    TopP,
    _best_of,
    _content,
    _fixed,
    _id_lists,
    _model,
    _no_stream_options,
    _non_empty_list,
    _object,
    _prompts,
    _role,
    _texts,
    _where,
    integer,
    parse_body,
    show,
    to_json,
)

MAX_TOP_LOGPROBS_NUM = 128  # SGLang's top_logprobs_num (uncapped there; the answer's size is bounded too)
MAX_N = 16
DEFAULT_MAX_TOKENS = 128
#: request fields that would change the output if ignored; refused rather than silently dropped
UNSUPPORTED = ("stop", "tools", "functions", "tool_choice", "response_format", "logit_bias", "suffix", "best_of")


_FIRST = {"model": 0, "messages": 1, "prompt": 1, **{key: 2 for key in UNSUPPORTED}, "frequency_penalty": 2,
          "presence_penalty": 2}


def api_error(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as OpenAI's 400 (404 for another model's name)."""
    first = min(error.errors(), key=lambda e: _FIRST.get(e["loc"][0] if e["loc"] else "", 3))  # min is stable
    where = _where(first["loc"])
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, Invalid):
        param = cause.param or where + cause.sub
        return ApiError(cause.status, cause.text(param), param=param, code=cause.code)
    got = type(first.get("input")).__name__
    if first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return ApiError(400, f"'{where}' must be an object, got {got}", param=where, code="invalid_type")
    return ApiError(400, f"'{where}': {first['msg']}", param=where or None, code="invalid_value")


class _Request(BaseModel):
    """What both endpoints share. Errors are reported for ``model`` first, then for the messages
    or prompt, then for these unsupported features, then in the order the fields are declared."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: Annotated[str | None, PlainValidator(_model)] = None
    stop: Off = None
    tools: Off = None
    functions: Off = None
    tool_choice: Off = None
    response_format: Off = None
    logit_bias: Off = None
    suffix: Off = None
    best_of: Annotated[Any, PlainValidator(_best_of)] = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    _budget: int = PrivateAttr(0)

    @property
    def budget(self) -> int:
        """Tokens to generate per prompt or choice: ``max_completion_tokens``, else ``max_tokens``, else the default."""
        return self._budget

    def _resolve_budget(self, info: ValidationInfo, what: str, count: int, default: int) -> None:
        cap = (info.context or {}).get("max_tokens", 2048)
        value = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        value = min(default, cap) if value is None else value
        if count * value > cap:
            raise Invalid("invalid_value", lambda p: f"{what} x 'max_tokens' is {count} x {value} = {count * value} tokens; "
                          f"this server generates at most {cap} per request", param="max_tokens")
        self._budget = value

    @property
    def tokens_as_ids(self) -> bool:
        return self.return_tokens_as_token_ids


class Message(BaseModel):
    """One chat message: a role and its text (``name``, ``tool_call_id``... are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Annotated[str, PlainValidator(_role)] = Field(None, validate_default=True)
    content: Annotated[str, PlainValidator(_content)] = Field(None, validate_default=True)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    include_usage: Flag = False


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], BeforeValidator(_non_empty_list)] = Field(None, validate_default=True)
    logprobs: Flag = False
    top_logprobs: integer(0, MAX_TOP_LOGPROBS, 0) = 0
    stream: Flag = False
    stream_options: Annotated[StreamOptions | None, BeforeValidator(_object)] = None
    n: integer(1, MAX_N, 1) = 1
    max_tokens: integer(1, "max_tokens", None) = None
    max_completion_tokens: integer(1, "max_tokens", None) = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    seed: Seed = 0
    return_token_ids: Flag = False
    return_tokens_as_token_ids: Flag = False

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise Invalid("invalid_value", lambda p: "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if self.stream_options is not None and not self.stream:
            raise Invalid("invalid_value", lambda p: "'stream_options' is only allowed with 'stream': true", param="stream_options")
        self._resolve_budget(info, "'n'", self.n, DEFAULT_MAX_TOKENS)
        return self

    @property
    def chat_messages(self) -> list[dict]:
        """The messages as the chat template takes them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Request):
    """``POST /v1/completions``: prompts as strings or token ids; a ``budget`` of 0 scores them only."""

    prompt: Annotated[list, PlainValidator(_prompts)] = Field(None, validate_default=True)
    stream: Flag = False
    stream_options: Annotated[Any, PlainValidator(_no_stream_options)] = None
    n: integer(1, 1, 1) = 1
    max_tokens: integer(0, "max_tokens", None) = None
    max_completion_tokens: integer(0, "max_tokens", None) = None
    echo: Flag = False
    logprobs: TopK = None
    prompt_logprobs: TopK = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    seed: Seed = 0
    return_token_ids: Flag = False
    return_tokens_as_token_ids: Flag = False

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> CompletionRequest:
        if self.stream:
            raise Invalid("invalid_value", lambda p: "streaming is supported on /v1/chat/completions only", param="stream")
        self._resolve_budget(info, "prompts", len(self.prompt), 16)
        return self

    @property
    def prompts(self) -> list[list[int] | str]:
        return self.prompt


class SamplingParams(BaseModel):
    """SGLang's ``sampling_params``: ``max_new_tokens`` (0 scores the input only), ``temperature``, ``top_p``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    max_new_tokens: integer(0, "max_tokens", None) = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    sampling_seed: Seed = 0
    top_k: _fixed(-1) = -1
    min_p: _fixed(0.0, 0) = 0.0
    repetition_penalty: _fixed(1.0, 1) = 1.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    n: _fixed(1) = 1
    ignore_eos: _fixed(False) = False
    stop: Off = None
    stop_token_ids: Off = None
    regex: Off = None
    json_schema: Off = None
    ebnf: Off = None


class GenerateRequest(BaseModel):
    """SGLang's native ``POST /generate``: ``input_ids`` (or ``text``), one prompt or a batch, with
    ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num`` and ``token_ids_logprob``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    text: Annotated[Any, PlainValidator(_texts)] = None
    input_ids: Annotated[Any, PlainValidator(_id_lists)] = None
    sampling_params: Annotated[SamplingParams, BeforeValidator(lambda v: {} if v is None else _object(v))] = \
        Field(None, validate_default=True)
    return_logprob: Flag = False
    logprob_start_len: integer(-1, 2**31 - 1, -1) = -1
    top_logprobs_num: integer(0, MAX_TOP_LOGPROBS_NUM, 0) = 0
    token_ids_logprob: Annotated[Any, PlainValidator(_id_lists)] = None
    return_text_in_logprobs: Flag = False
    stream: _fixed(False) = False
    input_embeds: Off = None
    image_data: Off = None
    lora_path: Off = None
    custom_logit_processor: Off = None
    _budget: int = PrivateAttr(0)

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise Invalid("invalid_value", lambda p: "give one of 'text' and 'input_ids'", param="input_ids")
        asked = self.token_ids_logprob
        if asked is not None and asked[0] and len(asked[1]) != len(self.prompts):
            raise Invalid("invalid_value", lambda p: f"'token_ids_logprob' has {len(asked[1])} lists for "
                          f"{len(self.prompts)} prompts", param="token_ids_logprob")
        cap, count = (info.context or {}).get("max_tokens", 2048), len(self.prompts)
        wanted = self.sampling_params.max_new_tokens
        if wanted is not None and count * wanted > cap:
            raise Invalid("invalid_value", lambda p: f"prompts x 'max_new_tokens' is {count} x {wanted}; this server "
                          f"generates at most {cap} tokens per request", param="sampling_params.max_new_tokens")
        self._budget = min(DEFAULT_MAX_TOKENS, cap // count) if wanted is None else wanted  # SGLang's default: 128
        return self

    @property
    def budget(self) -> int:
        """Tokens to generate per prompt (0: score the input only)."""
        return self._budget

    @property
    def batched(self) -> bool:
        return self.input_ids[0] if self.input_ids is not None else isinstance(self.text, list)

    @property
    def prompts(self) -> list[list[int] | str]:
        return self.input_ids[1] if self.input_ids is not None else self.text

    def asked_ids(self, k: int) -> list[int] | None:
        """The ids ``token_ids_logprob`` asks for at every position of prompt ``k`` (a flat list is for every prompt)."""
        if self.token_ids_logprob is None:
            return None
        batch, rows = self.token_ids_logprob
        return rows[k] if batch else rows[0]


def _validate(cls: type[BaseModel], body: dict, context: dict) -> Any:
    try:
        return cls.model_validate(body, context=context)
    except ValidationError as e:
        raise api_error(e) from None


def parse_chat_request(body: dict, *, served: str, max_tokens: int = 2048) -> ChatRequest:
    """A chat completion body checked field by field; :class:`ApiError` names the first bad field."""
    return _validate(ChatRequest, body, {"served": served, "max_tokens": max_tokens})


def parse_generate_request(body: dict, *, vocab_size: int, max_tokens: int = 2048) -> GenerateRequest:
    """An SGLang ``/generate`` body checked field by field."""
    return _validate(GenerateRequest, body, {"max_tokens": max_tokens, "vocab_size": vocab_size})


def parse_completion_request(body: dict, *, served: str, vocab_size: int, max_tokens: int = 2048) -> CompletionRequest:
    """A ``/v1/completions`` body checked field by field (``max_tokens`` 0 scores the prompt only)."""
    return _validate(CompletionRequest, body, {"served": served, "max_tokens": max_tokens, "vocab_size": vocab_size})
