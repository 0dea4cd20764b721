"""After a preemption notice the controller waits for the save the notice asked for, not for
any copy (provision/job/checkpoints.py `wait_for_save`): a step saved before the notice whose
copy comes late (its copy runs every few seconds) is not that save. Found in a loaded run of
tests/integration/test_k8s_kueue.py: "the checkpoint saved after the notice is kept", then
the job resumed from step 24, the copy of the save before the notice (the notice's, step 33,
was never copied: Kueue's eviction took the pods)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_nodes import FakeConnector

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


def _counted(keeper: CheckpointKeeper, most: int) -> list[int]:
    """Counts the keeper's syncs; a wait that goes on past `most` of them fails at once
    (instead of waiting out a deadline of an hour)."""
    calls, real = [0], keeper.sync

    def sync(settle_s: float | None = None, **kw: object) -> int:
        calls[0] += 1
        assert calls[0] <= most, "the wait went on after it was hopeless"
        return real(settle_s, **kw)  # type: ignore[arg-type]

    keeper.sync = sync  # type: ignore[method-assign,assignment]
    return calls


def test_a_hopeless_wait_ends_after_one_last_sync(tmp_path: Path) -> None:
    """The noticed node is gone (a kubelet killed the deleted pod at its grace period's
    end): its ranks can take part in no save any more, so the wait ends after the sync
    that follows, not at its deadline (found: a held job's notice waited out 90 s)."""
    older = {"step_000024.pt": [10.0, SIGNAL_AT - 2.0]}
    keeper = _keeper(tmp_path, [older, older, older])
    calls = _counted(keeper, most=3)
    looks = iter([False, True])
    assert not keeper.wait_for_save({"node-0": SIGNAL_AT}, deadline_s=3600,
                                    hopeless=lambda: next(looks))
    assert calls[0] == 2  # one sync while there was hope, and the last one


def test_a_save_copied_by_the_last_sync_still_counts(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path, [{"step_000033.pt": [10.0, SIGNAL_AT + 1.5]}])
    assert keeper.wait_for_save({"node-0": SIGNAL_AT}, deadline_s=3600, hopeless=lambda: True)


@pytest.mark.parametrize("gone", [["node-1"], []])
def test_the_watcher_stops_waiting_once_the_noticed_node_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gone: list[str]) -> None:
    """Liveness says node-1 (noticed) is gone: the preemption path says so and goes on at
    once. While it lives, the wait is the deadline's (made 1.5 s here)."""
    import provision.job.watcher as watcher_mod

    fake = FakeConnector()
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    nodes = [NodeRecord(name=f"node-{i}", rank=i, address="x", private_address="x")
             for i in range(2)]
    inv = Inventory(name="c1", provider="gcp", nodes=nodes)
    keeper = _keeper(tmp_path, [{"step_000024.pt": [10.0, SIGNAL_AT - 2.0]}] * 8)
    calls = _counted(keeper, most=2 if gone else 8)
    monkeypatch.setattr(watcher_mod, "PREEMPT_SAVE_DEADLINE_S", 1.5)
    said: list[str] = []
    (tmp_path / "train.py").write_text("pass\n")
    watcher = Watcher(inv, JobSpec(script=str(tmp_path / "train.py")), keeper, said.append,
                      gone=lambda: list(gone))
    watcher.line(nodes[1], EVENT_PREFIX + json.dumps({
        "event": "preemption", "action": "terminate", "signal": "SIGUSR1", "processes": 2,
        "at": SIGNAL_AT}))
    assert watcher.poll() == "preemption notice on node-1"
    fake.assert_ran("node-0", r"remote\.pyz signal ")  # the other node's ranks: save too
    if gone:
        assert calls[0] == 1
        assert "no checkpoint was saved before node-1 was gone" in said[-1], said
    else:
        assert calls[0] >= 2
        assert "no checkpoint was saved within 2 s of the notice" in said[-1], said
