"""The one job-record interface (provision/job/jobrecords.py): this machine's records and a
managed run's store read the same way by `jobs`, `logs`, `cancel` and the dashboard. The
same questions are asked of both kinds, on a record of each."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.job import jobs
from provision.job.jobrecords import JobRecords
from provision.job.localrecords import LocalRecords
from provision.job.managed.client import remember
from provision.job.managed.records import JobLog
from provision.job.managed.storerecords import StoreRecords, records_for
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.jobstore import JobStore
from provision.model.spec import build_job_spec
from remote.store import open_store

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _local(name: str = "here") -> JobRecords:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=1) for r in range(2)]
    inv = Inventory(name=name, provider="docker", nodes=nodes, status="creating")
    InventoryStore().create(inv)
    rec = jobs.begin(inv, build_job_spec({}, {"script": EXAMPLE}), inv.nodes, detached=True)
    rec.state, rec.ended_at, rec.logs_saved = "succeeded", "2026-12-01T08:10:00+00:00", True
    rec.ledger = {"goodput": 0.87, "node_seconds": {"training": 87.0, "idle": 13.0}}
    for node in rec.nodes.values():
        node.set("exited", 0)
    store = JobStore()
    store.save(rec)
    for node in rec.nodes:
        store.log_path(rec, node).write_text(f"hello from {node}\n")
    return records_for(name)


def _managed(tmp_path: Path, name: str = "away") -> JobRecords:
    url = f"file://{tmp_path / 'objects'}"
    objects = open_store(url)
    objects.put_bytes(f"{name}/jobs/1/spec.json", json.dumps({"script": "train.py"}).encode())
    log = JobLog(objects, name, "1")
    log.record("submitted", "handed over")
    log.record("started", "running on 2 node(s)")
    log.write("[node-0] hello from node-0\n[node-1] hello from node-1\n")
    log.flush()
    log.record("ledger", "node-hours: provisioning 0.01 (10%), training 0.02 (87%), idle 0.00 (3%)")
    log.record("finished", "job finished", exit_code=0)
    log.close()
    remember(name, url)  # as `attach --store URL` does
    return records_for(name)


@pytest.fixture(params=["local", "store"])
def records(request: pytest.FixtureRequest, mgpu_home: Path, tmp_path: Path) -> JobRecords:
    return _local() if request.param == "local" else _managed(tmp_path)


def test_records_for_picks_the_kind_the_cluster_has(mgpu_home: Path, tmp_path: Path) -> None:
    assert type(_local()) is LocalRecords
    assert type(_managed(tmp_path)) is StoreRecords


def test_every_reader_question_has_the_same_answer_shape(records: JobRecords) -> None:
    [job] = records.list()
    assert (job.id, job.state, job.exit_code, job.final) == ("1", "succeeded", 0, True)
    assert records.resolve(None) == "1" and records.get("1").state == "succeeded"
    assert job.exit_text() in ("0,0", "0") and job.duration_s() is not None
    out = io.StringIO()
    shown = records.logs("1", out, follow=True, node=1)
    assert out.getvalue().splitlines() == ["[node-1] hello from node-1"]
    assert shown.complete and shown.job is not None and shown.job.exit_code == 0
    with pytest.raises(Exception, match="7"):
        records.resolve("7")


def test_jobs_prints_one_table_for_both_kinds(records: JobRecords) -> None:
    res = CliRunner().invoke(app, ["jobs", records.cluster], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    header, row = res.output.splitlines()[:2]
    assert header.split() == ["ID", "STATE", "STARTED", "DURATION", "RESTARTS", "EXIT",
                              "GOODPUT", "COMMAND"]
    assert row.split()[:2] == ["1", "succeeded"] and "train" in row
    assert " 87% " in row  # the run's ledger: its training share of node-seconds
    listed = CliRunner().invoke(app, ["jobs", records.cluster, "--json"])
    assert json.loads(listed.output)[0]["state"] == "succeeded"
    logs = CliRunner().invoke(app, ["logs", records.cluster, "--follow"])
    assert logs.exit_code == 0 and "[node-0] hello from node-0" in logs.output
