"""Resident restarts on real docker nodes (issue 44): a killed node is replaced while the other
node's ranks keep their processes (same PIDs) and go on from the restored checkpoint with the
newcomer; node 0's loss moves the ranks' store to its newcomer. The full relaunch of a script
that does not opt in is tests/integration/test_recovery.py's killed-node test."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import runkit
from runkit import Run

from provision.model.jobstore import JobStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_resident.py")
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]
ENTRY = re.compile(r"\[(node-\d)\] rank (\d)/4 on \S+: pid=(\d+) generation=(\d)")


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from runkit.cluster_name("rs-", request)


def _entries(out: str) -> list[tuple[str, int, int, int]]:
    """(node, rank, pid, generation) of every entry into the training function."""
    return [(m[1], int(m[2]), int(m[3]), int(m[4])) for m in ENTRY.finditer(out)]


def _resident_run(tmp_path: Path, name: str, kill: str, *more: str,
                  before: list[str] | None = None) -> str:
    """`before`: a command run (check=True) just before the kill. The first generation holds
    at its last step: the kill cannot come after the job's end (CI stop 53: on a busy
    machine the first kept checkpoint was said after it, and the loss took the relaunch)."""
    run = Run(name, ["--nodes", "2", "--max-restarts", "1", *more, EXAMPLE, "--steps", "60",
                     "--save-every", "5", "--sleep", "0.2", "--log-every", "5",
                     "--hold-once-at-step", "59"], tmp_path)
    run.wait_for(r"kept checkpoint from node-0: .*step_0000(09|14)")
    if before is not None:
        subprocess.run(before, check=True, capture_output=True)
    subprocess.run(["docker", "kill", f"{name}-{kill}"], check=True, capture_output=True)
    code = run.finish()
    assert code == 0, run.output
    return run.output


def test_a_killed_node_is_replaced_and_the_other_nodes_processes_go_on(
        tmp_path: Path, cluster_name: str) -> None:
    out = _resident_run(tmp_path, cluster_name, "node-1")
    entries = _entries(out)
    first = {(n, r): pid for n, r, pid, g in entries if g == 0}
    again = {(n, r): pid for n, r, pid, g in entries if g == 1}
    assert sorted(first) == sorted(again) == [("node-0", 0), ("node-0", 1), ("node-1", 2),
                                              ("node-1", 3)], out
    assert all(again[("node-0", r)] == first[("node-0", r)] for r in (0, 1)), \
        "node-0's ranks kept their processes"
    assert "node-1 lost: the ranks of node-0 keep their processes (resident restart)" in out
    assert re.search(r"resident restart 1 of 1: node-1 replaced in [\d.]+ s; 1 node\(s\) kept "
                     r"their processes; generation 1", out), out
    assert "full relaunch" not in out and "job 2" not in out, "no second attempt"
    resumed = re.search(r"\[node-0\] resumed from step (\d+) .*generation 1", out)
    assert resumed and int(resumed.group(1)) >= 9, out
    assert "[node-0] done: world_size=4" in out
    kept = tmp_path / "mgpu-outputs" / cluster_name / "checkpoints"
    assert sorted(kept.glob("step_*.pt"))[-1].name == "step_000059.pt"
    store = JobStore()  # this test's MGPU_CLOUD_HOME (conftest), as the run's
    rec = store.load(cluster_name, store.ids(cluster_name)[-1])
    assert rec.state == "succeeded" and len(rec.resident_restarts) == 1, rec


def test_node_0_lost_its_newcomer_hosts_the_ranks_store(tmp_path: Path,
                                                        cluster_name: str) -> None:
    out = _resident_run(tmp_path, cluster_name, "node-0")
    entries = _entries(out)
    first = {(n, r): pid for n, r, pid, g in entries if g == 0}
    again = {(n, r): pid for n, r, pid, g in entries if g == 1}
    # node-0's ranks enter again in its newcomer, a new container (their pids prove nothing:
    # a fresh pid namespace that starts the same processes in the same order repeats them)
    assert sorted(again) == sorted(first) == [("node-0", 0), ("node-0", 1), ("node-1", 2),
                                              ("node-1", 3)], out  # first: CI said no more
    assert all(again[("node-1", r)] == first[("node-1", r)] for r in (2, 3)), out
    assert "resident restart 1 of 1: node-0 replaced" in out, out
    assert re.search(r"\[node-0\] resumed from step \d+ .*generation 1", out), out
    assert "[node-0] done: world_size=4" in out


def test_with_a_warm_spare_the_lost_ranks_newcomer_is_the_spare(tmp_path: Path,
                                                                cluster_name: str) -> None:
    """Both parts of issue 44 together: the rank moves to the warm spare (no provisioning),
    and only the spare's processes start (node-0's keep theirs)."""
    out = _resident_run(tmp_path, cluster_name, "node-1", "--spares", "1")
    assert "node-1: its rank moves to the warm spare node-2 (node lost)" in out, out
    # the spare's launcher was started with the job and imported torch: the word ran it
    assert "node-1: the launcher waiting warm on node-2 takes its rank" in out, out
    assert "warm launcher" not in out and "starting it cold" not in out, out
    assert "resident restart 1 of 1: node-1 replaced" in out, out
    entries = _entries(out)
    first = {(n, r): pid for n, r, pid, g in entries if g == 0}
    again = {(n, r): pid for n, r, pid, g in entries if g == 1}
    # the rank keeps its node's name (node-1) on the spare's machine (hostname node-2)
    assert sorted(again) == [("node-0", 0), ("node-0", 1), ("node-1", 2), ("node-1", 3)], out
    assert re.search(r"\[node-1\] rank 2/4 on node-2: pid=\d+ generation=1", out), out
    assert all(again[("node-0", r)] == first[("node-0", r)] for r in (0, 1)), out
    assert "[node-0] done: world_size=4" in out


def test_a_spare_whose_warm_launcher_ended_takes_the_rank_cold(tmp_path: Path,
                                                               cluster_name: str) -> None:
    """The spare's waiting launcher killed before the loss (an OOM, a user's pkill): said,
    and the newcomer starts cold under the same job id (the ended launcher's folder moved
    aside on the spare, else `job start` finds it taken), and the run ends well."""
    spare = f"{cluster_name}-node-2"
    out = _resident_run(tmp_path, cluster_name, "node-1", "--spares", "1", before=[
        "docker", "exec", spare, "pkill", "-KILL", "-f", "remote.pyz warm wait"])
    assert "the warm launcher on spare node-2 ended (exit" in out, out
    assert "node-1: its warm launcher did not take the rank" in out, out
    assert "starting it cold" in out and "already holds a job" not in out, out
    assert "resident restart 1 of 1: node-1 replaced" in out, out
    assert re.search(r"\[node-1\] rank 2/4 on node-2: pid=\d+ generation=1", out), out
    assert "[node-0] done: world_size=4" in out
