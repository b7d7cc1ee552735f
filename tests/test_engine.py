"""The streaming engine and Dask scale-out give the same per-sample results as the in-process audit."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from recon.audit import audit_records
from recon.audit.engine import audit_files
from recon.audit.profiles import load_profile
from recon.samples.records import read_records

from .conftest import ROOT

DATA = [ROOT / "data" / "smollm2-t0.7.jsonl", ROOT / "data" / "smollm2-t1.3.jsonl"]
ARGS = dict(tokenizer="smollm2", profile="chatml", method="concat")


@pytest.fixture(scope="module")
def in_process(tokenizers):
    records = read_records(DATA).records
    return audit_records(records, load_profile("chatml").bind(tokenizers["smollm2"]), "concat")


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a = a.reset_index(drop=True)
    b = b.reset_index(drop=True)
    assert list(a["id"]) == list(b["id"]) and list(a["status"]) == list(b["status"])
    for col in ("cause", "first_diff", "truth_piece", "recon_piece", "len_truth"):
        assert [None if pd.isna(x) else x for x in a[col]] == [None if pd.isna(x) else x for x in b[col]], col
    assert [list(x) if x is not None else [] for x in a["causes"]] == [list(x) if x is not None else [] for x in b["causes"]]


def test_streaming_in_small_chunks_is_identical(tmp_path, in_process):
    run = audit_files(DATA, **ARGS, chunk_size=37, rows_path=tmp_path / "rows.parquet", progress=False)
    streamed = pq.read_table(tmp_path / "rows.parquet").to_pandas()
    _same(in_process, streamed)
    assert run.summary["exact"] == 171 and run.summary["datasets"]["smollm2-t1.3"]["by_cause"]["invalid_utf8"] == 2
    assert pq.ParquetFile(tmp_path / "rows.parquet").metadata.num_row_groups == 9  # written chunk by chunk


def test_dask_local_cluster_with_two_worker_processes_is_identical(tmp_path, in_process):
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        run = audit_files(DATA, **ARGS, chunk_size=40, rows_path=tmp_path / "rows.parquet", client=client, progress=False)
        workers = {w["name"] for w in client.scheduler_info()["workers"].values()}
    assert len(workers) == 2
    _same(in_process, pq.read_table(tmp_path / "rows.parquet").to_pandas())
    assert run.summary == audit_files(DATA, **ARGS, chunk_size=40, progress=False).summary


def test_bad_records_are_reported_and_counted(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    good = [json.loads(line) for line in DATA[0].read_text().splitlines()[:5]]
    mixed.write_text("\n".join([json.dumps(good[0]), "{broken", json.dumps({"id": "x", "output_ids": [1, -1]}),
                                *map(json.dumps, good[1:])]) + "\n")
    run = audit_files([mixed], **ARGS, chunk_size=2, progress=False)
    assert run.summary["samples"] == 5 and [(e.line, e.field) for e in run.errors] == [(2, ""), (3, "output_ids")]


def test_two_worker_processes_are_identical(tmp_path, in_process, monkeypatch):
    from recon import engine

    pools = []
    real_pool = engine._pool
    monkeypatch.setattr(engine, "_pool", lambda n: pools.append(n) or real_pool(n))
    run = audit_files(DATA, **ARGS, chunk_size=50, rows_path=tmp_path / "rows.parquet", workers=2, progress=False)
    assert pools == [2]  # seven chunks went to a pool of two processes
    _same(in_process, pq.read_table(tmp_path / "rows.parquet").to_pandas())
    assert run.summary == audit_files(DATA, **ARGS, chunk_size=50, workers=1, progress=False).summary


def test_export_streams_through_the_engine_as_the_in_memory_export_does(tmp_path, tokenizers):
    from recon.errors import ReconError
    from recon.samples.export import export_table

    records = read_records(DATA).records
    want = export_table(records, audit_records(records, load_profile("chatml").bind(tokenizers["smollm2"]), "concat",
                                               keep_ids=True), "exact-only")
    run = audit_files(DATA, **ARGS, chunk_size=50, workers=2, export_path=tmp_path / "train.jsonl", policy="exact-only",
                      progress=False)
    got = pd.read_json(tmp_path / "train.jsonl", lines=True, dtype=False)
    assert run.kept == 171 == int(want["keep"].sum())
    for col in ("id", "ids", "ids_source", "status", "keep"):
        assert got[col].tolist() == want[col].tolist(), col
    parquet = audit_files(DATA, **ARGS, workers=1, export_path=tmp_path / "train.parquet", policy="fallback", progress=False)
    assert parquet.kept == 320 and pq.read_table(tmp_path / "train.parquet").column("keep").to_pylist() == [True] * 320
    with pytest.raises(ReconError, match="not both"):
        audit_files(DATA, **ARGS, rows_path=tmp_path / "r.parquet", export_path=tmp_path / "e.parquet", progress=False)
