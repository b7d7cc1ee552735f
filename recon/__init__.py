"""recon: which token ids did a language model sample, given the text it produced?"""

from .errors import ReconError, SpecialTokenMismatch, TokenizerLoadError
from .loading import SHORT_NAMES, load_tokenizer
from .tokenizer import AddedToken, Tokenizer

__all__ = [
    "AddedToken",
    "ReconError",
    "SHORT_NAMES",
    "SpecialTokenMismatch",
    "Tokenizer",
    "TokenizerLoadError",
    "load_tokenizer",
]
__version__ = "0.1.0"
