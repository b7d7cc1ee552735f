"""GGUF model files: the tokenizer inside one, rebuilt as a ``tokenizers`` BPE (no torch), and
cached on disk.

The header is read by :mod:`recon.tokenizers.gguf_reader`; every vocabulary field is checked for
type and range here, so a malformed file is refused with the key named instead of loading a
wrong vocabulary (or crashing inside ``tokenizers``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import suppress
from functools import lru_cache
from pathlib import Path

from recon.errors import TokenizerLoadError, cut, one_line
from recon.tokenizers.gguf_reader import read_gguf_metadata
from recon.tokenizers.native import HFTokenizer, native_failure, native_panics_quiet
from recon.tokenizers.tokenizer import AddedToken

# GGUF "tokenizer.ggml.pre" -> the pre-tokenizer llama.cpp applies (src/llama-vocab.cpp).
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
LLAMA3_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
GGUF_PRE = {
    # single digits, then GPT-2's byte-level regex
    **{p: ("digits", GPT2_REGEX) for p in ("smollm", "starcoder", "refact", "codeshell", "minerva")},
    **{p: ("gpt2", GPT2_REGEX) for p in ("gpt-2", "default", "gpt2")},
    **{p: ("split", LLAMA3_REGEX) for p in ("llama-bpe", "llama3", "smaug-bpe")},
    "qwen2": ("split", QWEN2_REGEX),
}
CONTROL, USER_DEFINED = 3, 4


def load_gguf(path: Path, *, name: str | None = None) -> HFTokenizer:
    """The tokenizer inside a GGUF model file, rebuilt as a ``tokenizers`` BPE (no torch).

    Rebuilding reads and checks the whole vocabulary (~1 s for 49k tokens); the result is kept in
    recon's cache folder (:func:`cache_dir`), under the file's path, size and modification time,
    and later loads of the same file read it from there (~0.2 s)."""
    cached = _gguf_cache_read(path)
    if cached is not None:
        core, added, roles = cached
    else:
        core, added, roles = _build_gguf(path)
        _gguf_cache_write(path, core, added, roles)
    return HFTokenizer(
        core, name=name or str(path), source=path, kind="gguf", added_tokens=tuple(added), roles=roles
    )


#: The cache format; the conversion itself is keyed by :func:`conversion_key`, so no one needs to
#: remember to bump anything when the conversion changes.
GGUF_CACHE_VERSION = 2
MAX_CACHE_BYTES = 256 * 1024 * 1024


@lru_cache(maxsize=1)
def conversion_key() -> str:
    """What a cached build depends on besides the file: the source of the code that converts
    (this module, the header reader, the tokenizer wrapper it builds) and the ``tokenizers``
    version that serialised it. Any edit to the conversion, or an upgrade, misses the old
    entries instead of serving a stale tokenizer."""
    import hashlib

    import tokenizers

    from recon.tokenizers import gguf_reader, native, tokenizer

    digest = hashlib.sha256(tokenizers.__version__.encode())
    for module in (sys.modules[__name__], gguf_reader, native, tokenizer):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """Where recon keeps what it derived from input files: ``$RECON_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/recon``, else ``~/.cache/recon``."""
    if os.environ.get("RECON_CACHE_DIR"):
        return Path(os.environ["RECON_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recon"


def _gguf_cache_path(path: Path) -> Path | None:
    import hashlib

    try:
        stat = path.stat()
    except OSError:
        return None
    key = f"{GGUF_CACHE_VERSION}|{conversion_key()}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return cache_dir() / "gguf" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")


def _gguf_cache_read(path: Path):
    """The cached build of ``path``, or None (none yet, or unreadable: then it is rebuilt; a cache
    entry is data recon wrote, never trusted to be whole)."""
    from tokenizers import Tokenizer as Core

    entry = _gguf_cache_path(path)
    try:
        if entry is None or not entry.is_file() or entry.stat().st_size > MAX_CACHE_BYTES:
            return None
        data = json.loads(entry.read_bytes())
        with native_panics_quiet():
            core = Core.from_str(data["tokenizer"])
        added = [AddedToken(int(i), str(content), bool(special)) for i, content, special in data["added"]]
        roles = {str(k): str(v) for k, v in data["roles"].items()}
    except BaseException as e:  # noqa: BLE001 - any damage means: build it again
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    return core, added, roles


def _gguf_cache_write(path: Path, core, added: list[AddedToken], roles: dict[str, str]) -> None:
    """Keep a build for next time; a cache folder that can't be written is no error."""
    entry = _gguf_cache_path(path)
    if entry is None:
        return
    data = {"source": str(path), "tokenizer": core.to_str(),
            "added": [[t.id, t.content, t.special] for t in added], "roles": roles}
    partial = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, suffix=".partial", delete=False, encoding="utf-8") as f:
            partial = f.name  # written beside the entry and moved into place: a reader never sees half of it
            json.dump(data, f, ensure_ascii=False)
        os.replace(partial, entry)
    except OSError:
        if partial is not None:
            with suppress(OSError):
                os.unlink(partial)


def _build_gguf(path: Path):
    """(core, added tokens, roles) from a GGUF file's header, every field checked."""
    from tokenizers import AddedToken as CoreAddedToken
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Core

    meta = read_gguf_metadata(path)
    if "tokenizer.ggml.tokens" not in meta:
        raise TokenizerLoadError(f"{path}: GGUF file has no vocabulary (no tokenizer.ggml.tokens)")
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerLoadError(
            f"{path}: key tokenizer.ggml.model: GGUF tokenizer model {cut(model)} is not supported "
            "(only byte-level BPE, 'gpt2'); load the model's tokenizer.json instead"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in GGUF_PRE:
        raise TokenizerLoadError(
            f"{path}: key tokenizer.ggml.pre: GGUF pre-tokenizer {cut(pre)} is not known to recon "
            f"(known: {', '.join(sorted(GGUF_PRE))}); load the model's tokenizer.json instead"
        )
    tokens, types, merges, role_ids = _gguf_vocabulary(meta, path)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    try:
        with native_panics_quiet():
            core = Core(models.BPE(vocab, merges, fuse_unk=False))
    except BaseException as e:  # belt and braces: _gguf_vocabulary checks what tokenizers would refuse
        if not native_failure(e):
            raise
        raise TokenizerLoadError(f"{path}: key tokenizer.ggml.merges: tokenizers refused the vocabulary ({one_line(e)})") from None
    how, regex = GGUF_PRE[pre]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=how != "split")
    if how == "digits":
        core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif how == "split":
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
        core.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    else:
        core.pre_tokenizer = byte_level
    core.decoder = decoders.ByteLevel()
    added = [AddedToken(i, tokens[i], types[i] == CONTROL) for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)]
    core.add_tokens([CoreAddedToken(t.content, special=t.special, normalized=False) for t in added])
    roles = {role: tokens[i] for role, i in role_ids.items()}
    return core, added, roles


def _gguf_vocabulary(meta: dict, path: Path) -> tuple[list[str], list[int], list[tuple[str, str]], dict[str, int]]:
    """The header's tokens, token types, merges and role ids, each checked for type and range so
    that a malformed file is refused with the key named instead of loading a wrong vocabulary
    (or crashing inside ``tokenizers``)."""

    def fail(key: str, problem: str) -> TokenizerLoadError:
        return TokenizerLoadError(f"{path}: key tokenizer.ggml.{key}: {problem}")

    tokens = meta["tokenizer.ggml.tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise fail("tokens", f"expected an array of strings, got {_gguf_type_name(tokens)}")
    if not tokens:
        raise TokenizerLoadError(f"{path}: GGUF file has no vocabulary (tokenizer.ggml.tokens is empty)")
    first: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if not tok:
            raise fail("tokens", f"token {i} is the empty string")
        if first.setdefault(tok, i) != i:
            raise fail("tokens", f"token {cut(tok)} appears twice (ids {first[tok]} and {i})")
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        types = [1] * len(tokens)
    elif not isinstance(types, list) or not all(type(t) is int for t in types):
        raise fail("token_type", f"expected an array of integers, got {_gguf_type_name(types)}")
    elif len(types) != len(tokens):
        raise fail("token_type", f"{len(types)} types for {len(tokens)} tokens (one per token expected)")
    raw_merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(raw_merges, list) or not all(isinstance(m, str) for m in raw_merges):
        raise fail("merges", f"expected an array of strings, got {_gguf_type_name(raw_merges)}")
    merges = []
    for k, merge in enumerate(raw_merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise fail("merges", f"merge {k} is {cut(merge)}, not 'LEFT RIGHT'")
        for part in (left, right, left + right):
            if part not in first:
                raise fail("merges", f"merge {k} ({cut(merge)}): {cut(part)} is not in the vocabulary")
        merges.append((left, right))
    role_ids = {}
    for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is None:
            continue
        if type(value) is not int or not 0 <= value < len(tokens):
            raise fail(f"{key}_token_id", f"{cut(value)} is not a token id (0..{len(tokens) - 1})")
        role_ids[role] = value
    return tokens, types, merges, role_ids




def _gguf_type_name(value: object) -> str:
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value})
        return f"an array of {'/'.join(kinds) or 'nothing'}"
    return f"a {type(value).__name__}"
