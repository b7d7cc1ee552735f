"""A chat template, rendered exactly as an engine renders it.

vLLM and SGLang build a chat prompt with transformers' ``apply_chat_template``, so the prompt ids
a server sampled after are those of transformers' rendering. :meth:`ChatTemplate.render` does what
``apply_chat_template(..., tokenize=False)`` does (``transformers/tokenization_utils_base.py``, with
``render_jinja_template`` and its helpers in ``transformers/utils/chat_template_utils.py``,
transformers 5.x), step for step, because every step can change the text:

* message objects become dicts and keys whose value is None are dropped (OpenAI clients send
  ``"content": null`` and ``"tool_calls": null``, which templates print as ``None``);
* everything the template sees is rebuilt from plain JSON types (a fresh copy: the template can
  mutate nothing of the caller's, and sees no object with methods);
* reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` is copied to
  ``reasoning_content`` and ``thinking``, the names templates read (key order as transformers
  builds it: ``tojson`` of a message shows it);
* the template gets ``messages``, ``tools`` (None when not given, never absent), ``documents``
  (None), ``add_generation_prompt``, the tokenizer's special-token texts (``bos_token``, ...) and
  then the ``chat_template_kwargs`` (``enable_thinking``, ...), which win over the special tokens;
* ``continue_final_message`` leaves the last message open, as transformers cuts it.

The environment (whitespace, undefined variables, filters) is :mod:`recon.prompts.sandbox`'s.
Whatever goes wrong, including a template's own ``raise_exception``, becomes one
:class:`~recon.errors.ReconError` line naming where the template came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import SecurityError

from recon.errors import ReconError, one_line
from recon.prompts.sandbox import MAX_RENDERED_CHARS, OutOfSteps, compile_template, steps_left

#: Most loop iterations plus calls one render may make. Real chat templates take a few per message
#: (a 10,000-message conversation with tools: ~10^5); a million is about a second of jinja2.
MAX_TEMPLATE_STEPS = 1_000_000

__all__ = ["MAX_RENDERED_CHARS", "MAX_TEMPLATE_STEPS", "ChatTemplate", "render_chat_template"]

#: names a message's reasoning comes under; the first is the one templates read (transformers' order)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
#: what transformers appends to the final message to find where it ends (continue_final_message)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
#: variables the renderer passes itself; a chat_template_kwargs key among them is an error there too
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def render_chat_template(template: str, origin: str | Path, **variables: Any) -> str:
    """``template`` rendered with ``variables`` as given, in transformers' environment and recon's
    limits; ``origin`` (the file, with the field) is named in every error, e.g.
    ``model.gguf (tokenizer.chat_template): chat template: refused by the sandbox (...)``."""
    where = f"{origin}: chat template"
    if not isinstance(template, str):
        raise ReconError(f"{where}: expected a string, got {type(template).__name__}")
    budget = steps_left.set([MAX_TEMPLATE_STEPS, MAX_TEMPLATE_STEPS])
    try:
        compiled = compile_template(template)
        pieces, size = [], 0
        for piece in compiled.generate(**variables):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                raise ReconError(f"{where}: renders more than {MAX_RENDERED_CHARS} characters; refused")
            pieces.append(piece)
        return "".join(pieces)
    except ReconError:
        raise
    except OutOfSteps as e:
        raise ReconError(f"{where}: {one_line(e)}") from None
    except jinja2.TemplateSyntaxError as e:
        raise ReconError(f"{where}: line {e.lineno}: not a valid template ({one_line(e.message)})") from None
    except SecurityError as e:
        raise ReconError(f"{where}: refused by the sandbox ({one_line(e)})") from None
    except jinja2.TemplateError as e:
        raise ReconError(f"{where}: {type(e).__name__}: {one_line(e)}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError, MemoryError) as e:
        raise ReconError(f"{where}: failed while rendering ({type(e).__name__}: {one_line(e)})") from None
    finally:
        steps_left.reset(budget)


@dataclass(frozen=True)
class ChatTemplate:
    """A template's text and where it came from (named in errors, e.g.
    ``/x/tokenizer_config.json (chat_template)``); find one with
    :func:`recon.prompts.sources.find_chat_template`."""

    source: str
    origin: str

    def render(self, messages: list[dict], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, chat_template_kwargs: dict | None = None,
               special_tokens: dict[str, str] | None = None, continue_final_message: bool = False) -> str:
        """The prompt text transformers' ``apply_chat_template(messages, tools=tools,
        chat_template=self.source, tokenize=False, add_generation_prompt=...,
        continue_final_message=..., **chat_template_kwargs)`` gives on a tokenizer whose
        ``special_tokens_map`` is ``special_tokens`` (see
        :func:`recon.prompts.sources.special_token_variables`). The default
        ``add_generation_prompt=True`` is the engines' (a chat request asks for a reply)."""
        where = f"{self.origin}: chat template"
        chat = self._prepared(messages, where)
        if continue_final_message and add_generation_prompt:
            raise ReconError(f"{where}: continue_final_message and add_generation_prompt cannot both be set")
        tools = self._tools(tools, where)
        kwargs = dict(chat_template_kwargs or {})
        for name in (*kwargs, *(special_tokens or {})):
            if not isinstance(name, str):
                raise ReconError(f"{where}: chat_template_kwargs and special_tokens take string names, got {name!r}")
        clash = sorted(_RESERVED & kwargs.keys())
        if clash:
            raise ReconError(f"{where}: chat_template_kwargs may not set {', '.join(clash)} (the renderer passes it)")
        variables = _plain({**(special_tokens or {}), **kwargs})
        if continue_final_message and "content" not in self.source:
            raise ReconError(f"{where}: continue_final_message: the template never reads 'content'")
        final = self._open_final(chat, where) if continue_final_message else None
        text = render_chat_template(self.source, self.origin, messages=chat, tools=tools, documents=None,
                                    add_generation_prompt=add_generation_prompt, **variables)
        return text if final is None else _cut_final(text, final, where)

    @staticmethod
    def _prepared(messages: Any, where: str) -> list[dict]:
        """transformers' ``_normalize_chat_messages``, ``_plain_template_data`` and
        ``_alias_reasoning_fields``, in its order."""
        if not isinstance(messages, (list, tuple)):
            raise ReconError(f"{where}: messages must be a list of dicts, got {type(messages).__name__}")
        if not messages:
            raise ReconError(f"{where}: cannot render an empty conversation")
        chat = []
        for i, message in enumerate(_objects_to_dicts(list(messages))):
            if not isinstance(message, dict):
                raise ReconError(f"{where}: messages[{i}]: expected a dict, got {type(message).__name__}")
            message = _plain({key: value for key, value in message.items() if value is not None})
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            chat.append(message)
        return chat

    @staticmethod
    def _tools(tools: Any, where: str) -> list | None:
        if tools is None:
            return None
        if not isinstance(tools, (list, tuple)):
            raise ReconError(f"{where}: tools must be a list of JSON schemas, got {type(tools).__name__}")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise ReconError(f"{where}: tools[{i}]: expected a JSON schema (a dict), got {type(tool).__name__}")
        return _plain(list(tools))

    @staticmethod
    def _open_final(chat: list[dict], where: str) -> str:
        """Tag the final message's content as transformers does; the text it had, to cut at."""
        final = chat[-1].get("content")
        if final is None:
            raise ReconError(f"{where}: continue_final_message: the final message has no content to continue")
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if isinstance(block, dict) and "text" in block:
                    text, block["text"] = block["text"], block["text"] + _CONTINUE_TAG
                    return text
            raise ReconError(f"{where}: continue_final_message: no text block in the final message to continue")
        if not isinstance(final, str):
            raise ReconError(f"{where}: continue_final_message: the final message's content is a {type(final).__name__}")
        chat[-1]["content"] = final + _CONTINUE_TAG
        return final


def _cut_final(text: str, final: Any, where: str) -> str:
    """transformers' cut after the final message: at the tag, or before trimmed trailing space."""
    tag = _CONTINUE_TAG.strip()
    if str(final).strip() not in text or tag not in text:
        raise ReconError(f"{where}: continue_final_message: the template drops part of the final message")
    at = text.rindex(tag)
    if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def _objects_to_dicts(value: Any) -> Any:
    """transformers' ``_message_objects_to_dicts``: mappings, dataclasses and pydantic models to dicts."""
    if isinstance(value, Mapping):
        return {key: _objects_to_dicts(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_objects_to_dicts(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_objects_to_dicts(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _objects_to_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _objects_to_dicts(value.model_dump())
    return value


def _plain(value: Any) -> Any:
    """transformers' ``_plain_template_data``: JSON types only, rebuilt (a fresh copy the template
    cannot reach the caller's objects through); anything else becomes ``"<TypeName>"``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if type(value).__module__ == "numpy" and type(value).__name__ != "ndarray" and getattr(value, "ndim", None) == 0:
        return _plain(value.item())  # a numpy scalar (np.generic): np.bool_(False) must stay falsy
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"
