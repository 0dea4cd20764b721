"""Warm spares and a simulated boot on real docker nodes (issue 44): a killed node's rank
moves to the spare at once and a new spare is made in the background; `up --spares` makes,
bootstraps and gates the spares with the cluster, `status` names them and `down` removes
them; `--simulate-boot` holds a node's SSH back for its boot. Each cluster's name is unique
to its test run (the run's token, tests/engine.py); nothing is left behind (the fixture checks)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import runkit
from kit import cli
from runkit import Run

from provision.model.inventory import InventoryStore
from provision.model.jobstore import JobStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from runkit.cluster_name("sp-", request)


def _containers(name: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}", "--filter",
                          f"label=mgpu-cloud-cluster={name}"], capture_output=True, text=True,
                         check=True).stdout
    return sorted(out.split())


def test_a_killed_nodes_rank_moves_to_the_warm_spare_and_a_new_spare_is_made(
        tmp_path: Path, cluster_name: str) -> None:
    """2 nodes + 1 spare: node-1's container is killed mid-run; its rank goes to the spare
    (no replacement made on the critical path), the run resumes from its checkpoint with the
    same world size, a new spare is made meanwhile, the ledger has its spare bucket and
    `run`'s teardown removes every container, the new spare's included."""
    name = cluster_name
    run = Run(name, ["--nodes", "2", "--spares", "1", "--max-restarts", "1", EXAMPLE,
                     "--steps", "60", "--save-every", "5", "--sleep", "0.25",
                     "--hold-once-at-step", "59"], tmp_path)  # killed before its end
    run.wait_for(r"kept checkpoint from node-0: .*step_0000(09|14)", timeout=400)
    inv = InventoryStore().load(name)
    assert [n.name for n in inv.nodes] == ["node-0", "node-1"]
    [spare] = inv.spares
    assert spare.name == "node-2" and _containers(name) == [f"{name}-node-{r}" for r in range(3)]
    idle = subprocess.run(["docker", "exec", f"{name}-node-2", "sh", "-c",
                           "pgrep -f [t]rain_ddp.py || echo idle"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert idle == "idle"  # a spare runs no rank
    subprocess.run(["docker", "kill", f"{name}-node-1"], check=True, capture_output=True)
    run.wait_for(r"spare node-3 ready", timeout=400)
    during = InventoryStore().load(name)
    assert during.nodes[1].resource_id == spare.resource_id  # rank 1 is the old spare
    assert [n.name for n in during.spares] == ["node-3"]
    assert f"{name}-node-1" not in _containers(name)  # the lost one is deleted
    code = run.finish(timeout=600)
    out = run.output
    assert code == 0, out
    assert "failure: node lost (node-1)" in out, out
    assert "node-1: its rank moves to the warm spare node-2 (node lost)" in out, out
    assert "replacing node-1" not in out, out  # no provisioning on the critical path
    assert re.search(r"ready to restart in [\d.]+ s: replacement [\d.]+ s", out), out
    metrics = json.loads((tmp_path / "mgpu-outputs" / name / "metrics.json").read_text())
    assert metrics["steps"] == 60 and metrics["world_size"] == 4 and metrics["restart"] == 1
    led = JobStore().latest(name).ledger  # type: ignore[union-attr]
    assert led is not None and led["spares"] == 1 and led["node_seconds"]["spare"] > 0, led
    # every bucket: the 2 ranks' nodes and the spare for the whole run
    assert math.isclose(sum(led["node_seconds"].values()), led["wall_s"] * 3, rel_tol=0.01)
    assert "spare, idle" in out


def test_up_makes_bootstraps_and_gates_the_spares_status_names_them_and_down_removes_them(
        cluster_name: str) -> None:
    name = cluster_name
    up = cli("up", "--provider", "docker", "--name", name, "--nodes", "1", "--spares", "1",
             "--yes", timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    said = up.stdout + up.stderr
    assert "1 node(s) + 1 warm spare(s)" in said and "spares: 1 x $0.00/h (local)" in said
    assert "creating 1 node(s) + 1 warm spare(s) on docker" in said, said
    inv = InventoryStore().load(name)
    assert [n.name for n in inv.nodes] == ["node-0"] and [n.name for n in inv.spares] == [
        "node-1"]
    # bootstrapped: the tool's files on the spare, its host key pinned like a node's
    ls = cli("exec", name, "--", "true")
    assert ls.returncode == 0 and "node-1" not in ls.stdout  # exec: the ranks' nodes only
    on_spare = subprocess.run(["docker", "exec", f"{name}-node-1", "ls", "/root/.mgpu-cloud"],
                              capture_output=True, text=True, check=True).stdout.split()
    assert "remote.pyz" in on_spare and "hostfile" in on_spare, on_spare
    assert any(p.phase == "spares" for p in inv.timelines[-1].phases)  # gated with up
    status = cli("status", name)
    assert "node-1 (spare, idle)" in status.stdout and " 1+1 " in status.stdout, status.stdout
    down = cli("down", name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _containers(name) == []


def test_a_simulated_boot_holds_a_nodes_ssh_back_and_is_docker_only(cluster_name: str) -> None:
    """--simulate-boot 8: the node's SSH answers no sooner than 8 s after its container
    starts (a lower bound: a loaded machine only makes it later); other providers refuse
    the flag, naming docker."""
    name = cluster_name
    began = time.time()
    up = cli("up", "--provider", "docker", "--name", name, "--nodes", "1",
             "--simulate-boot", "8", "--yes", timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "--simulate-boot 8: each node answers SSH 8 s after it starts" in up.stderr
    inv = InventoryStore().load(name)
    tl = inv.timelines[-1]
    created = next(p for p in tl.phases if p.phase == "create call")  # before the start
    ssh = next(p for p in tl.phases if p.phase == "ssh answers")
    assert ssh.start_s + (ssh.seconds or 0) - created.start_s >= 8.0, tl
    assert time.time() - began >= 8.0
    assert cli("down", name).returncode == 0
    other = cli("up", "--provider", "aws", "--name", name, "--simulate-boot", "5",
                "--dry-run")
    assert other.returncode != 0, other.stdout
    assert "--simulate-boot is a setting of provider docker, not of 'aws'" in other.stderr
    too_long = cli("up", "--provider", "docker", "--name", name, "--simulate-boot", "900",
                   "--dry-run")
    assert too_long.returncode != 0 and "MGPU_CLOUD_SSH_DEADLINE" in too_long.stderr + \
        too_long.stdout
