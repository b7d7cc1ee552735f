"""The prompt ids a record's generation followed: the engine's where it reported them, else the
record's request rendered and encoded the way an engine's chat path does.

A trainer needs the whole sequence the model saw: prompt ids, then sampled ids. vLLM and SGLang
report the prompt (``prompt_token_ids``) when asked; OpenRouter and OpenAI's Batch API never do,
so there the prompt is rebuilt from what the request sent (``messages``, ``tools``,
``chat_template_kwargs``) with the model's chat template. The engines' chat path renders the
template to text and encodes that text with ``add_special_tokens=False``: special-token text in
the render becomes special ids, and no BOS is added unless the template writes one. recon's
:meth:`~recon.tokenizers.tokenizer.Tokenizer.encode` does exactly that (``allow_special=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from recon.errors import ReconError
from recon.prompts.sources import special_token_variables
from recon.prompts.template import ChatTemplate
from recon.samples.records import Record

if TYPE_CHECKING:
    from recon.tokenizers.tokenizer import Tokenizer

#: where a record's prompt ids came from
SOURCES = ("engine", "rendered", "none")


@dataclass(frozen=True)
class Prompt:
    """One record's prompt: its ids (None when there is no way to know them), where they came
    from (:data:`SOURCES`), and why not when they are missing."""

    ids: list[int] | None
    source: str
    error: str | None = None


class PromptMaker:
    """A tokenizer and (maybe) its chat template: the prompt ids of records.

    ``template`` None means the records' prompts can only come from the engine."""

    def __init__(self, tok: "Tokenizer", template: ChatTemplate | None):
        self.tok, self.template = tok, template
        self._specials = special_token_variables(tok)

    def render_text(self, record: Record, *, add_generation_prompt: bool = True, messages: list | None = None) -> str:
        """The record's request rendered by the chat template (``messages`` replaces the
        record's, e.g. a prefix of them); a :class:`ReconError` when it can't be."""
        if self.template is None:
            raise ReconError("no chat template: give --chat-template FILE, or a tokenizer directory that has one")
        chat = record.messages if messages is None else messages
        if not chat:
            raise ReconError(f"record {record.id!r} has no messages to render")
        return self.template.render(chat, tools=record.tools, add_generation_prompt=add_generation_prompt,
                                    chat_template_kwargs=record.chat_template_kwargs, special_tokens=self._specials)

    def encode(self, text: str) -> list[int]:
        """Prompt text to ids as the engines' chat path encodes it: special-token text to
        special ids, nothing added."""
        return self.tok.encode(text, allow_special=True)

    def rendered_ids(self, record: Record) -> list[int]:
        return self.encode(self.render_text(record))

    def prompt(self, record: Record) -> Prompt:
        """The engine's ids where the record has them (they are the truth), else the render's."""
        if record.prompt_ids is not None:
            return Prompt(list(record.prompt_ids), "engine")
        if not record.messages:
            return Prompt(None, "none", "no prompt_ids and no messages")
        try:
            return Prompt(self.rendered_ids(record), "rendered")
        except ReconError as e:
            return Prompt(None, "none", str(e))
