"""The prefix audit inside an audit or export run: generations in, in input order, from every chunk
whichever worker audited it; the boundary table (``boundaries.parquet``) written as it grows; an
export's whole trajectories as one trainer row each.

With ``--trajectories`` an export can't know, while it streams, whether a generation's trajectory
will stay whole (a later boundary may break it), so the generation rows go to a scratch Parquet
file beside the output first; at the end they are copied to the output without the turns of
whole trajectories, and the trajectory rows follow them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from recon.audit.conversations import MEMORY_IDS, Conversations, Trajectory, arrow_schema
from recon.samples.export import Policy, TableWriter, trajectory_row

if TYPE_CHECKING:
    from recon.audit.profiles import BoundProfile

#: boundary rows written at a time
BATCH = 4096


class PrefixRun:
    """``boundaries_path``: where the boundary rows go (Parquet), or None; ``policy`` with
    ``trajectories`` set and ``export_path``: the trajectory export."""

    def __init__(self, bound: "BoundProfile", *, boundaries_path: str | Path | None = None,
                 policy: Policy | None = None, export_path: str | Path | None = None, memory_ids: int = MEMORY_IDS):
        self.policy = policy if policy is not None and policy.trajectories else None
        self._rows: list[dict] = []
        self._writer = TableWriter(boundaries_path, arrow_schema()) if boundaries_path is not None else None
        self.whole_ids: set = set()
        self.trajectory_rows = 0
        self._traj_writer = None
        if self.policy is not None:
            from recon.samples.export import arrow_schema as export_schema

            self.export_path = Path(export_path)
            self.scratch = self.export_path.with_name(self.export_path.name + ".generations.parquet")
            self.scratch_traj = self.export_path.with_name(self.export_path.name + ".trajectories.parquet")
            schema = export_schema(self.policy.format)
            self.schema = schema.remove(schema.get_field_index("drop")).remove(schema.get_field_index("keep"))
            self._traj_writer = TableWriter(self.scratch_traj, self.schema)
        self.conversations = Conversations(
            bound, on_row=self._rows.append if self._writer is not None else None,
            on_trajectory=self._trajectory if self.policy is not None else None,
            want_seq=lambda t: t.whole, memory_ids=memory_ids, paths=self.policy is not None)

    def generations_path(self, final: str | Path) -> Path:
        """Where the engine writes the generation rows (the scratch file with ``--trajectories``)."""
        return self.scratch if self.policy is not None else Path(final)

    def add(self, turns) -> None:
        if turns is None:
            return
        self.conversations.add_all(turns)
        if self._writer is not None and len(self._rows) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._rows:
            self._writer.write(pa.Table.from_pylist(self._rows, schema=arrow_schema()))
            self._rows.clear()

    def _trajectory(self, t: Trajectory) -> None:
        if not t.whole or t.seq is None:
            return
        import pyarrow as pa

        sources = set(t.sources)
        source = sources.pop() if len(sources) == 1 else "mixed"
        row = trajectory_row(t.dataset, t.conversation, t.seq, t.spans, source, t.turns, self.policy)
        if not row.pop("keep"):
            return  # too few loss tokens once cut: its turns stay generation rows
        row.pop("drop")
        self._traj_writer.write(pa.Table.from_pylist([row], schema=self.schema))
        self.whole_ids.update(t.ids)
        self.trajectory_rows += 1

    def finish(self) -> dict:
        """The summary's ``conversations`` part; with a trajectory export, the output written."""
        summary = self.conversations.finish()
        if self._writer is not None:
            self._flush()
            self._writer.close()
        if self._traj_writer is not None:
            self._traj_writer.close()
        return summary

    def write_export(self) -> tuple[int, int]:
        """Copy the generation rows not in a whole trajectory, then the trajectory rows, to the
        output; (generation rows written, trajectory rows written)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer = TableWriter(self.export_path, self.schema)
        written = 0
        try:
            for batch in pq.ParquetFile(self.scratch).iter_batches(batch_size=8192):
                table = pa.Table.from_batches([batch])
                mask = [(d, i) not in self.whole_ids for d, i in zip(table["dataset"].to_pylist(), table["id"].to_pylist())]
                table = table.filter(pa.array(mask, pa.bool_()))
                written += table.num_rows
                writer.write(table)
            for batch in pq.ParquetFile(self.scratch_traj).iter_batches(batch_size=1024):
                writer.write(pa.Table.from_batches([batch]))
        finally:
            writer.close()
            self.scratch.unlink(missing_ok=True)
            self.scratch_traj.unlink(missing_ok=True)
        return written, self.trajectory_rows
