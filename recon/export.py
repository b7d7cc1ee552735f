"""The training-ready dataset: ids per sample with their audit status and a keep flag.

Policies (what ``keep`` means):

* ``exact-only``      — only samples whose reconstruction matched the ground truth;
* ``fallback``        — every sample with ids: the ground truth where there is one (a mismatch
  falls back to it), else the reconstruction; only errors are dropped;
* ``drop-mismatches`` — exact samples and unverifiable ones (reconstruct-only), not known-bad ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from .errors import ReconError
from .records import Record

POLICIES = ("exact-only", "fallback", "drop-mismatches")
KEEP = {
    "exact-only": {"exact"},
    "fallback": {"exact", "mismatch", "unverified"},
    "drop-mismatches": {"exact", "unverified"},
}


def export_table(records: Sequence[Record], audited: pd.DataFrame, policy: str) -> pd.DataFrame:
    """One row per record: ``id, dataset, ids, ids_source, status, cause, causes, keep``."""
    if policy not in KEEP:
        raise ReconError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if "recon_ids" not in audited.columns:
        raise ReconError("the audit has no recon_ids; run audit_records(..., keep_ids=True)")
    ids, source = [], []
    for rec, recon in zip(records, audited["recon_ids"]):
        if rec.output_ids is not None:
            ids.append(list(rec.output_ids))
            source.append("ground_truth")
        else:
            ids.append(None if recon is None else list(recon))
            source.append("reconstruction" if recon is not None else "none")
    table = pd.DataFrame({
        "id": audited["id"], "dataset": audited["dataset"], "ids": ids, "ids_source": source,
        "status": audited["status"], "cause": audited["cause"], "causes": audited["causes"],
    })
    table["keep"] = table["status"].isin(KEEP[policy]) & table["ids"].notna()
    return table


def write_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Parquet (``.parquet``) or JSONL (anything else)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        table.to_parquet(path, index=False)
    else:
        table.to_json(path, orient="records", lines=True, force_ascii=False)
    return path
