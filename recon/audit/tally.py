"""Audit counts by dataset, status and cause, merged chunk by chunk (no pandas: the streaming
audit's workers and reader import this, and starting pandas costs more than a cold chunk)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from recon.audit.compare import CAUSES, STATUSES

if TYPE_CHECKING:
    import pandas as pd


class Tally:
    """Counts by dataset, status and cause, added chunk by chunk: a streaming audit's summary in
    constant memory."""

    def __init__(self) -> None:
        self.by_dataset: dict[str, Counter] = {}

    def add(self, rows: "pd.DataFrame | Iterable[Mapping]") -> "Tally":
        """Count audit rows (a DataFrame, or the dicts :func:`recon.audit.audit_rows` returns)."""
        if hasattr(rows, "columns"):  # a DataFrame
            return self.add_counts(zip(rows["dataset"], rows["status"], rows["cause"]))
        return self.add_counts((r["dataset"], r["status"], r["cause"]) for r in rows)

    def add_counts(self, counts: Iterable[tuple[str, str, str | None]]) -> "Tally":
        """Count (dataset, status, cause) triples, one per audited record."""
        for dataset, status, cause in counts:
            counter = self.by_dataset.setdefault(str(dataset), Counter())
            counter[status] += 1
            if status == "mismatch":
                counter["cause:" + str(cause)] += 1
        return self

    def merge(self, other: "Tally") -> "Tally":
        """Add another tally's counts (a chunk counted elsewhere)."""
        for dataset, counter in other.by_dataset.items():
            self.by_dataset.setdefault(dataset, Counter()).update(counter)
        return self

    @staticmethod
    def _counts(counter: Counter) -> dict[str, Any]:
        verified = counter["exact"] + counter["mismatch"]
        return {
            "samples": sum(counter[s] for s in STATUSES),
            "exact": counter["exact"],
            "mismatched": counter["mismatch"],
            "errors": counter["error"],
            "unverified": counter["unverified"],
            "exact_rate": round(counter["exact"] / verified, 6) if verified else None,
            "by_cause": {c: counter["cause:" + c] for c in CAUSES if counter["cause:" + c]},
        }

    def summary(self) -> dict[str, Any]:
        total = sum(self.by_dataset.values(), Counter())
        out = self._counts(total)
        out["datasets"] = {name: self._counts(c) for name, c in sorted(self.by_dataset.items())}
        return out
