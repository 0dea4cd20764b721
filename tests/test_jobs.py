"""Job records and the controller side of jobs, through a fake transport: ids, what each node
is asked, states from the nodes' answers, logs copied when a job ends and before teardown."""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from pathlib import Path

import pytest
from fake_nodes import FakeConnector

from provision.job import jobs
from provision.job.launch import node_command, run_job
from provision.model.errors import LaunchError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_job_spec
from provision.nodes import NodeGroup

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _inv(n: int = 2) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=2) for r in range(n)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def _job(**kw: object):  # type: ignore[no-untyped-def]
    return build_job_spec({}, {"script": EXAMPLE, **kw})


def _status(**by_job: dict[str, object]) -> str:
    return json.dumps(by_job)


def test_ids_count_up_per_cluster_and_outlive_the_cluster() -> None:
    inv = _inv()
    a = jobs.begin(inv, _job(), inv.nodes, detached=True)
    b = jobs.begin(inv, _job(args=["--steps", "3"]), inv.nodes, detached=False)
    assert (a.id, b.id) == ("1", "2")
    assert b.command == "train_ddp.py --steps 3"
    later = Inventory(name="demo", provider="docker", nodes=inv.nodes,
                      created_at="2099-01-01T00:00:00+00:00")
    c = jobs.begin(later, _job(), later.nodes, detached=False)
    assert c.id == "3", "a new cluster of the same name must not reuse (and overwrite) ids"
    store = jobs.JobStore()
    assert [r.id for r in store.all("demo")] == ["1", "2", "3"]
    assert store.latest("demo").id == "3"
    assert not jobs.is_current(a, later) and jobs.is_current(c, later)


def test_node_command_attached_and_detached() -> None:
    inv = _inv()
    attached = shlex.split(node_command(inv, _job(), inv.nodes[0], job_id="4"))
    i = attached.index("job")
    assert attached[i:i + 4] == ["job", "start", "--dir", "$HOME/.mgpu-cloud/jobs/4"]
    assert "--attach" in attached and "--then" not in attached
    detached = shlex.split(node_command(inv, _job(), inv.nodes[0], job_id="4",
                                        detach=jobs.Detach(then="kill -TERM 1",
                                                           then_after_s=60)))
    assert "--attach" not in detached
    assert detached[detached.index("--then") + 1] == "kill -TERM 1"
    assert detached[detached.index("--then-after") + 1] == "60"


def test_attached_run_keeps_a_log_under_the_job_id() -> None:
    inv = _inv()
    fake = FakeConnector()
    fake.on(r"job start", stream="hello\n")
    out = io.StringIO()
    code = run_job(inv, _job(), log=lambda m: None, out=out,
                   group=NodeGroup(inv, connector=fake), job_id="9")
    assert code == 0
    assert fake.assert_ran("node-1", r"jobs/9 .*--attach")
    assert "[node-0] hello" in out.getvalue()


def test_detached_start_failing_on_one_node_cancels_all() -> None:
    inv = _inv()
    fake = FakeConnector()
    fake.on(r"job start", node="node-1", exit_code=127, stderr="python3: not found")
    rec = jobs.begin(inv, _job(), inv.nodes, detached=True)
    with pytest.raises(LaunchError) as err:
        jobs.start_detached(inv, _job(), rec, NodeGroup(inv, connector=fake), jobs.Detach())
    assert "node-1" in err.value.message and "node-0" not in err.value.message
    for node in ("node-0", "node-1"):
        fake.assert_ran(node, r"job cancel --dir .*jobs/1")
    rec = jobs.JobStore().load("demo", "1")
    assert rec.state == "failed" and rec.nodes["node-1"].state == "lost"


def test_refresh_reads_states_and_copies_logs_once_ended() -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=True)
    fake = FakeConnector()
    fake.on(r"job status", stdout=_status(**{"1": {"state": "running"}}))
    group = NodeGroup(inv, connector=fake)
    [rec] = jobs.refresh(inv, [rec], group)
    assert rec.state == "running" and not rec.logs_saved and rec.exit_code is None
    fake.on(r"job status", node="node-0",
            stdout=_status(**{"1": {"state": "exited", "exit_code": 0, "ended": 4e9}}))
    fake.on(r"job status", node="node-1",
            stdout=_status(**{"1": {"state": "exited", "exit_code": 3, "ended": 4e9 + 5}}))
    for node in ("node-0", "node-1"):
        fake.files[(node, ".mgpu-cloud/jobs/1/node.log")] = f"out of {node}\n".encode()
    [rec] = jobs.refresh(inv, [rec], group)
    assert rec.state == "failed" and rec.exit_code == 3 and rec.logs_saved
    assert rec.ended_at == "2096-10-02T07:06:45+00:00"  # the last node's end, not now
    store = jobs.JobStore()
    assert store.log_path(rec, "node-1").read_text() == "out of node-1\n"
    out = io.StringIO()
    assert jobs.print_saved_logs(store.load("demo", "1"), out) == []
    assert out.getvalue() == "[node-0] out of node-0\n[node-1] out of node-1\n"
    asked = len(fake.commands("node-0"))
    jobs.refresh(inv, [rec], group)
    assert len(fake.commands("node-0")) == asked, "a finished, saved job is not asked again"


def test_the_job_exit_code_is_the_first_failing_nodes_not_the_one_stopped_because_of_it(
) -> None:
    # node-1 failed (torchrun: 1) and `launch` stopped node-0 (143) a moment later; `launch`
    # returned 1, and the record (jobs, logs --follow) must say 1 too, not rank 0's 143
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=False)
    fake = FakeConnector()
    fake.on(r"job status", node="node-0",
            stdout=_status(**{"1": {"state": "exited", "exit_code": 143, "ended": 4e9 + 0.2}}))
    fake.on(r"job status", node="node-1",
            stdout=_status(**{"1": {"state": "exited", "exit_code": 1, "ended": 4e9}}))
    [rec] = jobs.refresh(inv, [rec], NodeGroup(inv, connector=fake))
    assert rec.state == "failed" and rec.exit_code == 1
    rec.nodes["node-0"].set("exited", 2, 4e9)  # a tie: rank order
    rec.nodes["node-1"].set("exited", 1, 4e9)
    assert rec.exit_code == 2
    rec.nodes["node-1"].set("lost", 255)  # lost, no end time: it came first
    assert rec.exit_code == 255


def test_unreachable_and_unknown_jobs() -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=True)
    fake = FakeConnector()
    fake.unreachable("node-1")
    fake.on(r"job status", stdout="{}")  # node-0 never heard of job 1
    [rec] = jobs.refresh(inv, [rec], NodeGroup(inv, connector=fake))
    assert rec.nodes["node-0"].state == "lost" and rec.nodes["node-1"].state == "unreachable"
    assert rec.state == "unknown" and not rec.final


def test_a_running_job_blocks_a_new_launch() -> None:
    inv = _inv()
    jobs.begin(inv, _job(), inv.nodes, detached=True)
    fake = FakeConnector()
    fake.on(r"job status", stdout=_status(**{"1": {"state": "running"}}))
    with pytest.raises(LaunchError) as err:
        jobs.refuse_if_busy(inv, NodeGroup(inv, connector=fake))
    assert "job 1" in err.value.message and "cancel demo 1" in (err.value.hint or "")
    fake.on(r"job status", stdout=_status(**{"1": {"state": "exited", "exit_code": 0}}))
    jobs.refuse_if_busy(inv, NodeGroup(inv, connector=fake))  # ended: no error


def test_before_teardown_saves_logs_and_marks_running_jobs_removed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=True)
    fake = FakeConnector()
    fake.on(r"job status", stdout=_status(**{"1": {"state": "running"}}))
    for node in ("node-0", "node-1"):
        fake.files[(node, ".mgpu-cloud/jobs/1/node.log")] = b"partial\n"
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    jobs.before_teardown(inv, log=lambda m: None)
    rec = jobs.JobStore().load("demo", rec.id)
    assert rec.state == "removed" and rec.logs_saved and rec.final


def test_follow_prefixes_every_node() -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=True)
    fake = FakeConnector()
    fake.on(r"job follow", stream="a\nb\n", exit_code=2)
    out = io.StringIO()
    results = jobs.follow(rec, NodeGroup(inv, connector=fake), out)
    assert {n: r.value for n, r in results.items()} == {"node-0": 2, "node-1": 2}
    assert sorted(out.getvalue().splitlines()) == ["[node-0] a", "[node-0] b", "[node-1] a",
                                                   "[node-1] b"]
    fake.assert_ran("node-0", r"job follow --dir .*jobs/1$")


def test_before_teardown_names_the_node_whose_log_is_missing_and_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from provision.model.inventory import Replacement

    inv = _inv()
    inv.replacements.append(Replacement(rank=1, old="c-old", new="c-new", reason="node lost"))
    jobs.begin(inv, _job(), inv.nodes, detached=True)
    fake = FakeConnector()
    fake.on(r"job status", stdout=_status(**{"1": {"state": "exited", "exit_code": 0}}))
    fake.files[("node-0", ".mgpu-cloud/jobs/1/node.log")] = b"fine\n"  # node-1: none
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    said: list[str] = []
    jobs.before_teardown(inv, log=said.append)
    assert len(said) == 1 and said[0].startswith(
        "job 1: the log of node-1 could not be copied before teardown ("), said
    assert said[0].endswith("; node-1 was replaced since, and the old node's log went with it")


def test_attempts_of_one_run_are_linked_and_history_is_the_whole_run() -> None:
    inv = _inv()
    first = jobs.begin(inv, _job(), inv.nodes, detached=False)
    other = jobs.begin(inv, _job(), inv.nodes, detached=False)
    second = jobs.begin(inv, _job(), inv.nodes, detached=False, parent=first)
    third = jobs.begin(inv, _job(), inv.nodes, detached=False, parent=second)
    assert (second.attempt, second.parent, third.attempt) == (2, "1", 3)
    store = jobs.JobStore()
    for rec in (first, second, third):
        assert [r.id for r in store.history(rec)] == ["1", "3", "4"]
    assert [r.id for r in store.history(other)] == ["2"]


def test_a_lost_nodes_log_is_kept_as_streamed_and_never_asked_for_again() -> None:
    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=False)
    jobs.keep_streamed(rec, ["node-1"], ["[node-0] a", "[node-1] step 3", "[node-1] step 4"])
    store = jobs.JobStore()
    kept = store.log_path(rec, "node-1").read_text().splitlines()
    assert kept[:2] == ["step 3", "step 4"] and "node-1 was lost" in kept[2]
    fake = FakeConnector()
    fake.on(r"job status", stdout=_status(**{"1": {"state": "cancelled", "exit_code": 143}}))
    fake.files[("node-0", ".mgpu-cloud/jobs/1/node.log")] = b"a\n"
    jobs.refresh(inv, [rec], NodeGroup(inv, connector=fake))
    assert fake.commands("node-1") == []  # the lost node is not asked (nor waited for)
    rec = store.load("demo", "1")
    assert rec.final and rec.logs_saved and rec.nodes["node-1"].state == "lost"
    assert store.log_path(rec, "node-1").read_text().splitlines()[0] == "step 3"


def test_logs_prints_every_attempt_of_a_run_under_a_header() -> None:
    from typer.testing import CliRunner

    from provision.cli import app

    inv = _inv()
    store = jobs.JobStore()
    first = jobs.begin(inv, _job(), inv.nodes, detached=False)
    first.failure, first.state = "node lost (node-1)", "lost"
    second = jobs.begin(inv, _job(), inv.nodes, detached=False, parent=first)
    second.state = "succeeded"
    for rec, text in ((first, "before"), (second, "after")):
        for node in rec.nodes:
            store.log_path(rec, node).write_text(f"{text} on {node}\n")
        rec.logs_saved = True
        store.save(rec)
    out = CliRunner().invoke(app, ["logs", "demo", "1", "--node", "1"])  # no cluster now
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == [
        "=== job 1, attempt 1 of 2: node lost (node-1) ===", "[node-1] before on node-1",
        "=== job 2, attempt 2 of 2 ===", "[node-1] after on node-1"]


def _end_line(job_id: str, state: dict[str, object], files: dict[str, list[float]]) -> str:
    from remote.jobs import END

    return END + json.dumps({"job": job_id, "state": state,
                             "checkpoints": {"files": files, "now": 4e9 + 9}}) + "\n"


def test_what_nodes_say_as_the_job_ends_is_not_asked_again(tmp_path: Path) -> None:
    """Each node's `job start --attach` ends with a line of the job's state and checkpoint
    manifest there (remote/jobs.py END): run_job keeps it off the output, the record gets its
    exit codes and end times, the last checkpoint copy its manifests; neither `job status`
    nor `ckpt-manifest` runs on a node that said it. A line of another job is output."""
    from provision.job.checkpoints import CheckpointKeeper
    from provision.job.ends import JobEnds

    inv = _inv()
    rec = jobs.begin(inv, _job(), inv.nodes, detached=False)
    fake = FakeConnector()
    fake.on(r"job start", node="node-0", stream="step 1\nlast words" + _end_line(
        rec.id, {"state": "exited", "exit_code": 0, "ended": 4e9}, {"model.pt": [5, 4e9 + 1]})
        .replace("MGPU", "\nMGPU", 1))
    fake.on(r"job start", node="node-1", stream=_end_line(
        "77", {"state": "exited", "exit_code": 0, "ended": 1.0}, {}) + _end_line(
        rec.id, {"state": "exited", "exit_code": 0, "ended": 4e9 + 5}, {}))
    for node in ("node-0", "node-1"):
        fake.files[(node, f".mgpu-cloud/jobs/{rec.id}/node.log")] = b"log\n"
    group = NodeGroup(inv, connector=fake)
    ends, out = JobEnds(rec.id), io.StringIO()
    assert run_job(inv, _job(), log=lambda m: None, out=out, group=group, ends=ends) == 0
    fake.assert_ran("node-0", rf"jobs/{rec.id} .*--attach")
    shown = out.getvalue()
    assert "[node-0] step 1\n" in shown and "[node-0] last words\n" in shown
    assert shown.count("MGPU-JOB-END") == 1 and '"job": "77"' in shown  # another job's: shown
    [rec] = jobs.refresh(inv, [rec], group, reported=ends.states())
    assert rec.state == "succeeded" and rec.logs_saved
    assert rec.ended_at == "2096-10-02T07:06:45+00:00"  # node-1's end, as it said
    keeper = CheckpointKeeper(inv, tmp_path / "ckpt", log=lambda m: None, connector=fake)
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        info = tarfile.TarInfo("model.pt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"12345"))
    fake.files[("node-0", "mkdir -p .mgpu-cloud/checkpoints && tar -czf - --dereference "
                          "--hard-dereference -C "
                          ".mgpu-cloud/checkpoints -- model.pt")] = packed.getvalue()
    keeper.stop(known=ends.manifests())
    assert (tmp_path / "ckpt" / "model.pt").read_bytes() == b"12345"
    for node in ("node-0", "node-1"):
        assert not any("job status" in c or "ckpt-manifest" in c for c in fake.commands(node))
    # a node that said nothing (a remote.pyz from before the line, a dropped session) is asked
    rec2 = jobs.begin(inv, _job(), inv.nodes, detached=False)
    fake.on(r"job status", stdout=_status(**{rec2.id: {"state": "exited", "exit_code": 0}}))
    told = {"node-0": {rec2.id: {"state": "exited", "exit_code": 0, "ended": 4e9}}}
    jobs.refresh(inv, [rec2], group, reported=told)
    assert not any("job status" in c for c in fake.commands("node-0"))
    fake.assert_ran("node-1", r"job status")
