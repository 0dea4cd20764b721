"""Two promises of the job lifecycle that only the unit tests can hold cheaply (issue 34: a
mutation of each survived the suite before):

- a launch on a cluster whose job still runs is refused before anything is synced or started
  (the `jobs.refuse_if_busy` of lifecycle.start's common steps, in every supervision mode);
- a checkpoint restore from the store that failed on any node fails the restore, naming the
  node: a job must never start from a folder a node could not fill (keeper.restore's
  `raise_for`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_nodes import FakeConnector

from provision.job import jobs, lifecycle
from provision.job.attached import Attached
from provision.job.detached import SelfStopping
from provision.job.managed.keeper import StoreKeeper
from provision.job.supervision import Supervision
from provision.model.errors import BootstrapError, LaunchError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.spec import build_job_spec
from provision.nodes import NodeGroup, group
from remote.store import parse_url

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _inv() -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=2) for r in range(2)]
    return Inventory(name="busy", provider="docker", nodes=nodes, status="ready")


@pytest.mark.parametrize("mode", [Attached(), SelfStopping()], ids=["attached", "detached"])
def test_a_launch_while_a_job_runs_is_refused_before_anything_moves(
        mode: Supervision, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    fake = FakeConnector()
    monkeypatch.setattr(group, "default_connector", lambda inv: fake)
    store = InventoryStore(tmp_path / "home")
    inv = _inv()
    store.create(inv)
    job = build_job_spec({}, {"script": EXAMPLE})
    jobs.begin(inv, job, inv.nodes, detached=True)  # job 1, started earlier
    fake.on(r"job status", stdout=json.dumps({"1": {"state": "running"}}))
    with pytest.raises(LaunchError, match="job 1 .* is still running"):
        lifecycle.start("busy", job, mode, store=store, log=lambda m: None)
    for node in ("node-0", "node-1"):
        assert fake.stdin(node) == []  # no workdir upload
        assert not any("job start" in c or "injob" in c for c in fake.commands(node))


def test_a_restore_that_failed_on_one_node_fails_and_names_it() -> None:
    inv = _inv()
    fake = FakeConnector()
    fake.on(r"store pull", stdout=json.dumps({"files": 3, "bytes": 9, "seconds": 0.1}))
    fake.on(r"store pull", node="node-1", exit_code=1,
            stderr="store pull s3://b/c: ConnectTimeoutError: no route")
    keeper = StoreKeeper(inv, parse_url("s3://b/runs/busy/data/jobs/1/checkpoints"),
                         lambda: {}, log=lambda m: None)
    with pytest.raises(BootstrapError, match="node-1") as err:
        keeper.restore(NodeGroup(inv, connector=fake))
    assert "restoring the checkpoint" in err.value.message
    fine = FakeConnector()
    fine.on(r"store pull", stdout=json.dumps({"files": 3, "bytes": 9, "seconds": 0.1}))
    assert keeper.restore(NodeGroup(inv, connector=fine)) == 3
