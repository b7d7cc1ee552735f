"""The audit room: records are reconstructed from what an API returned, compared with the ids
the model sampled, and every mismatch gets a region and a cause.

Data flows down this list:

* :mod:`~recon.audit.profiles` — a model family's chat grammar (``profiles.yaml``), bound to a
  tokenizer by text;
* :mod:`~recon.audit.reconstruct` — API text back to ids (concat, segments, logprobs);
* :mod:`~recon.audit.classify` — where two id sequences diverge, and why;
* :mod:`~recon.audit.compare` — one row per sample: audit modes, statuses, the DataFrame API;
* :mod:`~recon.audit.engine` — the same at scale: streaming chunks over worker processes or Dask;
* :mod:`~recon.audit.tally` and :mod:`~recon.audit.stats` — counts and tables from the rows.

``from recon import audit`` gives the names most callers want (``audit.audit_records``, ...).
"""

from recon.audit.compare import (
    CAUSES,
    COLUMNS,
    METHODS,
    REGIONS,
    STATUSES,
    audit_methods,
    audit_records,
    audit_rows,
    classify,
    compare,
    describe,
    drilldown,
    mode_of,
)

__all__ = ["CAUSES", "COLUMNS", "METHODS", "REGIONS", "STATUSES", "audit_methods", "audit_records", "audit_rows",
           "classify", "compare", "describe", "drilldown", "mode_of"]
