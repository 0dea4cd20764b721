"""The fabric gate for real: a 3-node docker cluster, one node's link throttled from the host
with tc's token bucket filter (this kernel has no netem; ENVIRONMENT.md), the CLI as a
separate process. One cluster for the module; the throttle is removed after each test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import unique
from kit import IN_CI, cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image"),
              pytest.mark.xdist_group("fabric_gate")]  # one cluster, tests in file order
NAME = unique("it-gate")
THROTTLE = ["tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]
JOB = 'import os\nprint(f"job ran: rank {os.environ[\'RANK\']}", flush=True)\n'


@pytest.fixture(scope="module")
def traffic_control() -> None:
    """tc (iproute2) and nsenter on the host, as root: required in CI, skipped elsewhere."""
    missing = [tool for tool in ("tc", "nsenter") if shutil.which(tool) is None]
    why = (f"missing {', '.join(missing)} (apt-get install iproute2 util-linux)" if missing
           else "" if os.geteuid() == 0 else "needs root to shape a container's link")
    if why:
        if IN_CI:
            pytest.fail(f"CI=true but the throttle cannot be applied: {why}")
        pytest.skip(why)


@contextlib.contextmanager
def throttled(container: str) -> Iterator[None]:
    """`container`'s eth0 egress limited to 20 Mbit/s (from the host, in its namespace)."""
    pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", container],
                         capture_output=True, text=True, check=True).stdout.strip()
    netns = ["nsenter", "-t", pid, "-n", "tc", "qdisc"]
    subprocess.run([*netns, "replace", "dev", "eth0", "root", *THROTTLE], check=True)
    try:
        yield
    finally:
        subprocess.run([*netns, "del", "dev", "eth0", "root"], check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, traffic_control: None) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("gate-home")
    res = cli("up", "--nodes", "3", "--name", NAME, home=home)
    assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        down = cli("down", NAME, home=home)
        assert down.returncode == 0, down.stderr


@pytest.fixture
def job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return script


def launch(home: Path, job: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return cli("launch", NAME, "--nproc-per-node", "1", *flags, "--", str(job), home=home,
               cwd=job.parent)


def gate_of(home: Path) -> dict[str, object]:
    res = cli("status", NAME, "--json", home=home)
    assert res.returncode == 0, res.stderr
    gate = json.loads(res.stdout)[0]["fabric_gate"]
    assert isinstance(gate, dict)
    return gate


def test_healthy_network_passes_and_the_job_runs(cluster: Path, job: Path) -> None:
    res = launch(cluster, job, "--fabric-check", "on")
    assert res.returncode == 0, res.stderr
    assert "fabric gate: pass" in res.stderr
    assert sorted(line for line in res.stdout.splitlines() if "job ran" in line) == [
        f"[node-{r}] job ran: rank {r}" for r in range(3)]
    gate = gate_of(cluster)
    assert gate["verdict"] == "pass" and gate["world_size"] == 3  # one rank per CPU node
    assert gate["rounds"] == 3 and len(gate["pairs"]) == 3  # 3 nodes: 3 rounds of 1 pair
    # the launch's timeline: the gate, then the job's first line, after it
    assert "launch timeline: " in res.stderr and " s to first output line" in res.stderr
    tl = json.loads(cli("status", NAME, "--timeline", "--json", home=cluster).stdout)[NAME][-1]
    assert tl["command"] == "launch"
    gate_phase, first = tl["phases"]
    assert (gate_phase["phase"], first["phase"]) == ("gate", "first output line")
    assert gate_phase["detail"] == "in the job's processes: pass"
    assert first["seconds"] >= gate_phase["seconds"]  # the job's lines wait for the verdict


def test_throttled_node_stops_the_launch_and_is_named(cluster: Path, job: Path) -> None:
    with throttled(f"{NAME}-node-2"):
        res = launch(cluster, job, "--fabric-check", "on")
    assert res.returncode == 8, res.stderr  # a launch error: the job was not started
    assert "job ran" not in res.stdout
    assert "fabric gate failed, the job was not started: slow node: node-2" in res.stderr
    assert "likely fix" in res.stderr and "--allow-slow-network" in res.stderr
    # the table: node-2 slow, the others fine
    rows = {line.split()[0]: line for line in res.stderr.splitlines()
            if line.startswith("  node-")}
    assert "slow" in rows["node-2"] and rows["node-0"].rstrip().endswith("ok")
    report = json.loads(cli("check", NAME, "--json", home=cluster).stdout)
    verdicts = {n["node"]: n["verdict"] for n in report["fabric_gate"]["nodes"]}
    assert verdicts == {"node-0": "ok", "node-1": "ok", "node-2": "slow"}


def test_allow_slow_network_runs_anyway_with_a_warning(cluster: Path, job: Path) -> None:
    with throttled(f"{NAME}-node-2"):
        res = launch(cluster, job, "--fabric-check", "on", "--allow-slow-network")
    assert res.returncode == 0, res.stderr
    assert "warning: the fabric gate failed; --allow-slow-network" in res.stderr
    assert res.stdout.count("job ran") == 3
    gate = gate_of(cluster)
    assert gate["verdict"] == "fail" and gate["overridden"] is True


def test_run_gates_in_the_job_processes_before_its_script(tmp_path: Path, job: Path,
                                                         traffic_control: None) -> None:
    """`run`: the gate runs in the processes torchrun starts for the job; its verdict is
    said before any line of the job (one stream: stderr into stdout, in the order written)."""
    home = tmp_path / "home"
    name = unique("it-gate-run")
    try:
        res = subprocess.run(
            [sys.executable, "-m", "provision.cli", "run", "--nodes", "2", "--name", name,
             "--fabric-check", "on", "--nproc-per-node", "1", str(job)],
            cwd=job.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=600, env={**os.environ, "MGPU_CLOUD_HOME": str(home)})
        out = res.stdout
        assert res.returncode == 0, out
        launching = out.index("launching torchrun on 2 node(s): job.py (the fabric gate "
                              "first, in the same processes)")
        assert launching < out.index("fabric gate: pass") < out.index("job ran")
        assert out.count("job ran") == 2
        assert "MGPU-GATE" not in out and '"summary": true' not in out  # the gate's lines
    finally:
        cli("down", name, home=home)
