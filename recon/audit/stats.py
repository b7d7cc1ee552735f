"""Statistics over audit rows (:func:`recon.audit.audit_records`): per dataset and overall."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from recon.audit.compare import CAUSES, STATUSES
from recon.audit.tally import Tally


def summary(frame: pd.DataFrame) -> dict[str, Any]:
    """``{"samples", "exact", "mismatched", "errors", "unverified", "exact_rate", "by_cause", "datasets": {...}}``."""
    return Tally().add(frame).summary()


def status_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Samples by dataset and status, with the exact rate (of verified samples)."""
    table = frame.pivot_table(index="dataset", columns="status", values="id", aggfunc="count", fill_value=0)
    table = table.reindex(columns=[s for s in STATUSES if s in table.columns or s in ("exact", "mismatch")], fill_value=0)
    verified = table["exact"] + table["mismatch"]
    table["exact_rate"] = (table["exact"] / verified.where(verified > 0)).round(4)
    table.loc["all"] = table.drop(columns="exact_rate").sum()
    v = table.loc["all", "exact"] + table.loc["all", "mismatch"]
    table.loc["all", "exact_rate"] = round(table.loc["all", "exact"] / v, 4) if v else float("nan")
    return table


def cause_table(frame: pd.DataFrame, *, all_causes: bool = False) -> pd.DataFrame:
    """Mismatched samples by dataset and (first) cause."""
    mism = frame[frame["status"] == "mismatch"]
    table = pd.crosstab(mism["dataset"], mism["cause"]) if len(mism) else pd.DataFrame(index=pd.Index([], name="dataset"))
    cols = [c for c in CAUSES if all_causes or c in table.columns]
    return table.reindex(columns=cols, fill_value=0)


def region_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mismatched samples by the region of their first divergence (reasoning, content, tool_call,
    end) and its cause: where in the output things go wrong, and why."""
    from recon.audit.profiles import REGIONS

    mism = frame[frame["status"] == "mismatch"]
    if not len(mism):
        return pd.DataFrame(index=pd.Index([], name="region"))
    table = pd.crosstab(mism["region"].fillna("(none)"), mism["cause"])
    rows = [r for r in (*REGIONS, "(none)") if r in table.index]
    return table.reindex(index=rows, columns=[c for c in CAUSES if c in table.columns], fill_value=0)


def all_causes_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Every divergence (not just each sample's first) by dataset and cause."""
    rows = [(d, c) for d, cs in zip(frame["dataset"], frame["causes"]) for c in (cs if isinstance(cs, list) else list(cs))]
    if not rows:
        return pd.DataFrame()
    data = pd.DataFrame(rows, columns=["dataset", "cause"])
    return pd.crosstab(data["dataset"], data["cause"]).reindex(columns=[c for c in CAUSES if c in set(data["cause"])])


def divergence_positions(frame: pd.DataFrame) -> pd.DataFrame:
    """First-divergence index (absolute and relative to the sample's length) of each mismatch."""
    mism = frame[frame["status"] == "mismatch"]
    out = mism[["id", "dataset", "cause", "first_diff", "rel_pos", "len_truth"]].reset_index(drop=True)
    return out.astype({"first_diff": "int64", "rel_pos": "float64", "len_truth": "int64"})


def top_pairs(frame: pd.DataFrame, n: int = 15) -> pd.DataFrame:
    """The most common (ground-truth piece -> reconstructed piece) pairs at the first divergence."""
    mism = frame[frame["status"] == "mismatch"]
    counts = Counter(zip(mism["truth_piece"], mism["recon_piece"], mism["cause"]))
    rows = [dict(truth_piece=t, recon_piece=r, cause=c, count=k) for (t, r, c), k in counts.most_common(n)]
    return pd.DataFrame(rows, columns=["truth_piece", "recon_piece", "cause", "count"])


def method_comparison(stacked: pd.DataFrame) -> pd.DataFrame:
    """Exact rate by dataset and method, from :func:`recon.audit.audit_methods`'s stacked rows."""
    key = "method_asked" if "method_asked" in stacked.columns else "method"
    verified = stacked[stacked["status"].isin(["exact", "mismatch", "error"])]
    table = verified.assign(exact=verified["status"] == "exact").pivot_table(
        index="dataset", columns=key, values="exact", aggfunc="mean")
    return table.round(4)


def last_tokens(frame: pd.DataFrame, tok=None, n: int = 10) -> pd.DataFrame:
    """Last ground-truth token of each sample, counted per dataset."""
    data = frame.dropna(subset=["last_id"])
    counts = data.groupby(["dataset", "last_id"]).size().rename("count").reset_index()
    counts["last_id"] = counts["last_id"].astype(int)
    if tok is not None:
        counts["piece"] = [tok.id_to_piece(i) for i in counts["last_id"]]
    counts["share"] = counts["count"] / counts.groupby("dataset")["count"].transform("sum")
    return counts.sort_values(["dataset", "count"], ascending=[True, False]).groupby("dataset").head(n).reset_index(drop=True)


def audit_prompts(records, tok, template) -> pd.DataFrame:
    """The prompt audit of ``records`` (:mod:`recon.prompts.audit`) with the chat template
    ``template`` (a :class:`~recon.prompts.template.ChatTemplate` or None): one row per record,
    ``id``, ``dataset`` and the prompt-audit columns."""
    from recon.prompts.audit import COLUMNS as PROMPT_COLUMNS
    from recon.prompts.audit import prompts_audited
    from recon.prompts.render import PromptMaker

    _, rows = prompts_audited(PromptMaker(tok, template), list(records))
    frame = pd.DataFrame(rows, columns=PROMPT_COLUMNS)
    frame.insert(0, "dataset", [r.dataset for r in records])
    frame.insert(0, "id", [r.id for r in records])
    return frame


def prompt_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Prompt-audit rows by where each prompt came from and how it compared: ``prompt_source`` ×
    ``prompt_status``, and a ``cause`` column for the divergences (``region: cause``)."""
    cause = frame["prompt_region"].fillna("-") + ": " + frame["prompt_cause"].fillna("-")
    cause = cause.where(frame["prompt_status"] == "diverged", "")
    table = (frame.assign(cause=cause).groupby(["prompt_source", "prompt_status", "cause"]).size()
             .rename("records").reset_index())
    return table.sort_values(["prompt_source", "prompt_status", "cause"]).reset_index(drop=True)
