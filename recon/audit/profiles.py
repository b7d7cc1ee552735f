"""Response profiles: each model family's output grammar, declared, not coded.

An API splits a completion into ``reasoning_content``, ``content`` and ``tool_calls``; putting
the ids back together needs the family's grammar: which text closes the reasoning, how tool
calls are wrapped, which token ends the turn. A :class:`Profile` says that with strings whose
special tokens are named by their text; :meth:`Profile.bind` looks each one up in a tokenizer
and refuses, naming them, when the tokenizer lacks any. Built-in profiles live in
``profiles.yaml`` beside this module; a user adds a model with a YAML file of the same shape
(declared and read in :mod:`recon.audit.grammar`; bound, rendered and parsed here).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from recon.audit.grammar import PLACEHOLDER, Profile, builtin_profiles, load_profile  # noqa: F401 - the public names
from recon.errors import ReconError
from recon.samples.records import Response, ToolCall
from recon.tokenizers.tokenizer import Tokenizer

#: Where a byte of an output lies, in the order the grammar puts them (see :meth:`BoundProfile.regions`).
REGIONS = ("reasoning", "content", "tool_call", "end")


# -- rendering and parsing ------------------------------------------------------------------------------
@dataclass
class Part:
    """One piece of a rendered output: a special token, fixed grammar text, or an API field's text."""

    kind: str  # "special" | "literal" | "field"
    text: str
    field: str = ""  # reasoning | content | tool_calls[i].name | tool_calls[i].arguments | ...


@dataclass
class ParseOptions:
    """Known deviations of servers' reasoning and tool-call parsers."""

    strip_content: bool = False          # strip whitespace around content (and reasoning)
    drop_newline_after_close: bool = False  # drop one "\n" right after the reasoning close tag
    reserialize_arguments: bool = False  # json.dumps(json.loads(arguments)) with default separators
    renumber_ids: bool = False           # call ids replaced by "call_{index}"
    skip_special_tokens: bool = False    # drop special tokens outside the grammar from the text (servers' default)


@dataclass(frozen=True)
class _Grammar:
    open: str | bytes
    close: str | bytes
    end: str | bytes
    separator: str | bytes
    section: re.Pattern | None  # where the calls section starts


class _Layout(NamedTuple):
    """Offsets into one output: ``[0, content_start)`` reasoning (tags included), then content up to
    ``content_end``, the calls section from ``tools_from`` (its separator) or ``section`` (its first
    text), the end token from ``end_at``."""

    reasoning: tuple[int, int] | None  # the reasoning text, without its tags
    content_start: int
    content_end: int
    tools_from: int
    section: int | None
    end_at: int
    finish: str


class BoundProfile:
    """A profile with its special tokens looked up in one tokenizer."""

    def __init__(self, profile: Profile, tok: Tokenizer, special_ids: dict[str, int]):
        self.profile, self.tok, self.special_ids = profile, tok, special_ids
        self.end_id = special_ids.get(profile.end)
        self._grammars: dict[type, _Grammar] = {}
        self._after: dict[str, BoundProfile] = {}

    #: how many of a prompt's last tokens :meth:`after_prompt_ids` reads (the longest opening a
    #: template writes, ``<think>\n\n</think>\n\n``, is a few tokens)
    PROMPT_TAIL = 8

    def after_prompt_ids(self, prompt_ids: list[int] | None) -> "BoundProfile":
        """This bound profile, or its variant for outputs after ``prompt_ids``
        (:meth:`Profile.after_prompt`); None (no prompt known) keeps the declared grammar."""
        if not prompt_ids or not self.profile.reasoning_tag:
            return self
        tail = self.tok.ids_bytes(prompt_ids[-self.PROMPT_TAIL:]).decode("utf-8", "replace")
        variant = self.profile.after_prompt(tail)
        if variant is self.profile:
            return self
        key = f"{variant.reasoning_open!r}/{variant.reasoning_close!r}"
        if key not in self._after:
            self._after[key] = variant.bind(self.tok)
        return self._after[key]

    @cached_property
    def _special_split(self) -> re.Pattern | None:
        if not self.special_ids:
            return None
        return re.compile("(" + "|".join(re.escape(t) for t in sorted(self.special_ids, key=len, reverse=True)) + ")")

    def _literal(self, text: str, out: list[Part]) -> None:
        """Grammar text, cut into special tokens and the plain text between them."""
        if not text:
            return
        pieces = self._special_split.split(text) if self._special_split else [text]
        for piece in pieces:
            if piece:
                out.append(Part("special" if piece in self.special_ids else "literal", piece))

    def _template(self, template: str, values: dict[str, str], field_prefix: str, out: list[Part]) -> None:
        pos = 0
        for m in PLACEHOLDER.finditer(template):
            self._literal(template[pos : m.start()], out)
            value = values[m.group(1)]
            if m.group(1) in ("name", "arguments"):
                out.append(Part("field", value, f"{field_prefix}.{m.group(1)}"))
            else:  # ids and indices are grammar the server derives, not free text
                self._literal(value, out)
            pos = m.end()
        self._literal(template[pos:], out)

    def call_id(self, name: str, index: int) -> str:
        template = self.profile.call_id or "call_{index}"
        return template.replace("{name}", name).replace("{index}", str(index))

    def render_parts(self, view: Response) -> list[Part]:
        """The output the model sampled for this API view, as parts in order."""
        p = self.profile
        out: list[Part] = []
        calls = view.tool_calls or []
        if calls and not p.has_tools:
            raise ReconError(f"profile {p.name!r} has no tool-call grammar, but the response has {len(calls)} tool call(s)")
        if view.reasoning_content is not None:
            if not p.has_reasoning:
                raise ReconError(f"profile {p.name!r} has no reasoning grammar, but the response has reasoning_content")
            self._literal(p.reasoning_open or "", out)
            out.append(Part("field", view.reasoning_content, "reasoning"))
            cut_while_thinking = view.finish_reason == "length" and not view.content and not calls
            if not cut_while_thinking:
                self._literal(p.reasoning_close, out)
        if view.content:
            out.append(Part("field", view.content, "content"))
        if calls:
            if view.content:
                self._literal(p.content_tools_separator, out)
            self._literal(p.tools_begin, out)
            for k, call in enumerate(calls):
                if k:
                    self._literal(p.call_separator, out)
                arguments = call.arguments
                if p.arguments == "json":
                    try:
                        json.loads(arguments)
                    except json.JSONDecodeError as e:
                        raise ReconError(f"tool_calls[{k}].function.arguments is not JSON ({e.msg} at column {e.colno}); "
                                         f"profile {p.name!r} embeds it as JSON") from None
                values = {"name": call.name, "arguments": arguments, "index": str(k), "id": call.id or self.call_id(call.name, k)}
                self._template(p.call, values, f"tool_calls[{k}]", out)
            self._literal(p.tools_end, out)
        if view.finish_reason in ("stop", "tool_calls", None):
            self._literal(p.end, out)
        return [part for part in out if part.text]

    def render(self, view: Response) -> str:
        return "".join(part.text for part in self.render_parts(view))

    # -- parse -------------------------------------------------------------------------------------
    @cached_property
    def _call_pattern(self) -> re.Pattern:
        template = self.profile.call or ""
        pattern, pos = "", 0
        for m in PLACEHOLDER.finditer(template):
            pattern += self._loose(template[pos : m.start()])
            pattern += {"name": r"(?P<name>[^\s<>{}\"]+?)", "arguments": r"(?P<arguments>.*?)",
                        "index": r"(?P<index>\d+)", "id": r"(?P<id>[^<>\s]+?)"}[m.group(1)]
            pos = m.end()
        return re.compile(pattern + self._loose(template[pos:]), re.S)

    def _loose(self, literal: str) -> str:
        """A pattern for grammar text. With JSON arguments the call is a JSON wrapper a model may
        space its own way, and a server's JSON parser accepts it: any whitespace where the template
        has some, optional whitespace around ``{ } : ,`` (``{"name":"f"`` is found as the template's
        ``{"name": "f"``). Text grammars match exactly."""
        if self.profile.arguments != "json":
            return re.escape(literal)
        out: list[str] = []
        for ch in literal:
            if ch.isspace():
                piece = r"\s*"
            elif ch in "{}:,":
                piece = r"\s*" + re.escape(ch) + r"\s*"
            else:
                piece = re.escape(ch)
            out.append(piece)
        return re.sub(r"(\\s\*)+", r"\\s*", "".join(out))

    def _grammar(self, kind: type) -> "_Grammar":
        """The fixed strings and the calls-section pattern as ``str`` (parsing) or ``bytes`` (regions)."""
        cache = self._grammars
        if kind not in cache:
            p = self.profile
            conv = (lambda t: t) if kind is str else (lambda t: t.encode("utf-8"))
            section = None
            if p.has_tools:
                first = self._loose(p.tools_begin) if p.tools_begin else self._loose(PLACEHOLDER.split(p.call)[0])
                section = re.compile(conv(first), re.S) if first else None
            cache[kind] = _Grammar(conv(p.reasoning_open or ""), conv(p.reasoning_close or ""), conv(p.end),
                                   conv(p.content_tools_separator), section)
        return cache[kind]

    def _layout(self, text, g: "_Grammar") -> "_Layout":
        """Where reasoning, content, the calls section and the end token lie in an output (``str``
        or ``bytes``): the one reading of the grammar that both :meth:`parse_text` and
        :meth:`regions` use, so the audit's regions are where a parser puts each part."""
        p = self.profile
        n, finish = len(text), "length"
        if text.endswith(g.end):
            n, finish = n - len(g.end), "stop"
        body, start = None, 0
        if p.has_reasoning:
            opened = bool(g.open) and text.startswith(g.open)
            begin = len(g.open) if opened else 0
            close_at = text.find(g.close, begin, n)
            if close_at >= 0 and (opened or not g.open):
                body, start = (begin, close_at), close_at + len(g.close)
            elif opened or (not g.open and finish == "length" and p.unclosed == "reasoning"):
                body, start = (begin, n), n
        content_end = tools_from = section = n
        m = g.section.search(text, start, n) if g.section is not None else None
        if m is not None:
            content_end = tools_from = section = m.start()
            if g.separator and text.endswith(g.separator, start, section):
                content_end = tools_from = section - len(g.separator)
        return _Layout(body, start, content_end, tools_from, section if m is not None else None, n, finish)

    def regions(self, output: str | bytes) -> list[tuple[str, int, int]]:
        """``(region, start, end)`` spans covering an output, in order, empty ones left out:
        ``reasoning`` (open tag, text, close tag), ``content``, ``tool_call`` (the whole calls
        section: the separator before it, wrapper text, names, ids, arguments, separators) and
        ``end`` (the end token). Offsets count bytes for ``bytes``, characters for ``str``.
        The audit names a divergence by these (see docs/audit.md)."""
        g = self._grammar(type(output))
        lay = self._layout(output, g)
        spans = [("reasoning", 0, lay.content_start), ("content", lay.content_start, lay.content_end),
                 ("tool_call", lay.tools_from, lay.end_at), ("end", lay.end_at, len(output))]
        return [s for s in spans if s[2] > s[1]]

    def regions_of_ids(self, ids: list[int]) -> list[tuple[str, int, int]]:
        """:meth:`regions` of the bytes ``ids`` spell. A grammar with neither reasoning nor tools
        is content then, maybe, the end token: only the output's length and last bytes matter,
        which spares the audit joining every mismatched sample's bytes."""
        p, tok = self.profile, self.tok
        if p.has_reasoning or p.has_tools:
            return self.regions(tok.ids_bytes(ids))
        end = self._grammar(bytes).end
        size = sum(map(tok.token_lengths.__getitem__, ids))
        cut = size - len(end) if end and tok.ids_bytes(ids[-len(end):]).endswith(end) else size
        return [s for s in (("content", 0, cut), ("end", cut, size)) if s[2] > s[1]]

    def parse_text(self, text: str, options: ParseOptions | None = None) -> Response:
        """The API view a server's reasoning and tool-call parsers make of an output's text."""
        p, o = self.profile, options or ParseOptions()
        lay = self._layout(text, self._grammar(str))
        finish = lay.finish
        reasoning = text[lay.reasoning[0] : lay.reasoning[1]] if lay.reasoning is not None else None
        content = text[lay.content_start : lay.content_end]
        if o.drop_newline_after_close and reasoning is not None and content.startswith("\n"):
            content = content[1:]
        calls: list[ToolCall] = []
        if lay.section is not None:
            for k, m in enumerate(self._call_pattern.finditer(text[lay.section : lay.end_at])):
                groups = m.groupdict()
                name = groups.get("name")
                if name is None and groups.get("id"):
                    id_match = re.fullmatch(re.escape(p.call_id or "").replace(r"\{name\}", "(?P<name>.+?)").replace(r"\{index\}", r"\d+"), groups["id"])
                    name = id_match.group("name") if id_match else groups["id"]
                arguments = groups.get("arguments", "")
                if o.reserialize_arguments:
                    try:
                        arguments = json.dumps(json.loads(arguments))
                    except json.JSONDecodeError:
                        pass
                call_id = groups.get("id") or self.call_id(name, k)
                if o.renumber_ids:
                    call_id = f"call_{k}"
                calls.append(ToolCall(call_id, name, arguments))
            if calls and finish == "stop":
                finish = "tool_calls"
        if o.strip_content:
            content = content.strip()
            reasoning = reasoning.strip() if reasoning is not None else None
        return Response(content=content if content or not (calls or reasoning is not None) else None,
                        reasoning_content=reasoning, tool_calls=calls or None, finish_reason=finish)

    def parse_ids(self, ids: list[int], options: ParseOptions | None = None) -> Response:
        return self.parse_ids_batch([ids], options)[0]

    def parse_ids_batch(self, batch: list[list[int]], options: ParseOptions | None = None) -> list[Response]:
        """:meth:`parse_text` over many outputs, decoded in one batch."""
        return [self.parse_text(text, options) for text in self.server_texts(batch, options)]

    def server_texts(self, batch: list[list[int]], options: ParseOptions | None = None) -> list[str]:
        """The text a server makes of each output before parsing it: the ids decoded, in one batch
        (with ``skip_special_tokens``, special tokens outside the grammar dropped first)."""
        if options is not None and options.skip_special_tokens:
            keep = set(self.special_ids.values())
            drop = self.tok.special_ids - keep
            batch = [[i for i in ids if i not in drop] for ids in batch]
        return self.tok.decode_batch(batch)
