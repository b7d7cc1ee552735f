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
