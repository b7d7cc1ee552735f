"""The training-ready dataset: ids per sample with their audit status and a keep flag.

Policies (what ``keep`` means):

* ``exact-only``      — only samples whose reconstruction matched the ground truth;
* ``fallback``        — every sample with ids: the ground truth where there is one (a mismatch
  falls back to it), else the reconstruction; only errors are dropped;
* ``drop-mismatches`` — exact samples and unverifiable ones (reconstruct-only), not known-bad ones;
* ``recover``         — exact samples with their ids, and every other sample whose recovered ids
  (``meta["recover"]``, written by ``recon recover``) have at least ``min_confidence``; the rest
  are dropped. This is the policy for API text without ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from recon.errors import ReconError
from recon.samples.records import Record

if TYPE_CHECKING:
    import pandas as pd

POLICIES = ("exact-only", "fallback", "drop-mismatches", "recover")
KEEP = {
    "exact-only": {"exact"},
    "fallback": {"exact", "mismatch", "unverified"},
    "drop-mismatches": {"exact", "unverified"},
    "recover": {"exact"},  # plus samples recovered confidently
}
#: ``recover``: the default least confidence for recovered ids to be kept
MIN_CONFIDENCE = 0.9


#: what an export writes: ``table`` (one row per sample: ids, status, cause, keep) or a trainer's
#: pre-tokenized rows (one row per kept generation: ``input_ids`` = prompt + sampled ids,
#: ``loss_mask`` 0 on the prompt and 1 on the sampled ids): vLLM speculators'
#: ``prepare_data`` pass-through and SpecForge's ``data.prompts_path`` read the same two columns
FORMATS = ("table", "speculators", "specforge")


@dataclass(frozen=True)
class Policy:
    """A policy with its setting (a plain name means the default setting); picklable, so it
    travels to the audit engine's workers like the name does. ``format``: :data:`FORMATS`;
    ``max_length`` and ``min_loss_tokens``: what the trainer will cut and drop, done here so the
    export counts it (``None``: no cut)."""

    name: str
    min_confidence: float = MIN_CONFIDENCE
    format: str = "table"
    max_length: int | None = None
    min_loss_tokens: int = 1
    #: trainer formats: a multi-turn trajectory whose prefix holds at every boundary is written
    #: once, as one row (loss on every turn's sampled ids); the others' turns one row each
    trajectories: bool = False
    #: trainer rows as JSON lines made where the chunk is audited (:class:`TrainerLines`), not an
    #: Arrow table: a JSONL export's rows are long id lists, and building a table of them only to
    #: turn it back into Python lists and JSON again was half the export's cost
    lines: bool = False


def _policy(policy: "str | Policy") -> Policy:
    return policy if isinstance(policy, Policy) else Policy(policy)


def _recovered(rec: Record, min_confidence: float) -> list[int] | None:
    """The record's recovered ids when ``recon recover`` was confident enough about them."""
    found = rec.meta.get("recover") if isinstance(rec.meta, dict) else None
    ids = found.get("ids") if isinstance(found, dict) else None
    # meta comes from a file like any other field: only a list of ids and a numeric confidence count
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        return None
    conf = found.get("confidence")
    return list(ids) if type(conf) in (int, float) and conf >= min_confidence else None


COLUMNS = ["id", "dataset", "ids", "ids_source", "status", "cause", "causes", "keep"]


def check_policy(policy: "str | Policy") -> None:
    policy = _policy(policy)
    if policy.name not in KEEP:
        raise ReconError(f"unknown policy {policy.name!r}; choose one of {', '.join(POLICIES)}")
    if not 0.0 <= policy.min_confidence <= 1.0:
        raise ReconError(f"min confidence {policy.min_confidence}: expected a number from 0 to 1")
    if policy.format not in FORMATS:
        raise ReconError(f"unknown export format {policy.format!r}; choose one of {', '.join(FORMATS)}")
    if policy.max_length is not None and policy.max_length < 1:
        raise ReconError(f"max length {policy.max_length}: expected a positive number of tokens")
    if policy.min_loss_tokens < 0:
        raise ReconError(f"min loss tokens {policy.min_loss_tokens}: expected 0 or more")


def export_rows(records: Sequence[Record], rows: Iterable[Mapping], policy: "str | Policy") -> list[dict]:
    """One export row per record and its audit row (with ``recon_ids``): ``COLUMNS``."""
    check_policy(policy)
    policy = _policy(policy)
    keep = KEEP[policy.name]
    out = []
    for rec, row in zip(records, rows):
        if "recon_ids" not in row:
            raise ReconError("the audit has no recon_ids; run audit_records(..., keep_ids=True)")
        recon = row["recon_ids"]
        if rec.output_ids is not None:
            ids, source = list(rec.output_ids), "ground_truth"
        elif recon is not None:
            ids, source = list(recon), "reconstruction"
        else:
            ids, source = None, "none"
        kept = row["status"] in keep and ids is not None
        if policy.name == "recover" and not kept:
            recovered = _recovered(rec, policy.min_confidence)
            if recovered is not None:
                ids, source, kept = recovered, "recovered", True
        out.append({"id": row["id"], "dataset": row["dataset"], "ids": ids, "ids_source": source,
                    "status": row["status"], "cause": row["cause"], "causes": list(row["causes"] or []),
                    "keep": kept})
    return out


def export_table(records: Sequence[Record], audited: pd.DataFrame, policy: "str | Policy") -> pd.DataFrame:
    """One row per record: ``id, dataset, ids, ids_source, status, cause, causes, keep``."""
    check_policy(policy)
    if "recon_ids" not in audited.columns:
        raise ReconError("the audit has no recon_ids; run audit_records(..., keep_ids=True)")
    import pandas as pd

    return pd.DataFrame(export_rows(records, audited.to_dict("records"), policy), columns=COLUMNS)


#: the trainer rows' columns: the two a trainer reads, then what says where they came from
TRAINER_COLUMNS = ["id", "input_ids", "loss_mask", "dataset", "prompt_source", "ids_source", "status", "cause",
                   "prompt_tokens", "sampled_tokens", "truncated"]
#: why a sample that the policy keeps gets no trainer row
DROPS = ("no_prompt", "too_few_loss_tokens")


def trainer_rows(records: Sequence[Record], exported: Sequence[Mapping], prompts: Sequence, policy: "str | Policy") -> list[dict]:
    """One trainer row per record (:data:`TRAINER_COLUMNS`, plus ``keep`` and ``drop``: the
    writer keeps only rows with ``keep``): ``input_ids`` = the prompt's ids, then the sampled ids
    the policy chose (ground truth, recovered or reconstructed, the stop token included as
    sampled), ``loss_mask`` 0 on the prompt and 1 on exactly the sampled ids. ``prompts``: each
    record's prompt (``.ids``, ``.source``; :class:`recon.prompts.render.Prompt`), or None.

    A sample the policy drops gets no row, and neither does one without a prompt (a trainer
    shown sampled ids without what preceded them learns the wrong thing) nor one whose loss
    tokens fall below ``min_loss_tokens`` once cut to ``max_length``; ``drop`` says which."""
    policy = _policy(policy)
    out = []
    for rec, row, prompt in zip(records, exported, prompts):
        ids = row["ids"]
        prompt_ids = getattr(prompt, "ids", None)
        keep, drop = bool(row["keep"]), None
        input_ids = mask = None
        truncated = False
        if keep and prompt_ids is None:
            keep, drop = False, "no_prompt"
        if keep:
            input_ids = list(prompt_ids) + list(ids)
            mask = [0] * len(prompt_ids) + [1] * len(ids)
            if policy.max_length is not None and len(input_ids) > policy.max_length:
                input_ids, mask, truncated = input_ids[: policy.max_length], mask[: policy.max_length], True
            if sum(mask) < policy.min_loss_tokens:
                keep, drop = False, "too_few_loss_tokens"
        out.append({"id": row["id"], "input_ids": input_ids, "loss_mask": mask, "dataset": row["dataset"],
                    "prompt_source": getattr(prompt, "source", "none"), "ids_source": row["ids_source"],
                    "status": row["status"], "cause": row["cause"] or "",
                    "prompt_tokens": None if prompt_ids is None else len(prompt_ids),
                    "sampled_tokens": None if ids is None else len(ids), "truncated": truncated,
                    "keep": keep, "drop": drop})
    return out


def trajectory_row(dataset: str, conversation: str, seq: Sequence[int], spans: Sequence[tuple[int, int]],
                   prompt_source: str, turns: int, policy: "str | Policy") -> dict:
    """One trainer row for a whole trajectory (:data:`TRAINER_COLUMNS`, ``keep`` and ``drop``):
    ``input_ids`` = its last turn's prompt + sampled ids (every earlier turn's prompt and sampled
    ids are a prefix of it), ``loss_mask`` 1 on each turn's sampled ids (``spans``, [start, end)
    each) and 0 on the user, tool and template text between them. ``id``: the conversation;
    ``status``: ``trajectory``; ``cause``: how many turns."""
    policy = _policy(policy)
    input_ids = [int(i) for i in seq]
    mask = [0] * len(input_ids)
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    truncated = policy.max_length is not None and len(input_ids) > policy.max_length
    if truncated:
        input_ids, mask = input_ids[: policy.max_length], mask[: policy.max_length]
    keep = sum(mask) >= policy.min_loss_tokens
    return {"id": conversation, "input_ids": input_ids if keep else None, "loss_mask": mask if keep else None,
            "dataset": dataset, "prompt_source": prompt_source, "ids_source": "trajectory", "status": "trajectory",
            "cause": f"{turns} turns", "prompt_tokens": spans[0][0] if spans else None,
            "sampled_tokens": sum(end - start for start, end in spans), "truncated": truncated, "keep": keep,
            "drop": None if keep else "too_few_loss_tokens"}


@dataclass
class TrainerLines:
    """A chunk's trainer rows as JSON lines, one per record (None where it gets no row), and why a
    record gets none (``drop``, :data:`DROPS`; None for a row, or for a sample the policy dropped)."""

    lines: list
    drops: list

    @property
    def num_rows(self) -> int:
        return len(self.lines)

    def filter(self, mask) -> "TrainerLines":
        keep = mask.to_pylist() if hasattr(mask, "to_pylist") else list(mask)
        return TrainerLines([x for x, k in zip(self.lines, keep) if k], [d for d, k in zip(self.drops, keep) if k])


def trainer_lines(rows: list[dict]) -> TrainerLines:
    """:func:`trainer_rows` as :class:`TrainerLines` (orjson: a row of a thousand ids in microseconds)."""
    import orjson

    lines, drops = [], []
    for row in rows:
        keep, drop = row.pop("keep"), row.pop("drop")
        lines.append(orjson.dumps(row) + b"\n" if keep else None)
        drops.append(drop)
    return TrainerLines(lines, drops)


def arrow_schema(format: str = "table"):  # noqa: A002 - the export's own word
    """The rows' Arrow schema for an export ``format`` (:data:`FORMATS`), as a chunk carries them."""
    import pyarrow as pa

    if format != "table":
        return pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int8())),
                          ("dataset", pa.string()), ("prompt_source", pa.string()), ("ids_source", pa.string()),
                          ("status", pa.string()), ("cause", pa.string()), ("prompt_tokens", pa.int64()),
                          ("sampled_tokens", pa.int64()), ("truncated", pa.bool_()), ("keep", pa.bool_()),
                          ("drop", pa.string())])
    return pa.schema([("id", pa.string()), ("dataset", pa.string()), ("ids", pa.list_(pa.int64())),
                      ("ids_source", pa.string()), ("status", pa.string()), ("cause", pa.string()),
                      ("causes", pa.list_(pa.string())), ("keep", pa.bool_())])


class TableWriter:
    """Arrow tables appended to one file as they come: Parquet (``.parquet``) or JSONL (anything else)."""

    def __init__(self, path: str | Path, schema):
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix == ".parquet":
            self._parquet, self._lines = pq.ParquetWriter(self.path, schema), None
        else:
            self._parquet, self._lines = None, open(self.path, "wb")

    def write(self, table) -> None:
        """An Arrow table's rows, or a :class:`TrainerLines`' lines (JSONL only)."""
        if isinstance(table, TrainerLines):
            self._lines.write(b"".join(line for line in table.lines if line is not None))
        elif self._parquet is not None:
            self._parquet.write_table(table)
        else:
            import orjson

            self._lines.write(b"".join(orjson.dumps(row) + b"\n" for row in table.to_pylist()))

    def close(self) -> None:
        (self._parquet or self._lines).close()
