"""Tables of the prefix audit for a notebook or a script: the boundary table, the causes by region,
and one break token by token (:func:`drilldown`), recomputed from the records themselves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from recon.audit.conversations import pieces_around

if TYPE_CHECKING:
    import pandas as pd

    from recon.audit.profiles import BoundProfile
    from recon.prompts.template import ChatTemplate

#: the boundary table's columns a reader looks at first
SHOWN = ["conversation", "turn", "id", "status", "region", "cause", "first_diff", "parent_piece", "next_piece"]


def boundaries(paths: Sequence[str | Path] | str | Path, tokenizer: str, profile: str,
               template: "ChatTemplate | None", out: str | Path, **kw) -> tuple[dict, "pd.DataFrame"]:
    """Audit ``paths`` (the engine, ``recon audit``'s path) into the folder ``out``: the summary and
    the boundary table (``boundaries.parquet``)."""
    import pandas as pd

    from recon.audit.engine import Prompts, audit_files

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    rows = Path(out) / "samples.parquet"
    run = audit_files(paths, tokenizer=tokenizer, profile=profile, rows_path=rows, prompts=Prompts(template),
                      progress=False, **kw)
    return run.summary, pd.read_parquet(rows.with_name("boundaries.parquet"))


def boundary_table(table: "pd.DataFrame") -> "pd.DataFrame":
    """One row per boundary, the columns :data:`SHOWN`, ``first_diff`` as an integer (or empty)."""
    shown = table[SHOWN].astype(object)
    shown = shown.where(shown.notna(), "").reset_index(drop=True)
    import pandas as pd

    shown["first_diff"] = pd.Series([int(x) if x != "" else "" for x in shown["first_diff"]], dtype=object)
    return shown


def causes_by_region(table: "pd.DataFrame") -> "pd.DataFrame":
    """Broken boundaries counted by region (rows) and cause (columns)."""
    import pandas as pd

    broken = table[table["status"] == "broken"]
    if broken.empty:
        return pd.DataFrame()
    return pd.crosstab(broken["region"], broken["cause"])


def drilldown(records: Sequence, row: dict, bound: "BoundProfile", template: "ChatTemplate | None",
              width: int = 6) -> tuple[str, "pd.DataFrame"]:
    """One boundary token by token: a line saying where and why, and the ids and pieces of turn
    k's prompt + output against turn k+1's prompt around the first divergence. ``records``: the
    file's records (the two turns are found by id); their prompts as the audit found them."""
    import pandas as pd

    from recon.prompts.render import PromptMaker

    by_id = {(r.dataset, r.id): r for r in records}
    parent, child = by_id[(row["dataset"], row["parent_id"])], by_id[(row["dataset"], row["id"])]
    maker = PromptMaker(bound.tok, template)
    prompt, nxt = maker.prompt(parent).ids, maker.prompt(child).ids
    output = parent.output_ids
    if output is None:
        from recon.audit.reconstruct import reconstruct_records

        output = reconstruct_records([parent], bound.after_prompt_ids(prompt), "auto")[0].ids
    seq = np.asarray(list(prompt) + list(output), dtype=np.int64)
    at = int(row["first_diff"])
    tok = bound.tok
    line = (f"{row['id']} (turn {row['turn']} of {row['conversation']}) breaks at token {at} (byte "
            f"{int(row['first_diff_byte'])}): turn {row['turn'] - 1}'s {row['region']} has {tok.piece(int(seq[at]))!r} "
            f"({int(seq[at])}), turn {row['turn']}'s prompt {tok.piece(int(nxt[at]))!r} ({int(nxt[at])}): {row['cause']}"
            if at < len(seq) and at < len(nxt) else f"{row['id']}: diverges at token {at} ({row['cause']})")
    return line, pd.DataFrame(pieces_around(tok, seq, np.asarray(nxt), at, width))
