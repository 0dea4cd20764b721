"""Managed runs on real docker nodes (issue 18): `run --detach --store` returns while the job
runs, nothing of mgpu-cloud stays on this machine, a killed node (node-1, or node-0) is
replaced by the cluster's controller, the job resumes from the store's checkpoint, finishes,
and the controller removes everything, itself last. The store is real: moto's S3 server,
fake-gcs-server, or a host folder mounted into every node (file://); the nodes and the
controller reach it over the network with boto3 / google-cloud-storage. A webhook receives
the state changes in order; `logs`/`jobs` read the store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from kit import cli
from storekit import StoreServer, Webhook

from remote.store import open_store

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")


def leftovers(name: str) -> list[str]:
    label = f"label=mgpu-cloud-cluster={name}"
    out = subprocess.run(["docker", "ps", "-aq", "--filter", label], capture_output=True,
                         text=True, check=True).stdout.split()
    return out + subprocess.run(["docker", "network", "ls", "-q", "--filter", label],
                                capture_output=True, text=True, check=True).stdout.split()


def own_processes(name: str) -> list[str]:
    """mgpu-cloud processes of this machine (not of its containers: the controller's are
    seen by `ps` too) that name the cluster. There must be none."""
    mine = os.readlink("/proc/self/ns/pid")
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if "provision" not in args or name not in args or "pytest" in args:
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == mine:
                found.append(line)
        except OSError:
            continue  # ended meanwhile
    return found


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def events(url: str, name: str) -> list[str]:
    store = open_store(url)
    keys = store.list(f"{name}/jobs/1/events")
    return [json.loads(store.get_bytes(k) or b"{}")["event"] for k in keys]


CASES = {
    # store kind, the node killed
    "s3-node1": ("s3", 1),
    "file-node0": ("file", 0),
    "gs-node1": ("gs", 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unattended_run_survives_a_lost_node_and_cleans_up(
        case: str, tmp_path: Path, request: pytest.FixtureRequest, webhook: Webhook) -> None:
    kind, victim = CASES[case]
    name = f"mg-{case}"
    env: dict[str, str] = {}
    if kind == "file":
        folder = tmp_path / "shared"
        folder.mkdir()
        url = f"file://{folder}"
    else:
        server: StoreServer = request.getfixturevalue("s3_store" if kind == "s3" else "gcs_store")
        url, env = server.url, server.env
    home = tmp_path / "home"
    home.mkdir()
    try:
        t0 = time.monotonic()
        res = cli("run", "--detach", "--provider", "docker", "--nodes", "2", "--name", name,
                  "--max-restarts", "2", "--store", url, "--notify", webhook.url, EXAMPLE,
                  "--steps", "40", "--save-every", "5", "--sleep", "0.25", home=home, env=env)
        returned = time.monotonic() - t0
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.strip() == "1", res.stdout
        assert own_processes(name) == [], own_processes(name)
        assert "started" in events(url, name)
        store = open_store(url)
        wait_for(lambda: any(re.search(r"step_0000(09|14|19)\.pt$", k)
                             for k in store.list(f"{name}/checkpoints")), 180,
                 "no checkpoint reached the store")
        subprocess.run(["docker", "kill", f"{name}-node-{victim}"], check=True,
                       capture_output=True)
        wait_for(lambda: "torn_down" in events(url, name) or "failed" in events(url, name),
                 420, "the run did not end")
        got = events(url, name)
        assert got[:2] == ["submitted", "started"], got
        assert got[2:] == ["node_lost", "replaced", "resumed", "finished", "torn_down"], got
        wait_for(lambda: leftovers(name) == [], 30, f"left behind: {leftovers(name)}")
        # the outputs and checkpoints are in the store, pushed by the nodes
        metrics = json.loads(store.get_bytes(f"{name}/jobs/1/outputs/metrics.json") or b"{}")
        assert metrics["steps"] == 40 and metrics["world_size"] == 4, metrics
        assert metrics["restart"] == 1 and int(metrics["resumed_from"]) > 0, metrics
        assert f"{name}/checkpoints/step_000039.pt" in store.list(f"{name}/checkpoints")
        # the whole history, from the store, by the CLI of this machine
        logs = cli("logs", name, "--follow", home=home, env=env)
        assert logs.returncode == 0, logs.stdout + logs.stderr
        assert f"failure: node lost (node-{victim})" in logs.stdout
        assert re.search(r"\[node-0\] resumed from step (\d+)", logs.stdout), logs.stdout
        assert "[mgpu-cloud] torn_down" in logs.stdout or "torn_down" in "".join(got)
        jobs = cli("jobs", name, "--json", home=home, env=env)
        [job] = json.loads(jobs.stdout)
        assert job["state"] == "succeeded" and job["restarts"] == 1 and job["torn_down"]
        assert not (home / "clusters" / f"{name}.yaml").exists()  # dropped: it is gone
        # another machine: nothing but the store's URL and credentials
        other = tmp_path / "other-machine"
        other.mkdir()
        att = cli("attach", name, "--store", url, home=other, env=env)
        assert att.returncode == 0 and "succeeded (torn down)" in att.stdout, att.stderr
        again = cli("logs", name, "1", "--node", "0", home=other, env=env)
        assert again.returncode == 0 and "[node-0] resumed from step" in again.stdout
        assert "[node-1]" not in again.stdout
        # the webhook saw every state change, in order
        wait_for(lambda: len(webhook.events()) >= len(got), 20, "webhook incomplete")
        assert webhook.events() == got
        print(f"{case}: `run --detach` returned after {returned:.1f} s")
    finally:
        subprocess.run(f"docker rm -f $(docker ps -aq --filter label=mgpu-cloud-cluster={name})"
                       f" 2>/dev/null; docker network rm {name}-net 2>/dev/null", shell=True)


def test_launch_detach_on_a_managed_cluster_then_cancel_and_down(tmp_path: Path) -> None:
    """`up --store` then `launch --detach`: the controller supervises it and leaves the
    cluster up; `cancel` goes through the store; `down` removes the controller too."""
    name = "mg-launch"
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    home = tmp_path / "home"
    home.mkdir()
    try:
        up = cli("up", "--provider", "docker", "--nodes", "2", "--name", name, "--store", url,
                 home=home, env={})
        assert up.returncode == 0, up.stderr
        res = cli("launch", name, "--detach", "--", EXAMPLE, "--steps", "100000", "--sleep",
                  "0.1", home=home, env={})
        assert res.returncode == 0 and res.stdout.strip() == "1", res.stdout + res.stderr
        assert own_processes(name) == []
        again = cli("launch", name, "--detach", "--", EXAMPLE, home=home, env={})
        assert again.returncode != 0 and "still running" in again.stderr  # one at a time
        assert cli("cancel", name, home=home, env={}).returncode == 0
        wait_for(lambda: "cancelled" in events(url, name), 120, "not cancelled")
        assert "torn_down" not in events(url, name)
        jobs = json.loads(cli("jobs", name, "--json", home=home, env={}).stdout)
        assert jobs[0]["state"] == "cancelled"
        assert f"{name}-controller" in subprocess.run(
            ["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
        down = cli("down", name, home=home, env={})
        assert down.returncode == 0, down.stderr
        assert leftovers(name) == []
    finally:
        subprocess.run(f"docker rm -f $(docker ps -aq --filter label=mgpu-cloud-cluster={name})"
                       f" 2>/dev/null; docker network rm {name}-net 2>/dev/null", shell=True)
