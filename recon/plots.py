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
    """The most common last tokens of the samples (a :func:`recon.specials.last_token_histogram`)."""
    data = histogram.head(top).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(data) + 1.2))
    ax.barh([f"{p!r} ({i})" for p, i in zip(data["piece"], data["id"])], data["count"])
    ax.set_xlabel("samples ending with this token")
    ax.set_title(title or "last token of each sample")
    fig.tight_layout()
    return fig
