"""Matplotlib figures for the notebooks. Each figure is drawn from a small table that a
``*_data`` function returns, so tests check the numbers a plot shows, not its pixels."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

CHECK_ORDER = ["match", "undeclared", "filled", "not_in_config", "mismatch", "missing"]
CHECK_COLOURS = {
    "match": "tab:green", "undeclared": "tab:blue", "filled": "lightgrey",
    "not_in_config": "tab:orange", "mismatch": "tab:red", "missing": "black",
}


def specials_overview_data(table: pd.DataFrame) -> pd.DataFrame:
    """Added tokens counted by config check and round-trip: the bars of :func:`specials_overview`."""
    counts = (
        table.assign(roundtrip=table["roundtrip"].map({True: "round-trips", False: "fails"}))
        .groupby(["config_check", "roundtrip"]).size().unstack(fill_value=0)
    )
    counts = counts.reindex(columns=["round-trips", "fails"], fill_value=0)
    order = [c for c in CHECK_ORDER if c in counts.index]
    return counts.loc[order]


def specials_overview(table: pd.DataFrame, title: str = ""):
    """Left: where the added tokens sit on the id axis, coloured by config check (gaps show).
    Right: how many round-trip, per config check."""
    fig, (ids_ax, bars_ax) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [3, 2]})
    for check, group in table.groupby("config_check"):
        ids_ax.scatter(group["id"], [0] * len(group), marker="|", s=400, label=f"{check} ({len(group)})",
                       color=CHECK_COLOURS.get(check, "tab:purple"))
    ids_ax.set_yticks([])
    ids_ax.set_xlabel("token id")
    ids_ax.set_title("added tokens on the id axis")
    ids_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize="small", frameon=False)
    data = specials_overview_data(table)
    data.plot.barh(stacked=True, ax=bars_ax, color={"round-trips": "tab:green", "fails": "tab:red"})
    bars_ax.set_xlabel("added tokens")
    bars_ax.set_ylabel("")
    bars_ax.set_title("decode/encode round-trip")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def last_tokens(histogram: pd.DataFrame, top: int = 10, title: str = ""):
    """The most common last tokens of the samples (a :func:`recon.tokenizers.specials.last_token_histogram`)."""
    data = histogram.head(top).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(data) + 1.2))
    ax.barh([f"{p!r} ({i})" for p, i in zip(data["piece"], data["id"])], data["count"])
    ax.set_xlabel("samples ending with this token")
    ax.set_title(title or "last token of each sample")
    fig.tight_layout()
    return fig


# -- audit figures (data from recon.audit.stats) ------------------------------------------------------------------
CAUSE_COLOURS = {
    "non_canonical_bpe": "tab:blue", "invalid_utf8": "tab:orange", "special_text_collision": "tab:purple",
    "special_token_mismatch": "tab:red", "whitespace_trim": "tab:olive", "tool_call_format": "tab:cyan",
    "missing_end_token": "tab:brown", "other": "tab:gray",
}


def exact_rates(status: pd.DataFrame, title: str = "exact round-trip rate"):
    """Exact rate per dataset (a :func:`recon.audit.stats.status_table`)."""
    data = status.drop(index="all", errors="ignore")["exact_rate"]
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(data) + 1.3))
    ax.barh(list(map(str, data.index)), data.values, color="tab:green")
    for y, v in enumerate(data.values):
        ax.text(v, y, f" {v:.1%}", va="center")
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("share of verified samples reconstructed exactly")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def causes(table: pd.DataFrame, title: str = "mismatches by cause"):
    """Stacked bars of mismatches per dataset by cause (a :func:`recon.audit.stats.cause_table`)."""
    fig, ax = plt.subplots(figsize=(7, 0.45 * max(len(table), 1) + 1.5))
    if len(table) and table.values.sum():
        table.plot.barh(stacked=True, ax=ax, color=[CAUSE_COLOURS.get(c, "tab:pink") for c in table.columns])
        ax.legend(fontsize="small", loc="lower right")
    ax.set_xlabel("mismatched samples")
    ax.set_ylabel("")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def divergence_positions(positions: pd.DataFrame, title: str = "where samples first diverge"):
    """Histograms of the first divergence, absolute and relative (a :func:`recon.audit.stats.divergence_positions`)."""
    fig, (abs_ax, rel_ax) = plt.subplots(1, 2, figsize=(11, 3.2))
    for name, group in positions.groupby("dataset"):
        abs_ax.hist(group["first_diff"], bins=20, alpha=0.6, label=str(name))
        rel_ax.hist(group["rel_pos"], bins=20, range=(0, 1), alpha=0.6, label=str(name))
    abs_ax.set_xlabel("token index of the first divergence")
    rel_ax.set_xlabel("relative position (index / sample length)")
    for ax in (abs_ax, rel_ax):
        ax.set_ylabel("samples")
        if len(positions):
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def method_comparison(table: pd.DataFrame, title: str = "exact rate by reconstruction method"):
    """Grouped bars: exact rate per dataset and method (a :func:`recon.audit.stats.method_comparison`)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    table.plot.bar(ax=ax, rot=0)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("exact rate")
    ax.set_xlabel("")
    ax.set_title(title)
    ax.legend(fontsize="small", title="method")
    fig.tight_layout()
    return fig
