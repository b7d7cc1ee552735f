"""Chat templates are data: render them in a sandbox, the way transformers does.

A chat template comes from a downloaded file (a GGUF's ``tokenizer.chat_template``, a
``tokenizer_config.json``). Rendered with a plain ``jinja2.Environment`` it is a program with the
whole Python object graph in reach: ``{{ cycler.__init__.__globals__.os.popen('id').read() }}``
runs a shell command. Here it is rendered as transformers' ``_compile_jinja_template`` does, in
``jinja2.sandbox.ImmutableSandboxedEnvironment`` (no underscore attributes, no mutation of the
arguments, ``range`` bounded) with the helpers real templates call (``raise_exception``,
``tojson``, ``strftime_now``, ``{% break %}``/``{% continue %}``). On top of that a ``*`` or
``**`` whose result would be huge is refused before it is computed, and the rendered text is
bounded, so a template cannot exhaust memory; and every loop iteration and every call costs one
step of a work budget (:data:`MAX_TEMPLATE_STEPS`), so nested loops (``range(100000)`` inside
``range(100000)``, no output at all) or a macro calling itself twice cannot hang recon either.
Whatever goes wrong becomes one :class:`~recon.errors.ReconError` naming the file the template
came from.

Whitespace control is jinja2's default plus ``keep_trailing_newline`` (what recon has always
rendered the bundled data with), and undefined variables are errors (``StrictUndefined``), so
a template that needs a variable recon does not pass fails loudly instead of rendering blanks.
"""

from __future__ import annotations

import contextvars
import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from recon.errors import ReconError

#: Largest rendered prompt, in characters. Real chat prompts are far below this; a template
#: looping to build more is an attack or a bug, and stopping it bounds memory.
MAX_RENDERED_CHARS = 10_000_000
#: Most loop iterations plus calls one render may make. Real chat templates take a few per message
#: (a 10,000-message conversation with tools: ~10^5); a million is about a second of jinja2.
MAX_TEMPLATE_STEPS = 1_000_000

#: steps left in the render under way (a one-item list, so loops and calls share it)
_steps_left: contextvars.ContextVar[list[int]] = contextvars.ContextVar("recon_template_steps")


class OutOfSteps(SecurityError):
    """The render used up :data:`MAX_TEMPLATE_STEPS`."""


def _step(cost: int = 1) -> None:
    left = _steps_left.get(None)
    if left is not None:
        left[0] -= cost
        if left[0] < 0:
            raise OutOfSteps(f"more than {MAX_TEMPLATE_STEPS} loop iterations and calls; refused")


def _raise_exception(message: Any) -> None:
    """Templates call ``raise_exception('...')`` to reject bad conversations (transformers' helper)."""
    raise jinja2.exceptions.TemplateError(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: plain ``json.dumps`` (jinja2's own escapes HTML characters)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


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


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                   extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(template: str, origin: str | Path, **variables: Any) -> str:
    """``template`` rendered with ``variables`` in the sandbox; ``origin`` (the file it was read
    from, with the field if useful) is named in every error, e.g.
    ``model.gguf: chat template (tokenizer.chat_template): access to attribute '__init__' ... is unsafe``."""
    where = f"{origin}: chat template"
    if not isinstance(template, str):
        raise ReconError(f"{where}: expected a string, got {type(template).__name__}")
    budget = _steps_left.set([MAX_TEMPLATE_STEPS])
    try:
        compiled = _compile(template)
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
        raise ReconError(f"{where}: {e}") from None
    except jinja2.TemplateSyntaxError as e:
        raise ReconError(f"{where}: line {e.lineno}: not a valid template ({e.message})") from None
    except SecurityError as e:
        raise ReconError(f"{where}: refused by the sandbox ({e})") from None
    except jinja2.TemplateError as e:
        raise ReconError(f"{where}: {type(e).__name__}: {e}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError, MemoryError) as e:
        raise ReconError(f"{where}: failed while rendering ({type(e).__name__}: {e})") from None
    finally:
        _steps_left.reset(budget)
