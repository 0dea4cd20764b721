"""The controller's side of a host maintenance notice announced ahead of its deadline
(remote/supervise.py `maintenance-scheduled`): it is said, and nothing is stopped or replaced;
only the later `preemption` event (close to the deadline) starts the save-and-replace."""

from __future__ import annotations

import json
import time
from pathlib import Path

from provision.job.checkpoints import CheckpointKeeper
from provision.job.watcher import EVENT_PREFIX, Watcher
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import JobSpec


def _watcher(tmp_path: Path, said: list[str]) -> tuple[Watcher, NodeRecord]:
    node = NodeRecord(name="node-1", rank=1, address="x", private_address="x")
    inv = Inventory(name="c1", provider="gcp", nodes=[node])
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    job = JobSpec(script=str(script))
    keeper = CheckpointKeeper(inv, tmp_path / "ckpt", log=said.append)
    return Watcher(inv, job, keeper, said.append), node


def test_a_scheduled_maintenance_is_said_and_nothing_is_stopped(tmp_path: Path) -> None:
    said: list[str] = []
    watcher, node = _watcher(tmp_path, said)
    deadline = time.time() + 3600
    watcher.line(node, EVENT_PREFIX + json.dumps({
        "event": "maintenance-scheduled", "action": "TERMINATE_ON_HOST_MAINTENANCE",
        "time": "", "source": "instance/maintenance-event", "deadline": deadline,
        "save_at": deadline - 300}))
    assert watcher.poll() is None and watcher.preempted == {} and watcher.reason is None
    assert len(said) == 1 and said[0].startswith("node-1: host maintenance stops this VM at ")
    assert "(in 60 min); training goes on until 5 min before" in said[0]
    watcher.line(node, EVENT_PREFIX + json.dumps({"event": "maintenance-cleared"}))
    assert "withdrawn" in said[-1] and watcher.poll() is None
