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
        self.prompts: Counter = Counter()

    def add_prompt_counts(self, counts: Iterable[tuple[str, str, str | None, str | None]]) -> "Tally":
        """Count each record's prompt audit: (prompt source, status, cause, region)."""
        for source, status, cause, region in counts:
            self.prompts["source:" + source] += 1
            self.prompts["status:" + status] += 1
            if status == "diverged":
                self.prompts["cause:" + str(cause)] += 1
                self.prompts["region:" + str(region)] += 1
        return self

    def prompt_summary(self) -> dict[str, Any]:
        """The prompt audit's counts: where each record's prompt ids come from (``by_source``:
        the engine's, rendered from the request, none), and of the records with both the
        engine's ids and a request to render, how many agree (``exact``) and how many don't
        (``diverged``, by cause and by region)."""
        c = self.prompts

        def part(prefix: str) -> dict[str, int]:
            return {k[len(prefix):]: n for k, n in sorted(c.items()) if k.startswith(prefix) and n}

        statuses = part("status:")
        audited = statuses.get("exact", 0) + statuses.get("diverged", 0)
        return {"records": sum(statuses.values()), "by_source": part("source:"), "by_status": statuses,
                "audited": audited, "exact": statuses.get("exact", 0), "diverged": statuses.get("diverged", 0),
                "by_cause": part("cause:"), "by_region": part("region:")}

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
        self.prompts.update(other.prompts)
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
