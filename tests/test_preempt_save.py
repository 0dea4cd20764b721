"""After a preemption notice the controller waits for the save the notice asked for, not for
any copy (provision/job/checkpoints.py `wait_for_save`): a step saved before the notice whose
copy comes late (its copy runs every few seconds) is not that save. Found in a loaded run of
tests/integration/test_k8s_kueue.py: "the checkpoint saved after the notice is kept", then
the job resumed from step 24, the copy of the save before the notice (the notice's, step 33,
was never copied: Kueue's eviction took the pods)."""

from __future__ import annotations

import json
from pathlib import Path

from provision.job.checkpoints import CheckpointKeeper
from provision.job.watcher import EVENT_PREFIX, Watcher
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import JobSpec

SIGNAL_AT = 1_000.0  # node-1's clock as its ranks were signalled


def _keeper(tmp_path: Path, copies: list[dict[str, list[float]]]) -> CheckpointKeeper:
    """A keeper whose every sync copies the next of `copies` from node-0."""
    nodes = [NodeRecord(name=f"node-{i}", rank=i, address="x", private_address="x")
             for i in range(2)]
    keeper = CheckpointKeeper(Inventory(name="c1", provider="gcp", nodes=nodes),
                              tmp_path / "ckpt", log=lambda m: None)

    def sync(settle_s: float | None = None, **_: object) -> int:
        if not copies:
            return 0
        keeper.synced.setdefault("node-0", {}).update(copies.pop(0))
        return 1

    keeper.sync = sync  # type: ignore[method-assign,assignment]
    return keeper


def test_a_late_copy_of_an_older_save_is_not_the_notices_save(tmp_path: Path) -> None:
    late = {"step_000024.pt": [10.0, SIGNAL_AT - 2.0]}  # saved before the signal, copied after
    notice = {"step_000033.pt": [10.0, SIGNAL_AT + 1.5]}
    keeper = _keeper(tmp_path, [late, notice])
    assert keeper.wait_for_save({"node-0": SIGNAL_AT, "node-1": SIGNAL_AT}, deadline_s=30)
    assert "step_000033.pt" in keeper.synced["node-0"]  # it waited for the second copy


def test_without_a_newer_save_it_waits_out_its_deadline(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path, [{"step_000024.pt": [10.0, SIGNAL_AT - 2.0]}])
    assert not keeper.wait_for_save({"node-0": SIGNAL_AT}, deadline_s=1.5)


def test_a_node_without_a_clock_counts_for_nothing(tmp_path: Path) -> None:
    """A node that did not answer when the clocks were asked has no baseline: its copies
    are not taken for the notice's save."""
    keeper = _keeper(tmp_path, [{"step_000033.pt": [10.0, SIGNAL_AT + 1.5]}])
    assert not keeper.wait_for_save({"node-1": SIGNAL_AT}, deadline_s=1.5)


def test_the_notice_event_carries_the_node_clock_of_its_signal(tmp_path: Path) -> None:
    """remote/supervise.py says `at`; the watcher keeps it with the notice."""
    node = NodeRecord(name="node-1", rank=1, address="x", private_address="x")
    inv = Inventory(name="c1", provider="gcp", nodes=[node])
    (tmp_path / "train.py").write_text("pass\n")
    watcher = Watcher(inv, JobSpec(script=str(tmp_path / "train.py")),
                      CheckpointKeeper(inv, tmp_path / "ckpt", log=lambda m: None),
                      lambda m: None)
    watcher.line(node, EVENT_PREFIX + json.dumps({
        "event": "preemption", "action": "terminate", "signal": "SIGUSR1", "processes": 2,
        "at": SIGNAL_AT}))
    assert float(watcher.preempted["node-1"]["at"]) == SIGNAL_AT
