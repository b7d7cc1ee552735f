"""Errors recon expects and explains.

Every error a user can cause with bad input is a ``ReconError``: its message names the file
(and line or field where there is one) and says what to do. The CLI prints these as one line;
anything else is a bug and keeps its traceback.
"""


class ReconError(Exception):
    """Base class for expected, user-facing errors."""


class TokenizerLoadError(ReconError):
    """A tokenizer spec could not be turned into a tokenizer."""


class SpecialTokenMismatch(ReconError):
    """A special token's id differs from what a config or a params file expects."""


class CheckFailed(ReconError):
    """Two ways of computing the same result disagreed (``recon audit --check``): a bug in recon,
    never the input's fault."""


def one_line(error: object, limit: int = 300) -> str:
    """An error's text for a one-line report: whitespace runs (newlines too) as one space, cut."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cut(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: file contents shown in a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
