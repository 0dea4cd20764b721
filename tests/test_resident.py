"""provision/job/resident.py and job/following.py's part of resident restarts (issue 44),
without nodes: what the ranks' lines tell, when a lost node takes the full relaunch instead
(each rule on its own), how a newcomer's command looks, and how `follow` starts it. The
real thing on docker nodes: tests/integration/test_resident.py."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from provision.cluster.providers import get_provider
from provision.job import following, resident
from provision.job.launch import Join, node_command, resident_port
from provision.job.resident import Rejoin, ResidentRanks
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_job_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "train_resident.py")


def _inv() -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"10.0.0.{r + 1}", slots=2) for r in range(2)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def line(phase: str, rank: int, gen: int = 0, world: int = 4) -> str:
    return "MGPU-EVENT " + json.dumps({"event": "resident", "phase": phase, "gen": gen,
                                       "rank": rank, "world": world, "pid": 100 + rank})


def _fed() -> ResidentRanks:
    ranks = ResidentRanks()
    for node, rank in (("node-0", 0), ("node-0", 1), ("node-1", 2), ("node-1", 3)):
        ranks.feed(node, line("formed", rank))
    return ranks


def test_the_ranks_lines_tell_the_world_each_nodes_ranks_and_who_waits() -> None:
    ranks = ResidentRanks()
    assert ranks.missing() == "the script does not use remote.resident.run"
    ranks.feed("node-0", line("formed", 0))
    assert ranks.missing() == "3 of 4 rank(s) did not say they run remote.resident.run"
    said: list[str] = []
    ranks.say = said.append
    for noise in ("MGPU-EVENT {not json", 'MGPU-EVENT {"event": "resident", "rank": "1"}',
                  'MGPU-EVENT {"event": "preemption", "resident": 1}', "resident rank 1",
                  'MGPU-EVENT {"event": "resident", "phase": "formed", "gen": 0, "rank": -1, '
                  '"world": 4}'):
        ranks.feed("node-0", noise)
    assert ranks.world == 4 and ranks.ranks == {"node-0": {0}}  # as before the noise
    assert len(said) == 2 and all(s.startswith("node-0 sent an unreadable resident event (")
                                  for s in said), said  # the two that say they are resident
    ranks = _fed()
    assert ranks.missing() is None and ranks.ranks == {"node-0": {0, 1}, "node-1": {2, 3}}
    ranks.feed("node-0", line("interrupted", 0, gen=1))  # not this generation's
    assert ranks.stopped(["node-0"], 0.0) == [0, 1]
    ranks.feed("node-0", line("interrupted", 0))
    ranks.feed("node-0", line("interrupted", 1))
    assert ranks.stopped(["node-0"], 0.0) == [] and ranks.oldest_wait() is not None
    assert ranks.next_generation() == 1 and ranks.oldest_wait() is None
    ranks.feed("node-9", line("formed", 2, gen=1))  # a newcomer under another name
    assert ranks.ranks["node-1"] == {3} and ranks.ranks["node-9"] == {2}


def _rejoin(logged: list[str], restarts: int = 0, **job: Any) -> Rejoin:
    spec = build_job_spec({}, {"script": EXAMPLE, "max_restarts": 1, **job})
    run = SimpleNamespace(inv=_inv(), job=spec, provider=get_provider("docker"),
                          log=logged.append, event=lambda *a: None)
    return Rejoin(run, SimpleNamespace(keeper=None), "7", restarts, ranks=_fed())


@pytest.mark.parametrize(("job", "restarts", "why"), [
    ({"launcher": "deepspeed"}, 0, "the deepspeed launcher has no resident restarts"),
    ({"rdzv": True}, 0, "the torchrun launcher with --rdzv has no resident restarts"),
    ({"on_node_loss": "restart"}, 0, "--on-node-loss restart: lost nodes are not replaced"),
    ({"min_nodes": 1}, 0, "--min-nodes may go on without the node"),
    ({}, 1, "no restart left (--max-restarts 1)"),
])
def test_each_rule_alone_sends_a_loss_to_the_full_relaunch(job: dict[str, Any], restarts: int,
                                                          why: str) -> None:
    logged: list[str] = []
    rejoin = _rejoin(logged, restarts, **job)
    assert rejoin.lost([rejoin.run.inv.nodes[1]], _no_start) is None
    assert logged == [f"node-1 lost; full relaunch: {why}"], logged


def test_a_provider_that_cannot_replace_sends_a_loss_to_the_full_relaunch() -> None:
    logged: list[str] = []
    rejoin = _rejoin(logged)
    rejoin.run.provider = get_provider("ssh")
    rejoin.run.inv.provider = "ssh"
    assert rejoin.lost([rejoin.run.inv.nodes[1]], _no_start) is None
    assert logged == ["node-1 lost; full relaunch: the ssh provider cannot replace a node"]


def test_ranks_that_do_not_stop_send_a_loss_to_the_full_relaunch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_nodes import FakeConnector

    fake = FakeConnector()
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    monkeypatch.setattr(resident, "STOP_WAIT_S", 0.2)
    logged: list[str] = []
    rejoin = _rejoin(logged)
    rejoin.ranks.feed("node-0", line("interrupted", 0))  # rank 1 is still in its collective
    assert rejoin.lost([rejoin.run.inv.nodes[1]], _no_start) is None
    assert logged == ["node-1 lost; full relaunch: rank(s) [1] did not stop within 0 s"]
    # first, the other node was told its generation is over: cut every node's connections
    assert [c for c in fake.commands("node-0") if "resident reform" in c] == [
        "python3 .mgpu-cloud/remote.pyz resident reform --dir .mgpu-cloud/jobs/7 --gen 0 "
        "--cut 10.0.0.1 10.0.0.2"], fake.commands("node-0")
    assert fake.commands("node-1") == []


def test_a_loss_after_the_kept_nodes_ranks_ended_is_said_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node lost after the last step (the ranks said done): no rank of the kept node will
    stop on it, and the full relaunch says so at once instead of waiting STOP_WAIT_S for them
    (a repro of CI stop 53's kill that came after the end waited 30 s)."""
    from fake_nodes import FakeConnector

    class Clock:  # the wait's clock: a wait that is not cut short runs out at once here
        now = 0.0

        def monotonic(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds

    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: FakeConnector())
    monkeypatch.setattr(resident, "time", Clock())
    logged: list[str] = []
    rejoin = _rejoin(logged)
    rejoin.ranks.feed("node-0", line("done", 1, gen=1))  # not this generation's
    rejoin.ranks.feed("node-0", line("interrupted", 0))
    assert rejoin.ranks.stopped(["node-0"], 60.0) == [1] and resident.time.now >= 60.0
    rejoin.ranks.feed("node-0", line("done", 1))
    assert rejoin.lost([rejoin.run.inv.nodes[1]], _no_start) is None
    assert logged == ["node-1 lost; full relaunch: rank(s) [1] had ended their training "
                      "(done)"], logged
    assert resident.time.now < 60.0 + resident.STOP_WAIT_S, "it did not wait for them"


def test_stopped_ranks_and_no_lost_node_is_a_crash_after_the_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rejoin = _rejoin([])
    assert rejoin.stalled() is None
    rejoin.ranks.feed("node-0", line("interrupted", 0))
    assert rejoin.stalled() is None  # a lost node may still be found
    monkeypatch.setattr(resident, "GRACE_S", 0.0)
    assert "a rank crash (full relaunch)" in str(rejoin.stalled())
    rejoin.busy = True
    assert rejoin.stalled() is None, "not while a node is being replaced"


def test_a_newcomers_command_joins_or_starts_alone() -> None:
    inv = _inv()
    job = build_job_spec({}, {"script": EXAMPLE, "master_port": 29500})
    plain = node_command(inv, job, inv.nodes[1], job_id="7")
    assert "MGPU_RESIDENT_DIR=" in plain and "/jobs/7" in plain
    assert f"MGPU_RESIDENT_PORT={resident_port(job)}" in plain and resident_port(job) == 29501
    assert "MGPU_RESIDENT_GEN" not in plain
    joined = node_command(inv, job, inv.nodes[1], job_id="7",
                          join=Join(2, "10.0.0.1", 2, 4, alone=False))
    for word in ("MGPU_RESIDENT_GEN=2", "MGPU_RESIDENT_MASTER=10.0.0.1",
                 "MGPU_RESIDENT_BASE=2", "MGPU_RESIDENT_WORLD=4", "--node_rank 1",
                 "--run_path --start_method fork", "/remote.pyz script -- "):
        assert word in joined, joined  # its ranks forked from the agent: torch imported once
    assert "MGPU_RESIDENT_GEN" not in plain and "MGPU_NODE_RANK" not in joined
    alone = node_command(inv, job, inv.nodes[0], job_id="7",
                         join=Join(1, "10.0.0.1", 0, 4, alone=True))
    assert "torchrun --standalone --nnodes 1 --nproc_per_node 2 --run_path --start_method " \
        "fork" in alone
    assert "--master_addr" not in alone
    ds = build_job_spec({}, {"script": EXAMPLE, "launcher": "deepspeed"})
    assert "MGPU_RESIDENT" not in node_command(inv, ds, inv.nodes[0], job_id="7")
    top = build_job_spec({}, {"script": EXAMPLE, "master_port": 65535})
    assert resident_port(top) == 65534


def _no_start(node: NodeRecord, command: str) -> Future[int]:
    raise AssertionError("no newcomer is started")


class _FakeRejoin:
    def __init__(self, answer: list[tuple[NodeRecord, str]] | None) -> None:
        self.answer, self.asked = answer, list[list[str]]()

    def lost(self, nodes: list[NodeRecord],
             start: following.Starter) -> dict[Future[int], NodeRecord] | None:
        self.asked.append([n.name for n in nodes])
        return None if self.answer is None else {start(n, c): n for n, c in self.answer}

    def gone(self, running: list[NodeRecord]) -> list[NodeRecord]:
        return []

    def stalled(self) -> str | None:
        return None


def _done(code: int, after: float = 0.0) -> Future[int]:
    fut: Future[int] = Future()
    if after:
        import threading

        threading.Timer(after, lambda: fut.set_result(code)).start()
    else:
        fut.set_result(code)
    return fut


def test_follow_starts_the_newcomer_and_the_others_go_on() -> None:
    inv = _inv()
    started: list[tuple[str, str]] = []
    rejoin = _FakeRejoin([(inv.nodes[1], "NEWCOMER")])
    stopper = SimpleNamespace(layout=None, run=lambda *a, **k: pytest.fail("nothing stops"))

    def start(node: NodeRecord, command: str) -> Future[int]:
        started.append((node.name, command))
        return _done(0, after=0.3)

    import threading

    futures = {_done(0, after=0.6): inv.nodes[0], _done(following.SESSION_LOST): inv.nodes[1]}
    t0 = time.monotonic()
    code = following.follow(futures, stopper, print, None, None, threading.Event(),  # type: ignore[arg-type]
                            rejoin, start)
    assert code == 0 and rejoin.asked == [["node-1"]] and started == [("node-1", "NEWCOMER")]
    assert time.monotonic() - t0 >= 0.5, "it waited for the newcomer and node-0"


def test_follow_without_a_newcomer_stops_the_others_as_before() -> None:
    inv = _inv()
    stops: list[list[str]] = []
    rejoin = _FakeRejoin(None)
    layout = SimpleNamespace(remote_command=lambda *w: " ".join(w), pidfile="p")
    node_0: Future[int] = Future()  # its launcher ends (143) once it is stopped, not before

    def stop(cmd: str, nodes: list[NodeRecord] | None = None, timeout: float | None = None
             ) -> None:
        stops.append([n.name for n in nodes or []])
        if not node_0.done():
            node_0.set_result(143)

    stopper = SimpleNamespace(layout=layout, run=stop)
    import threading

    futures = {node_0: inv.nodes[0], _done(following.SESSION_LOST): inv.nodes[1]}
    code = following.follow(futures, stopper, print, None, None, threading.Event(),  # type: ignore[arg-type]
                            rejoin, lambda n, c: pytest.fail("no newcomer"))
    assert code == following.SESSION_LOST and rejoin.asked == [["node-1"]]
    assert stops == [["node-0"]]


def test_a_failed_attempt_asks_every_node_at_once_whether_it_is_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """classify's question (issue 44, flat in N): the provider and a fresh login for every
    node at once, not one after the other (the barrier breaks unless all calls overlap)."""
    import threading

    from fake_nodes import FakeConnector

    from provision.job.recovery import _lost

    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"10.0.0.{r + 1}", slots=2) for r in range(6)]
    inv = Inventory(name="demo", provider="docker", nodes=nodes, status="ready")
    together = threading.Barrier(5, timeout=10)  # node-0 is known gone: not asked
    provider = get_provider("docker")

    def alive(inv: Inventory, node: NodeRecord) -> bool:
        together.wait()
        return node.name != "node-3"  # the provider is sure node-3 is gone

    monkeypatch.setattr(provider, "node_alive", alive)
    fake = FakeConnector()
    fake.unreachable("node-5")  # a login fails
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    monkeypatch.setattr("provision.job.recovery.REACHABLE_DEADLINE_S", 0.5)
    lost = _lost(provider, inv, frozenset({"node-0"}))
    assert [n.name for n in lost] == ["node-0", "node-3", "node-5"]
    assert sorted(set(fake.connected)) == ["node-1", "node-2", "node-4", "node-5"]
