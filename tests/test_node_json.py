"""Every JSON a node sends is read through nodejson's typed, bounded models: a hostile answer
is "node-R sent an unreadable status" (an event, a line), never an exception that ends the
supervisor or marks the job failed. Each value below raised on the code before this.

The supervised run at the end is the whole attached path on fake nodes (test_supervision's
world): the job's own output carries `MGPU-EVENT []` and the nodes answer `job status` with
`ended: 1e300`; the run still ends 0."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_nodes import FakeConnector
from test_gate import lines, summary
from test_supervision import _job, world  # noqa: F401 - `world` is a fixture

from provision.job import jobs, lifecycle
from provision.job.attached import Attached
from provision.job.checkpoints import CheckpointKeeper
from provision.job.ends import JobEnds
from provision.job.programs import json_lines
from provision.job.watcher import EVENT_PREFIX, Watcher
from provision.model.inventory import Inventory, NodeRecord
from provision.model.nodejson import JobStatus, NodeEvent, Unreadable, read
from provision.model.spec import JobSpec
from provision.nodes import NodeGroup
from remote.jobs import END

HOSTILE_STATUS = [
    '{"1": {"state": "exited", "exit_code": 0, "ended": 1e300}}',  # OverflowError
    '{"1": {"state": "exited", "exit_code": 0, "ended": NaN}}',
    '{"1": {"state": "exited", "exit_code": 0, "ended": Infinity}}',
    '{"1": {"state": "exited", "exit_code": 1e300}}',
    '{"1": {"state": ["exited"]}}',
    '{"1": "exited"}',  # AttributeError: 'str' object has no attribute 'get'
    "[]", '"status"', "17", "null", "{", '{"1": {"state": "exited", "x": "' + "a" * (2 << 20) + '"}}',
]


def _inv(n: int = 2) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=2) for r in range(n)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


@pytest.mark.parametrize("answer", HOSTILE_STATUS)
def test_an_unreadable_status_is_said_and_counts_as_no_answer(answer: str) -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=False)
    assert rec.id == "1"
    fake = FakeConnector()
    fake.on(r"job status", node="node-0",
            stdout=json.dumps({"1": {"state": "exited", "exit_code": 0, "ended": 4e9}}))
    fake.on(r"job status", node="node-1", stdout=answer)
    said: list[str] = []
    [rec] = jobs.refresh(inv, [rec], NodeGroup(inv, connector=fake), log=said.append)
    assert rec.nodes["node-0"].state == "exited" and rec.nodes["node-0"].exit_code == 0
    assert rec.nodes["node-1"].state == "unreachable" and rec.state == "unknown"
    assert len(said) == 1 and said[0].startswith("node-1 sent an unreadable status (")
    with pytest.raises(Unreadable):
        read(JobStatus, answer)


def test_what_a_node_told_as_its_job_ended_is_read_the_same_way() -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=False)
    said: list[str] = []
    told = {"node-0": {rec.id: {"state": "exited", "exit_code": 0, "ended": 4e9}},
            "node-1": {rec.id: {"state": "exited", "exit_code": 0, "ended": 1e300}}}
    [rec] = jobs.refresh(inv, [rec], NodeGroup(inv, connector=FakeConnector()),
                         reported=told, log=said.append)
    assert rec.nodes["node-0"].state == "exited" and rec.nodes["node-1"].state == "unreachable"
    assert said == [s for s in said if s.startswith("node-1 sent an unreadable status")] != []


@pytest.mark.parametrize("event", ["[]", "{}", '{"event": []}', '"preemption"', "{",
                                   '{"event": "preemption", "deadline": 1e300}',
                                   '{"event": "maintenance-scheduled", "deadline": NaN}'])
def test_an_unreadable_event_is_an_event_of_its_own(event: str, tmp_path: Path) -> None:
    node = NodeRecord(name="node-1", rank=1, address="x", private_address="x")
    inv = Inventory(name="c1", provider="gcp", nodes=[node])
    (tmp_path / "t.py").write_text("pass\n")
    said: list[str] = []
    events: list[tuple[str, str, list[str]]] = []
    watcher = Watcher(inv, JobSpec(script=str(tmp_path / "t.py")),
                      CheckpointKeeper(inv, tmp_path / "ck", log=said.append), said.append,
                      on_event=lambda e, m, n: events.append((e, m, n)))
    watcher.line(node, EVENT_PREFIX + event)
    assert watcher.poll() is None and watcher.preempted == {} and watcher.reason is None
    assert said and said[0].startswith("node-1 sent an unreadable event (")
    assert events == [("unreadable", said[0], ["node-1"])]
    with pytest.raises(Unreadable):
        read(NodeEvent, event)


@pytest.mark.parametrize("line", [
    "[]", '{"job": "1", "state": "exited"}', '{"job": "1", "state": {"state": "exited", '
    '"ended": 1e300}}', '{"job": "1", "checkpoints": {"files": {"a": "big"}}}',
    '{"job": "1", "checkpoints": {"files": [], "now": 1.0}}', '{"job": ["1"]}'])
def test_an_unreadable_end_line_is_only_output(line: str) -> None:
    ends = JobEnds("1")
    assert ends.take("node-1", END + line) is False
    assert ends.states() == {} and ends.manifests() == {}
    good = json.dumps({"job": "1", "state": {"state": "exited", "exit_code": 0, "ended": 5.0},
                       "checkpoints": {"files": {"m.pt": [3, 4.0]}, "now": 9.0}})
    assert ends.take("node-1", END + good) is True
    assert ends.states()["node-1"]["1"]["state"] == "exited"
    assert ends.manifests() == {"node-1": ({"m.pt": [3.0, 4.0]}, 9.0)}


@pytest.mark.parametrize("manifest", ['{"files": []}', '{"files": {"a": [1]}}', "[1, 2]",
                                      '{"files": {"a": [1, 2]}, "now": 1e400}',
                                      '{"files": {"a": [-5, 2]}}', '{"incomplete": "a"}'])
def test_an_unreadable_checkpoint_manifest_is_said_and_nothing_is_copied(
        manifest: str, tmp_path: Path) -> None:
    fake = FakeConnector()
    fake.on("ckpt-manifest", node="node-1", stdout=manifest + "\n")
    said: list[str] = []
    keeper = CheckpointKeeper(_inv(), tmp_path / "ckpt", log=said.append, connector=fake)
    assert keeper.sync() == 0
    assert [s for s in said if "node-1 sent an unreadable checkpoint manifest" in s]
    assert not any("tar -czf" in c for c in fake.commands("node-1"))


@pytest.mark.parametrize("bad", [
    {"summary": "yes", "backend": "gloo"},  # a truthy string: KeyError on world_size
    {"summary": True, "world_size": "many", "max_busbw_gbps": 1.0},
    {"summary": True, "world_size": 2},
    {"pair": [0, "x"], "round": 1}, {"pair": [0, 1]}, {"pair": [0, 1, 2], "round": 1},
    {"summary": True, "world_size": 2, "max_busbw_gbps": 1e300},
])
def test_unreadable_gate_lines_are_left_out(bad: dict[str, Any]) -> None:
    from provision.job.gate.judge import evaluate

    out = lines("node-0", bad, summary(0.5, 2), {"pair": [0, 1], "round": 1,
                                                  "busbw_gbps": 0.5})
    got = json_lines(out, "node-0")
    assert [r.get("summary") for r in got] == [True, False]
    record = evaluate(_inv(), out, 0, mode="separate")  # raised KeyError/ValueError before
    assert record.world_size == 2


def test_markers_of_thousands_of_digits_are_no_markers() -> None:
    from provision.job.ledger import SAVE_COST
    from provision.job.recap import steps_of
    from provision.job.resumecheck import step_in
    from provision.job.stragglers import compute_s
    from provision.operations.dashboard.metrics import parse_step

    big = "9" * 5000  # int() refuses more than 4300 digits: ValueError in the follower
    assert step_in(f"step {big}") is None and parse_step(f"step {big}") is None
    assert steps_of([f"step {big}", f"resumed from step {big}"]) == (None, None, None)
    assert compute_s(f"compute {big}") is None and compute_s("compute_ms=12.5") == 0.0125
    assert SAVE_COST.search(f"checkpoint saved ({big} s)") is None


def test_a_supervised_run_goes_on_past_every_hostile_answer(
        world: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    from provision.cluster.pipeline import NewCluster
    from provision.model.spec import build_cluster_spec

    fake: FakeConnector = world["fake"]
    fake.on(r"job start", stream="step 1\nMGPU-EVENT []\nMGPU-EVENT {\"event\": 7}\n"
                                 f"{END}[]\nstep 2\n")
    fake.on(r"job status", stdout='{"1": {"state": "exited", "exit_code": 0, "ended": 1e300}}')
    said: list[str] = []
    out = io.StringIO()
    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            said.append(line)

    import contextlib

    with contextlib.redirect_stdout(out):
        started = lifecycle.start(NewCluster(build_cluster_spec({}, {"name": "c1", "nodes": 2}),
                                             lambda plan: True), _job(), Attached(),
                                  store=world["store"], log=log)
    assert started.code == 0, said
    assert any(s.startswith("node-0 sent an unreadable event") for s in said), said
    assert any(s.startswith("node-1 sent an unreadable status") for s in said), said
    assert world["cloud"].destroyed == ["c1"]


def test_monitor_samples_that_are_not_objects_are_no_samples() -> None:
    from provision.operations.dashboard.sampling import JsonLines
    from provision.operations.monitor import _Lines, snapshot

    inv = _inv()
    fake = FakeConnector()
    fake.on(r"monitor", node="node-0", stdout='{"cpu_pct": 5.0, "node": "node-9", "rank": 7}\n')
    fake.on(r"monitor", node="node-1", stdout="[1, 2]\n")  # dict.update raised TypeError
    rows = snapshot(NodeGroup(inv, connector=fake))
    assert rows[0] == {"node": "node-0", "rank": 0, "cpu_pct": 5.0}  # not its own name
    assert rows[1]["node"] == "node-1" and rows[1]["error"].startswith("unreadable sample")
    for sink_type in (_Lines, JsonLines):
        got: list[Any] = []
        sink = sink_type(got.append)
        sink.write('[]\n{"a": 1}\n"x"\n{' + '"b": "' + "c" * (2 << 20) + '"}\n{"d": 2}\n')
        assert got == [{"a": 1}, {"d": 2}]
