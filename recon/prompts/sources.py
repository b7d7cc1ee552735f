"""Where chat templates live, and the special-token texts they are given.

A model ships its chat template in one of several places, and an engine picks among them as
transformers' ``PreTrainedTokenizerBase.from_pretrained`` and ``get_chat_template`` do
(transformers 5.x): ``chat_template.jinja`` (and ``additional_chat_templates/NAME.jinja``) beside the
tokenizer files win over ``chat_template`` in ``tokenizer_config.json``, which is a string or a
list of ``{"name", "template"}``; of several, the one asked for by name, else ``tool_use`` when the
request declares tools, else ``default``. A GGUF carries it as ``tokenizer.chat_template`` (named
ones as ``tokenizer.chat_template.NAME``, as llama.cpp writes them). A file given by hand
(``--chat-template``, vLLM's option of that name) wins over all of them.

Templates print special tokens through variables (``{{ bos_token }}``); transformers passes its
tokenizer's ``special_tokens_map``, read from the same config, so :func:`special_token_variables`
reads them from the tokenizer's own files, never from a table of models.

Everything read here is a downloaded file: broken JSON or a template that is not text gives one
:class:`~recon.errors.ReconError` line naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from recon.errors import ReconError, cut
from recon.prompts.template import ChatTemplate

if TYPE_CHECKING:
    from recon.tokenizers.tokenizer import Tokenizer

#: transformers' ``SPECIAL_TOKENS_ATTRIBUTES``: the named special tokens every template is given
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: where transformers' GGUF loader finds each named special token (``tokenizer.ggml.*_token_id``)
_GGUF_ROLES = {"bos": "bos_token", "eos": "eos_token", "unk": "unk_token", "pad": "pad_token"}
_FIELD = "chat_template"


def find_chat_template(spec: str | Path, *, chat_template: str | Path | None = None, name: str | None = None,
                       tools: bool = False) -> ChatTemplate | None:
    """The chat template an engine would use for the tokenizer ``spec`` (a short name such as
    ``smollm2``, a ``.gguf`` file, a tokenizer directory or a file in one), or the file
    ``chat_template`` when given (``.jinja`` text, or JSON with a ``chat_template`` key). ``name``
    picks one of several templates; otherwise ``tool_use`` when ``tools``, else ``default``.
    None when there is no template (the caller says what to do about it)."""
    if chat_template is not None:
        found = _from_file(Path(chat_template).expanduser(), name, tools)
        if found is None:
            raise ReconError(f"{chat_template}: no chat template in this file (no 'chat_template' key)")
        return found
    path = _spec_path(spec)
    if path.suffix == ".gguf" and path.is_file():
        return _from_gguf(path, name, tools)
    directory = path if path.is_dir() else path.parent
    named = _from_directory(directory)
    if named is None:
        ggufs = sorted(directory.glob("*.gguf"))
        return _from_gguf(ggufs[0], name, tools) if len(ggufs) == 1 else None
    return _pick(named, name, tools)


def special_token_variables(tok: Tokenizer) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... as transformers passes them to this tokenizer's chat
    template (its ``special_tokens_map``): from ``tokenizer_config.json`` (a string, or an object
    with ``content``; ``special_tokens_map.json`` for configs too old to list their added tokens),
    from a GGUF's ``tokenizer.ggml.*_token_id`` (bos, eos, unk, pad, as transformers' GGUF loader
    reads them), else from the roles recon loaded."""
    if tok.kind == "gguf":
        return {_GGUF_ROLES[role]: text for role, text in tok.roles.items() if role in _GGUF_ROLES}
    directory = Path(tok.source) if Path(tok.source).is_dir() else Path(tok.source).parent
    config_path = directory / "tokenizer_config.json"
    if not config_path.is_file():
        return {f"{role}_token": text for role, text in tok.roles.items()}
    config = _read_json(config_path)
    values = dict(config)
    legacy = directory / "special_tokens_map.json"
    if "added_tokens_decoder" not in config and legacy.is_file():
        values.update(_read_json(legacy))
    names = list(SPECIAL_TOKEN_NAMES)
    extra = values.get("extra_special_tokens")
    if isinstance(extra, dict):  # model-specific named tokens (image_token, ...) join the map
        names += [k for k in extra if k not in names]
        values = {**extra, **{k: v for k, v in values.items() if k in SPECIAL_TOKEN_NAMES}}
    found = {}
    for key in names:
        value = values.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            raise ReconError(f"{config_path}: {key}: expected a string or an object with 'content', "
                             f"got {type(value).__name__}")
        found[key] = value
    return found


# -- where a spec's files are -------------------------------------------------------------------
def _spec_path(spec: str | Path) -> Path:
    from recon.tokenizers.load import SHORT_NAMES, load_tokenizer

    if str(spec) in SHORT_NAMES:
        return Path(load_tokenizer(str(spec)).source)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ReconError(f"{spec}: no such file or directory (and not a short name: {', '.join(SHORT_NAMES)})")
    return path


def _from_directory(directory: Path) -> dict[str, tuple[Any, str]] | None:
    """{name: (template, origin)} as transformers collects them, or None when there is none."""
    named: dict[str, tuple[Any, str]] = {}
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        named["default"] = (_read_text(jinja), str(jinja))
    extra_dir = directory / "additional_chat_templates"
    if extra_dir.is_dir():
        for file in sorted(extra_dir.glob("*.jinja")):
            named[file.name.removesuffix(".jinja")] = (_read_text(file), str(file))
    if named:
        return named
    config = directory / "tokenizer_config.json"
    if config.is_file():
        return _from_json(config, required=False)
    return None


def _from_file(path: Path, name: str | None, tools: bool) -> ChatTemplate | None:
    if not path.is_file():
        raise ReconError(f"{path}: no such chat template file")
    if path.suffix == ".gguf":
        return _from_gguf(path, name, tools)
    if path.suffix == ".json":
        named = _from_json(path, required=True)
        return None if named is None else _pick(named, name, tools)
    return _pick({"default": (_read_text(path), str(path))}, name, tools)


def _from_json(path: Path, *, required: bool) -> dict[str, tuple[Any, str]] | None:
    value = _read_json(path).get(_FIELD)
    if value is None:
        return None
    origin = f"{path} ({_FIELD})"
    if isinstance(value, str):
        return {"default": (value, origin)}
    if not isinstance(value, list):
        raise ReconError(f"{path}: {_FIELD}: expected a string or a list of {{name, template}}, "
                         f"got {type(value).__name__}")
    named = {}
    for i, entry in enumerate(value):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
            raise ReconError(f"{path}: {_FIELD}[{i}]: expected an object with string 'name' and 'template', "
                             f"got {cut(entry)}")
        named[entry["name"]] = (entry["template"], f"{path} ({_FIELD}[{i}], {entry['name']!r})")
    return named


def _from_gguf(path: Path, name: str | None, tools: bool) -> ChatTemplate | None:
    from recon.tokenizers.gguf_reader import read_gguf_metadata

    key = "tokenizer.chat_template"
    meta = read_gguf_metadata(path, keys=lambda k: k.startswith(key))
    named = {k.removeprefix(key + "."): (v, f"{path} ({k})") for k, v in meta.items() if k.startswith(key + ".")}
    if key in meta:
        named["default"] = (meta[key], f"{path} ({key})")
    return _pick(named, name, tools) if named else None


def _pick(named: dict[str, tuple[Any, str]], name: str | None, tools: bool) -> ChatTemplate:
    """transformers' ``get_chat_template``: by name, else ``tool_use`` with tools, else ``default``."""
    if name is not None:
        chosen = named.get(name)
        if chosen is None:
            raise ReconError(f"{_where(named)}: no chat template named {name!r} (there are: {', '.join(sorted(named))})")
    elif tools and "tool_use" in named:
        chosen = named["tool_use"]
    elif "default" in named:
        chosen = named["default"]
    else:
        raise ReconError(f"{_where(named)}: several chat templates and none is 'default' "
                         f"({', '.join(sorted(named))}); pick one by name")
    text, origin = chosen
    if not isinstance(text, str):
        raise ReconError(f"{origin}: expected the template as a string, got {type(text).__name__}")
    return ChatTemplate(source=text, origin=origin)


def _where(named: dict[str, tuple[Any, str]]) -> str:
    return next(iter(named.values()))[1]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReconError(f"{path}: cannot read the chat template ({type(e).__name__}: {e})") from None


def _read_json(path: Path) -> dict:
    from recon.tokenizers.load import read_json_object

    return read_json_object(path, ReconError)
