"""JupyterLab widgets: a token inspector, a sample browser and a special-token explorer.

Each is a thin ipywidgets layer over :mod:`recon.notebook.views`; its output lives in ``HTML`` widgets
whose ``value`` tests read after setting an input's ``value``, as a user would type or click.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import ipywidgets as w
import pandas as pd

from recon.audit.compare import CAUSES, STATUSES
from recon.audit.profiles import REGIONS
from recon.notebook import views
from recon.samples.records import Record
from recon.tokenizers.tokenizer import Tokenizer

NONE = "(none)"


class TokenInspector:
    """Type text, see tokens: one or two tokenizers side by side, specials allowed or not, and
    given ids compared with the canonical re-encoding of their text."""

    def __init__(self, tokenizers: Mapping[str, Tokenizer], text: str = "Hello world! <|im_end|>"):
        self.tokenizers = dict(tokenizers)
        names = list(self.tokenizers)
        self.text = w.Textarea(value=text, description="text", layout=w.Layout(width="95%", height="80px"))
        self.left = w.Dropdown(options=names, value=names[0], description="tokenizer")
        self.right = w.Dropdown(options=[NONE, *names], value=names[1] if len(names) > 1 else NONE, description="beside it")
        self.allow_special = w.Checkbox(value=True, description="specials allowed")
        self.ids = w.Text(value="", description="ids", placeholder="ids to compare with the canonical encoding, e.g. 1, 2, 3")
        self.output = w.HTML()
        self.table = w.HTML()
        for control in (self.text, self.left, self.right, self.allow_special, self.ids):
            control.observe(self.refresh, names="value")
        self.widget = w.VBox([self.text, w.HBox([self.left, self.right, self.allow_special]), self.ids, self.output, self.table])
        self.refresh()

    def _column(self, name: str) -> tuple[str, pd.DataFrame]:
        tok = self.tokenizers[name]
        ids, table, spans = views.inspect_text(tok, self.text.value, allow_special=self.allow_special.value)
        return f"<h4>{name}: {len(ids)} tokens</h4>{spans}", table

    def refresh(self, _change=None) -> None:
        left_html, table = self._column(self.left.value)
        columns = [left_html]
        if self.right.value != NONE:
            columns.append(self._column(self.right.value)[0])
        html = "".join(f'<div style="flex:1;min-width:300px">{c}</div>' for c in columns)
        out = f'<div style="display:flex;gap:16px">{html}</div>'
        if self.ids.value.strip():
            try:
                out += "<h4>given ids</h4>" + views.comparison_html(self.tokenizers[self.left.value], views.parse_ids(self.ids.value))
            except (ValueError, KeyError) as e:
                out += f"<p style='color:#b91c1c'>ids: {e}</p>"
        self.output.value = out
        self.table.value = table.to_html(index=False)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


class SampleBrowser:
    """Step through audited samples: choose a dataset, filter by status, cause and region; ground truth and
    reconstruction aligned with the first divergence outlined, ids and pieces around it."""

    def __init__(self, tok: Tokenizer, records: Sequence[Record], rows: pd.DataFrame):
        if "recon_ids" not in rows.columns:
            raise ValueError("the audit rows need recon_ids: audit_records(..., keep_ids=True)")
        self.tok, self.rows = tok, rows.reset_index(drop=True)
        self.truth = {(r.dataset, r.id): r.output_ids for r in records}
        datasets = sorted(self.rows["dataset"].unique())
        self.dataset = w.Dropdown(options=[NONE, *datasets], value=NONE, description="dataset")
        self.status = w.Dropdown(options=[NONE, *STATUSES], value="mismatch" if (rows["status"] == "mismatch").any() else NONE,
                                 description="status")
        self.cause = w.Dropdown(options=[NONE, *CAUSES], value=NONE, description="cause")
        self.region = w.Dropdown(options=[NONE, *REGIONS], value=NONE, description="region")
        self.index = w.BoundedIntText(value=0, min=0, max=0, description="sample")
        self.prev, self.next = w.Button(description="◀ previous"), w.Button(description="next ▶")
        self.prev.on_click(lambda _: self.step(-1))
        self.next.on_click(lambda _: self.step(1))
        self.count = w.HTML()
        self.output = w.HTML()
        self.window = w.HTML()
        for control in (self.dataset, self.status, self.cause, self.region):
            control.observe(self._refilter, names="value")
        self.index.observe(self.refresh, names="value")
        self.widget = w.VBox([w.HBox([self.dataset, self.status, self.cause, self.region]),
                              w.HBox([self.prev, self.index, self.next, self.count]), self.output, self.window])
        self._refilter()

    @property
    def selection(self) -> pd.DataFrame:
        pick = lambda v: None if v == NONE else v  # noqa: E731
        return views.filter_rows(self.rows, dataset=pick(self.dataset.value), status=pick(self.status.value), cause=pick(self.cause.value),
                                 region=pick(self.region.value))

    def _refilter(self, _change=None) -> None:
        n = len(self.selection)
        self.index.max = max(n - 1, 0)
        if self.index.value != 0:
            self.index.value = 0  # triggers refresh
        else:
            self.refresh()

    def step(self, delta: int) -> None:
        self.index.value = min(max(self.index.value + delta, self.index.min), self.index.max)

    def refresh(self, _change=None) -> None:
        sel = self.selection
        self.count.value = f"{len(sel)} samples"
        if not len(sel):
            self.output.value, self.window.value = "<p>no sample matches</p>", ""
            return
        row = sel.iloc[min(self.index.value, len(sel) - 1)]
        truth = self.truth.get((row["dataset"], row["id"]))
        self.output.value = views.sample_html(self.tok, row, truth, row["recon_ids"])
        if row["status"] == "mismatch":
            from recon.audit.compare import drilldown

            self.window.value = drilldown(row, self.tok).to_html(index=False)
        else:
            self.window.value = ""

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


class SpecialExplorer:
    """The special-token discovery table, searchable, filterable to round-trip failures."""

    COLUMNS = ["id", "content", "special", "roles", "config_check", "roundtrip", "decoded", "encoded"]

    def __init__(self, table: pd.DataFrame):
        self.table = table
        self.search = w.Text(value="", description="search", placeholder="im_end, </think>, tool_call ...")
        self.failures = w.Checkbox(value=False, description="round-trip failures only")
        self.hide_filled = w.Checkbox(value=True, description="hide filled reserved ids")
        self.count = w.HTML()
        self.output = w.HTML()
        for control in (self.search, self.failures, self.hide_filled):
            control.observe(self.refresh, names="value")
        self.widget = w.VBox([w.HBox([self.search, self.failures, self.hide_filled]), self.count, self.output])
        self.refresh()

    @property
    def selection(self) -> pd.DataFrame:
        from recon.tokenizers import specials

        table = self.table
        if self.hide_filled.value:
            table = table[table["config_check"] != "filled"]
        if self.failures.value:
            table = table[~table["roundtrip"]]
        if self.search.value.strip():
            found = specials.find(table, self.search.value.strip(), limit=50)
            return found[["score", *self.COLUMNS]]
        return table[self.COLUMNS]

    def refresh(self, _change=None) -> None:
        sel = self.selection
        self.count.value = f"{len(sel)} of {len(self.table)} added tokens"
        self.output.value = sel.head(200).to_html(index=False)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
