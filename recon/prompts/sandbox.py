"""The jinja2 environment chat templates run in: transformers' environment, inside recon's limits.

A chat template is data from a downloaded file, but jinja2 makes it a program: in a plain
``jinja2.Environment`` ``{{ cycler.__init__.__globals__.os.popen('id').read() }}`` runs a shell
command. Engines (vLLM, SGLang) render templates with transformers, and recon must render them as
they do, byte for byte, so this environment is transformers' own (``_cached_compile_jinja_template``
in ``transformers/utils/chat_template_utils.py``, transformers 5.x), copied option by option:

* ``ImmutableSandboxedEnvironment`` (no underscore attributes, no mutation of arguments, ``range``
  bounded), ``trim_blocks=True`` and ``lstrip_blocks=True`` (a block tag's own line and its first
  newline vanish), jinja2's default ``Undefined`` (a missing variable or key is falsy and prints
  as nothing: ``tools``, ``message.tool_calls`` are often absent), no ``keep_trailing_newline``;
* the ``loopcontrols`` extension (``{% break %}``, ``{% continue %}``) and ``{% generation %}``
  (transformers' ``AssistantTracker``, which marks assistant text for training masks; rendering
  it is rendering its body, and that is all recon needs);
* ``tojson`` as plain ``json.dumps`` (jinja2's own escapes ``<``, ``>``, ``&`` and ``'``, which
  would change the prompt), ``raise_exception``, ``strftime_now``, and ``dict`` and ``namespace``
  rebuilt so that they cannot reach Python internals.

recon adds limits on top, which change no real template's text: a ``*`` or ``**`` whose result
would be huge is refused before it is computed, and every loop iteration and every call costs one
step of a work budget that :mod:`recon.prompts.template` sets per render, so nested loops
(``range(100000)`` inside ``range(100000)``, printing nothing) or a macro calling itself twice
cannot hang recon.
"""

from __future__ import annotations

import contextvars
import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

#: Largest rendered prompt, in characters (and largest sequence ``*`` may build). Real chat prompts
#: are far below this; a template looping to build more is an attack or a bug.
MAX_RENDERED_CHARS = 10_000_000

#: [steps left, steps at the start] of the render under way (a list, so loops and calls share it)
steps_left: contextvars.ContextVar[list[int]] = contextvars.ContextVar("recon_template_steps")


class OutOfSteps(SecurityError):
    """The render used up its work budget."""


def _step(cost: int = 1) -> None:
    left = steps_left.get(None)
    if left is not None:
        left[0] -= cost
        if left[0] < 0:
            raise OutOfSteps(f"more than {left[1]} loop iterations and calls; refused")


def _raise_exception(message: Any) -> None:
    """Templates call ``raise_exception('...')`` to reject a conversation (transformers' helper)."""
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: plain ``json.dumps``, same signature, same defaults."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 - transformers' parameter name
    return datetime.now().strftime(format)


class _TemplateDict:
    """transformers' ``dict`` global: builds dicts, and is no class a template can climb from."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """transformers' ``namespace``: no underscore-prefixed attributes, set or given."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2's signature trick: namespace(self=...)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                                f"but got {name!r}")


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers' ``AssistantTracker`` tag, rendered
    as its body (the tracking only feeds ``return_assistant_tokens_mask``, never the text)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _is_budgeted(node: nodes.Node) -> bool:
    return (isinstance(node, nodes.Call) and isinstance(node.node, nodes.EnvironmentAttribute)
            and node.node.name == "budgeted")


class _BudgetCodeGenerator(CodeGenerator):
    """jinja2's code generator, with every ``for`` loop's iterable passed through
    :meth:`_Sandbox.budgeted` (recursive loops too: their inner iterable is ``reciter``).
    jinja2 allows no new node types, so the wrapper is a call of an environment attribute."""

    def visit_For(self, node: nodes.For, frame) -> None:
        if not _is_budgeted(node.iter):
            node.iter = nodes.Call(nodes.EnvironmentAttribute("budgeted"), [node.iter], [], None, None,
                                   lineno=node.lineno)
        super().visit_For(node, frame)

    def write(self, x: str) -> None:
        super().write("environment.budgeted(reciter)" if x == "reciter" else x)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with ``*`` and ``**`` checked before they allocate, and loop
    iterations and calls counted against the work budget."""

    intercepted_binops = frozenset({"*", "**"})
    code_generator_class = _BudgetCodeGenerator

    @staticmethod
    def budgeted(iterable: Any):
        for item in iterable:
            _step()
            yield item

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
        _step()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                size = _size(seq)
                if size is not None and isinstance(times, int) and size * times > MAX_RENDERED_CHARS:
                    raise SecurityError(f"'*' would make a sequence of {size * times} items")
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            bits = right * abs(left).bit_length()
            if bits > 64 * 1024:
                raise SecurityError(f"'**' would make a number of about {bits} bits")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in transformers' environment (cached: servers render one template often)."""
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)
