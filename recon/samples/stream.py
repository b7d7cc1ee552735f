"""Records streamed to a file as they are done, so a run that takes hours loses nothing when it
stops, and the same command resumes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from recon.errors import ReconError
from recon.samples.records import Record, dataset_name


class RecordStream:
    """Records appended to a JSONL file as each is done, for runs that take hours (``recon
    recover``): every line is written whole and flushed, so a run that is killed keeps every
    finished record and at most one partial last line. With ``resume``, an existing file is
    read first: its complete lines are kept (their (dataset, id) in :attr:`done`), and a partial
    or unparseable last line is cut off, so the run continues where it stopped, with no record
    twice. Without ``resume`` the file is started afresh."""

    def __init__(self, path: str | Path, *, resume: bool = False):
        self.path = Path(path)
        if self.path.suffix == ".gz":
            raise ReconError(f"{self.path}: records are streamed as plain JSONL (a killed gzip stream is "
                             "not readable to its end); gzip the file when the run is done")
        #: (dataset, id) of the records the file already held when resumed
        self.done: set[tuple[str, str]] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            self._keep_complete_lines()
        else:
            self.path.write_bytes(b"")
        self._file = open(self.path, "a", encoding="utf-8")

    def _keep_complete_lines(self) -> None:
        good = 0
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    obj = json.loads(raw) if raw.endswith(b"\n") else None
                except ValueError:
                    obj = None
                if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
                    break  # the line a killed run was writing: it and anything after go
                self.done.add((obj.get("dataset") or dataset_name(self.path), obj["id"]))
                good += len(raw)
        os.truncate(self.path, good)

    def write(self, record: Record) -> None:
        self._file.write(json.dumps(record.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
