"""Reconstruction: an API view (reasoning, content, tool calls) back to token ids.

Named methods that can run on the same record and be compared:

* ``concat``   — render the whole output as one string and encode it once, special-token text
  allowed (the seed's "Method A");
* ``segments`` — encode each piece separately (every field and every piece of grammar text)
  and put the special ids between them (the seed's "Method B");
* ``logprobs`` — the exact ids from the response's logprobs where it carries them: ``token_id``
  fields, vLLM's ``token_id:N`` tokens, or per-token ``bytes`` mapped through the vocabulary;
  lossless where the provider gives ids or true bytes; coverage reported when partial;
* ``auto``     — ``logprobs`` when they cover the output, else ``concat``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from recon.audit.profiles import BoundProfile, ParseOptions
from recon.errors import ReconError
from recon.samples.records import Record, Response

METHODS = ("concat", "segments", "logprobs", "auto")


@dataclass
class Reconstruction:
    ids: list[int] | None
    method: str
    #: logprobs: share of the response's logprob entries mapped to an id
    coverage: float | None = None
    error: str | None = None


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ReconError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def _segment_texts(bound: BoundProfile, view: Response) -> list[tuple[bool, str]]:
    """(is_special, text) for every part of the rendered output."""
    return [(part.kind == "special", part.text) for part in bound.render_parts(view)]


def _logprob_ids(bound: BoundProfile, view: Response) -> Reconstruction:
    entries = view.logprobs
    if not entries:
        return Reconstruction(None, "logprobs", 0.0, "the response has no logprobs")
    table = bound.tok.bytes_to_id
    ids: list[int | None] = []
    for e in entries:
        if e.token_id is not None:
            ids.append(e.token_id)
        elif e.bytes is not None:
            ids.append(table.get(bytes(e.bytes)))
        elif "\ufffd" not in e.token:
            ids.append(table.get(e.token.encode("utf-8")))
        else:  # text with a replacement character: the true bytes are lost
            ids.append(None)
    mapped = [i for i in ids if i is not None]
    coverage = len(mapped) / len(ids)
    if len(mapped) < len(ids):
        first = next(k for k, i in enumerate(ids) if i is None)
        return Reconstruction(None, "logprobs", coverage,
                              f"logprob entry {first} ({entries[first].token!r}) does not map to a token of the vocabulary")
    # compare as the server made its text: decoded (invalid UTF-8 -> U+FFFD), special tokens skipped
    tok, rendered = bound.tok, bound.render_parts(view)
    ended = bound.end_id is not None and mapped[-1] == bound.end_id
    text = tok.decode([i for i in mapped if i not in tok.special_ids])
    if ended or text == "".join(p.text for p in rendered if p.kind != "special"):
        return Reconstruction(mapped, "logprobs", coverage)  # the whole output
    # many APIs give logprobs for the content only: splice them in where the content goes
    if view.content and text == view.content:
        out: list[int] = []
        for part in rendered:
            if part.field == "content":
                out.extend(mapped)
            elif part.kind == "special":
                out.append(bound.special_ids[part.text])
            else:
                out.extend(tok.encode(part.text, allow_special=False))
        return Reconstruction(out, "logprobs", coverage)
    return Reconstruction(None, "logprobs", coverage, "the logprobs' text matches neither the whole output nor the content")


def reconstruct_batch(views: Sequence[Response], bound: BoundProfile, method: str = "auto",
                      guesses: Sequence[Sequence[int] | None] | None = None,
                      decoded: Sequence[str | None] | None = None) -> list[Reconstruction]:
    """Ids for each API view; a view that can't be rendered gets an error, the rest go on.
    ``guesses``: ids each view is expected to encode back to (an audit's ground truth), which
    spares encoding a rendered text that they are exactly the encoding of (same result);
    ``decoded``: each guess decoded, where the caller has it (see :meth:`Tokenizer.encode_batch`)."""
    _check_method(method)
    tok = bound.tok
    results: list[Reconstruction | None] = [None] * len(views)
    concat_jobs: list[tuple[int, str]] = []
    segment_jobs: list[tuple[int, list[tuple[bool, str]]]] = []
    for k, view in enumerate(views):
        try:
            if method in ("logprobs", "auto"):
                lp = _logprob_ids(bound, view)
                if method == "logprobs" or lp.error is None:
                    results[k] = lp
                    continue
            if method == "segments":
                segment_jobs.append((k, _segment_texts(bound, view)))
            else:
                concat_jobs.append((k, bound.render(view)))
        except ReconError as e:
            results[k] = Reconstruction(None, method, None, str(e))
    if concat_jobs:
        encoded = tok.encode_batch([text for _, text in concat_jobs],
                                   guesses=None if guesses is None else [guesses[k] for k, _ in concat_jobs],
                                   decoded=None if decoded is None else [decoded[k] for k, _ in concat_jobs])
        for (k, _), ids in zip(concat_jobs, encoded):
            results[k] = Reconstruction(ids, "concat")
    if segment_jobs:
        plain = [text for _, parts in segment_jobs for special, text in parts if not special]
        encoded = iter(tok.encode_batch(plain, allow_special=False))
        for k, parts in segment_jobs:
            ids: list[int] = []
            for special, text in parts:
                ids.extend([bound.special_ids[text]] if special else next(encoded))
            results[k] = Reconstruction(ids, "segments")
    return results  # type: ignore[return-value]


def reconstruct(view: Response, bound: BoundProfile, method: str = "auto") -> Reconstruction:
    return reconstruct_batch([view], bound, method)[0]


def view_of(record: Record, bound: BoundProfile, options: ParseOptions | None = None) -> Response:
    """The record's API view: its response, or, with only output_ids, what a server would return."""
    if record.response is not None:
        return record.response
    if record.output_ids is not None:
        return bound.parse_ids(record.output_ids, options)
    raise ReconError(f"record {record.id!r} has neither a response nor output_ids")


def reconstruct_records(records: Sequence[Record], bound: BoundProfile, method: str = "auto",
                        options: ParseOptions | None = None) -> list[Reconstruction]:
    views = [view_of(r, bound, options) for r in records]
    return reconstruct_batch(views, bound, method)
