"""recon: which token ids did a language model sample, given the text it produced?

The package is a house with one room a pipeline stage (``docs/architecture.md`` draws it);
data flows one way, records → reconstruct → audit → stats → report:

* :mod:`recon.tokenizers` — a spec to a :class:`Tokenizer`, safely; special tokens found by text;
* :mod:`recon.samples` — the sample format, reading, importers, export;
* :mod:`recon.prompts` — chat templates, found where models ship them and rendered as the
  engines (vLLM, SGLang: transformers) render them;
* :mod:`recon.audit` — profiles, reconstruction, the audit, the engine at scale, statistics;
* :mod:`recon.recovery` — the model: ground truth by sampling, recovery of sampled ids;
* :mod:`recon.server` — an OpenAI-compatible server over the model, and a client;
* :mod:`recon.notebook` — plots, views, widgets, papermill reports;
* :mod:`recon.cli` — the ``recon`` command.

The modules of recon 0.1's flat layout (``recon.records``, ``recon.loading``, ...) still import,
as aliases of the modules that now hold them (see :data:`MOVED`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from recon.errors import ReconError, SpecialTokenMismatch, TokenizerLoadError
from recon.tokenizers.load import SHORT_NAMES, load_tokenizer
from recon.tokenizers.tokenizer import AddedToken, Tokenizer

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

#: Where each module of the flat layout lives now.
MOVED = {
    "loading": "recon.tokenizers.load",
    "tokenizer": "recon.tokenizers.tokenizer",
    "families": "recon.tokenizers.families",
    "gguf_vocab": "recon.tokenizers.gguf_reader",
    "specials": "recon.tokenizers.specials",
    "bytelevel": "recon.tokenizers.bytelevel",
    "pretokenize": "recon.tokenizers.fast.pretokenize",
    "wordcache": "recon.tokenizers.fast.wordcache",
    "canonical": "recon.tokenizers.fast.canonical",
    "io": "recon.samples.io",
    "records": "recon.samples.records",
    "importers": "recon.samples.importers",
    "export": "recon.samples.export",
    "profiles": "recon.audit.profiles",
    "reconstruct": "recon.audit.reconstruct",
    "engine": "recon.audit.engine",
    "tally": "recon.audit.tally",
    "stats": "recon.audit.stats",
    "generate": "recon.recovery.model",
    "templates": "recon.prompts.template",
    "recover": "recon.recovery.recover",
    "serve": "recon.server.serve",
    "client": "recon.server.client",
    "plots": "recon.notebook.plots",
    "views": "recon.notebook.views",
    "widgets": "recon.notebook.widgets",
    "report": "recon.notebook.report",
}


#: the rooms, importable as attributes too (``recon.audit.audit_records`` after ``import recon``)
ROOMS = ("tokenizers", "samples", "prompts", "audit", "recovery", "server", "notebook", "cli")


def __getattr__(name: str):
    """``from recon import specials`` (and the other flat names) and ``recon.audit`` (and the
    other rooms) import the module on first use."""
    if name in MOVED:
        return importlib.import_module(MOVED[name])
    if name in ROOMS:
        return importlib.import_module(f"recon.{name}")
    raise AttributeError(f"module 'recon' has no attribute {name!r}")


class _Alias:
    """``import recon.records`` gives the very module ``recon.samples.records`` (one module
    object under two names, so its state and classes are shared, not copied). A meta path
    finder and loader by their methods (``importlib.abc`` would cost every start 20 ms: it
    imports ``importlib.resources``)."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, name = fullname.partition(".")
        if head == "recon" and name in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name.partition(".")[2]])
        spec.loader_state = module.__spec__  # the import system sets the alias's spec on the module
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # put its own back


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.append(_Alias())
