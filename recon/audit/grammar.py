"""A model family's output grammar as declared: the :class:`Profile` dataclass, the prompt rule that
adjusts it (:meth:`Profile.after_prompt`), and the YAML files profiles come from (the built-in
``profiles.yaml`` beside this module, or a user's). Binding a profile to a tokenizer, rendering
and parsing outputs with it: :mod:`recon.audit.profiles`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from recon.errors import ReconError

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile
    from recon.tokenizers.tokenizer import Tokenizer

PLACEHOLDER = re.compile(r"\{(name|arguments|index|id)\}")


@dataclass(frozen=True)
class Profile:
    name: str
    end: str
    description: str = ""
    reasoning_open: str | None = None
    reasoning_close: str | None = None
    unclosed: str = "reasoning"
    tools_begin: str = ""
    tools_end: str = ""
    call: str | None = None
    call_id: str | None = None
    call_separator: str = ""
    content_tools_separator: str = ""
    arguments: str = "text"
    #: the tag that opens reasoning, which either the template's generation prompt or the model writes
    reasoning_tag: str | None = None

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning_close is not None

    @property
    def has_tools(self) -> bool:
        return self.call is not None

    def literals(self) -> list[str]:
        """Every fixed string of the grammar (placeholders removed), for special-token lookup."""
        parts = [self.end, self.reasoning_open or "", self.reasoning_close or "", self.tools_begin, self.tools_end,
                 self.call_separator, self.content_tools_separator]
        for template in (self.call, self.call_id):
            if template:
                parts += PLACEHOLDER.split(template)[::2]
        return [p for p in parts if p]

    def after_prompt(self, prompt: str) -> "Profile":
        """This grammar for an output that follows ``prompt`` (its text, or its last few tokens').

        Whether the sampled ids start with the reasoning tag depends on the template, not the
        model family: Kimi-K2.5's generation prompt ends with ``<think>`` (the model samples the
        reasoning text straight away), Kimi-K2-Thinking's ends with ``<|im_middle|>`` (the model
        samples ``<think>`` itself), and DeepSeek-V3.1's or Qwen3's with thinking off end with
        ``</think>`` (the model samples no reasoning at all). So the prompt decides:

        * it ends with the opening, the tag at least (``<think>``, or Qwen3's ``<think>\n``):
          what is left of the opening is sampled (often nothing);
        * it ends with the closing tag: reasoning was switched off, and the grammar has none;
        * otherwise the model samples the whole opening, tag included.

        A profile without ``reasoning_tag`` keeps its declared ``reasoning_open`` whatever the prompt."""
        tag = self.reasoning_tag
        if not self.has_reasoning or not tag:
            return self
        opening = self.reasoning_open or ""
        full = opening if opening.startswith(tag) else tag + opening
        for k in range(len(full), len(tag) - 1, -1):
            if prompt.endswith(full[:k]):
                return self if full[k:] == opening else replace(self, reasoning_open=full[k:])
        close = (self.reasoning_close or "").strip()
        if close and prompt.rstrip().endswith(close):
            return replace(self, reasoning_open=None, reasoning_close=None, unclosed="content")
        return self if full == opening else replace(self, reasoning_open=full)

    def bind(self, tok: Tokenizer) -> "BoundProfile":
        """This profile on ``tok``: every added token its strings contain, found by text."""
        added = sorted(tok.added_by_content, key=len, reverse=True)
        needed: list[str] = []
        for literal in self.literals():
            needed += [t for t in added if t in literal and t not in needed]
        # the grammar's token-like strings (<|...|>, <｜...｜>, </think>) must all be added tokens
        wanted = {m for lit in self.literals() for m in re.findall(r"<[|｜][^<>]*?[|｜]>|</?think>", lit)}
        missing = sorted(w for w in wanted if w not in tok.added_by_content)
        if missing:
            raise ReconError(
                f"profile {self.name!r} needs tokens {', '.join(repr(m) for m in missing)} that tokenizer "
                f"{tok.name} does not have as added tokens; pick the profile that matches the model"
            )
        from recon.audit.profiles import BoundProfile

        return BoundProfile(self, tok, {t: tok.added_by_content[t].id for t in needed})


def _load_yaml(path: Path | str, text: str) -> dict[str, Profile]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:  # one line: where, and the problem without the source excerpt
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark else ""
        raise ReconError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(data, dict):
        raise ReconError(f"{path}: expected a mapping of profile name -> fields")
    known = {f.name for f in fields(Profile)} - {"name"}
    profiles = {}
    for name, spec in data.items():
        if not isinstance(spec, dict):
            raise ReconError(f"{path}: {name}: expected a mapping of fields")
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ReconError(f"{path}: {name}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if not isinstance(spec.get("end"), str):
            raise ReconError(f"{path}: {name}: 'end' (the end-of-turn token's text) is required")
        if spec.get("unclosed", "reasoning") not in ("reasoning", "content"):
            raise ReconError(f"{path}: {name}: 'unclosed' must be 'reasoning' or 'content'")
        if spec.get("arguments", "text") not in ("text", "json"):
            raise ReconError(f"{path}: {name}: 'arguments' must be 'text' or 'json'")
        nullable = {f.name for f in fields(Profile) if f.default is None}
        for key, value in spec.items():
            if not isinstance(value, str) and not (value is None and key in nullable):
                raise ReconError(f"{path}: {name}.{key}: expected a string, got {type(value).__name__}")
        profiles[str(name)] = Profile(name=str(name), **spec)
    return profiles


def builtin_profiles() -> dict[str, Profile]:
    source = Path(__file__).with_name("profiles.yaml")  # (package data beside this module; no importlib.resources at start)
    return _load_yaml("recon/audit/profiles.yaml", source.read_text(encoding="utf-8"))


def load_profile(spec: str | Path) -> Profile:
    """A built-in profile by name (``kimi-k2``, ``deepseek``, ``qwen3``, ``chatml``) or from a YAML file
    (``path.yaml`` with one profile, or ``path.yaml:name``)."""
    text = str(spec)
    builtins = builtin_profiles()
    if text in builtins:
        return builtins[text]
    path_text, _, wanted = text.partition(".yaml:")
    path = Path(path_text + ".yaml" if wanted else text)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ReconError(f"{path}: cannot read ({e})") from None
        found = _load_yaml(path, content)
        if wanted:
            if wanted not in found:
                raise ReconError(f"{path}: no profile {wanted!r} (has {', '.join(found)})")
            return found[wanted]
        if len(found) != 1:
            raise ReconError(f"{path}: holds {len(found)} profiles; say which with {path}:NAME")
        return next(iter(found.values()))
    raise ReconError(f"unknown profile {text!r}; built-in: {', '.join(builtins)}, or a YAML file")
