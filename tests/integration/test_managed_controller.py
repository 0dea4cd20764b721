"""The controller of a kept managed cluster on real docker nodes (issues 18 and 36): `up
--store` then `launch --detach` job after job, each recovered by the controller, the nodes it
replaced adopted here, and one `down` while it recovers; a controller left behind found by
`gc`; a lost controller made again by the user's next command, which takes the job back. The
store is a host folder mounted into every node (file://)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from engine import force_remove, leftovers, unique
from kit import cli
from managedkit import (
    events,
    kill,
    log_text,
    lose_and_resume,
    own_processes,
    resumed_steps,
    steps_in,
    wait_for,
)

from provision.model.inventory import InventoryStore

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
NARROW = ["--hidden", "48"]  # jobs 2 and 3: a model job 1's checkpoints (64) cannot load


def container_id(name: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], capture_output=True,
                          text=True, check=True).stdout.strip()


def job_one_recovers_a_lost_node_and_a_notice(url: str, name: str, home: Path,
        long_job: list[str]) -> None:
    """Job 1: node-1 lost, then a preemption notice on node-0, both recovered by the
    controller; this machine adopts the replaced nodes; `cancel` through the store."""
    res = cli("launch", name, "--detach", "--max-restarts", "3", *long_job, home=home,
              env={})
    assert res.returncode == 0 and res.stdout.strip() == "1", res.stdout + res.stderr
    assert own_processes(home, name) == []
    again = cli("launch", name, "--detach", "--", EXAMPLE, home=home, env={})
    assert again.returncode != 0 and "still running" in again.stderr  # one at a time

    old = container_id(f"{name}-node-1")
    lose_and_resume(url, name, 1)
    # this machine adopts what the controller replaced: the new container, its port and
    # host key (exec pins it: the old key or port would fail)
    ran = cli("exec", name, "--", "hostname", home=home, env={})
    assert ran.returncode == 0 and "--- node-1 (exit 0) ---" in ran.stdout, ran.stderr
    assert "nodes its controller replaced are now known here" in ran.stderr
    inv = InventoryStore(home).load(name)
    assert container_id(f"{name}-node-1") in {n.resource_id for n in inv.nodes} - {old}

    # a preemption notice on node-0: save, replace, resume, unattended
    saved = len(steps_in(url, f"{name}/data/jobs/1/checkpoints"))
    notice = json.dumps({"action": "terminate", "time": "2026-12-01T12:00:00Z"})
    subprocess.run(["docker", "exec", f"{name}-node-0", "sh", "-c",
                    f"mkdir -p /tmp/mgpu-metadata && echo '{notice}' "
                    "> /tmp/mgpu-metadata/instance-action"], check=True)
    wait_for(lambda: len(resumed_steps(url, name)) == 2, 300, "no resume after the notice")
    assert events(url, name)[-3:] == ["preempted", "replaced", "resumed"], events(url, name)
    text = log_text(url, name)
    assert "node-0: preemption notice (terminate at 2026-12-01T12:00:00Z)" in text, text
    assert "the checkpoint saved after the notice is kept" in text
    assert len(steps_in(url, f"{name}/data/jobs/1/checkpoints")) > saved
    assert cli("cancel", name, home=home, env={}).returncode == 0
    wait_for(lambda: "cancelled" in events(url, name), 120, "not cancelled")
    assert "torn_down" not in events(url, name)
    jobs = json.loads(cli("jobs", name, "--json", home=home, env={}).stdout)
    assert jobs[0]["state"] == "cancelled" and jobs[0]["restarts"] == 2


def job_two_restores_its_own_checkpoints(url: str, name: str, home: Path,
        long_job: list[str]) -> None:
    """Job 2: starts fresh although job 1's files are there; a restart restores its own
    checkpoint. Its model is narrower than job 1's (`--hidden 48`, job 1's 64): loading any
    of job 1's checkpoints fails (load_state_dict: size mismatch), so a resume is its own.
    (Step numbers cannot tell: both jobs save every 5 steps, stop 53's run 48.)"""
    res = cli("launch", name, "--detach", "--max-restarts", "2", *long_job, *NARROW,
              home=home, env={})
    assert res.returncode == 0 and res.stdout.strip() == "2", res.stdout + res.stderr
    wait_for(lambda: steps_in(url, f"{name}/data/jobs/2/checkpoints"), 180, "no checkpoint")
    wait_for(lambda: "checkpoint saved" in log_text(url, name, "2"), 30, "no log")
    assert "resumed from" not in log_text(url, name, "2")  # job 1's files not loaded
    step = lose_and_resume(url, name, 1, job="2")
    assert step in steps_in(url, f"{name}/data/jobs/2/checkpoints")
    said = log_text(url, name, "2")
    assert "size mismatch" not in said and "crashed" not in events(url, name, "2"), said
    assert cli("cancel", name, home=home, env={}).returncode == 0
    wait_for(lambda: "cancelled" in events(url, name, "2"), 120, "not cancelled")


def job_three_continues_job_two_then_down(url: str, name: str, home: Path,
        long_job: list[str]) -> None:
    """Job 3 resumes from job 2's newest checkpoint on purpose; then `down` while the
    controller recovers a lost node-0 stops the controller first and leaves nothing."""
    newest = steps_in(url, f"{name}/data/jobs/2/checkpoints")[-1]
    res = cli("launch", name, "--detach", "--max-restarts", "1", "--env",
              "MGPU_RESUME_FROM=2", *long_job, *NARROW, home=home, env={})
    assert res.returncode == 0 and res.stdout.strip() == "3", res.stdout + res.stderr
    wait_for(lambda: resumed_steps(url, name, "3"), 120, "job 3 did not resume")
    assert resumed_steps(url, name, "3") == [newest], log_text(url, name, "3")
    assert newest in steps_in(url, f"{name}/data/jobs/3/checkpoints")  # now job 3's own

    # down while the controller replaces node-0: it is stopped first
    kill(f"{name}-node-0")
    wait_for(lambda: "node_lost" in events(url, name, "3"), 120, "loss unseen")
    down = cli("down", name, home=home, env={})
    assert down.returncode == 0, down.stderr
    assert events(url, name, "3")[-1] == "cancelled", events(url, name, "3")
    assert leftovers(name) == []  # at once: nothing was made behind down's back
    assert re.search(r"managed job 3 is (recovering|running): its controller stops it",
                     down.stderr), down.stderr
    assert not (home / "clusters" / f"{name}.yaml").exists()


def test_a_kept_managed_cluster_recovers_syncs_back_and_goes_down_cleanly(
        tmp_path: Path) -> None:
    """`up --store` then `launch --detach` twice on the same cluster and store:
    job 1: node-1 lost, then a preemption notice on node-0 (the docker stand-in of the
        metadata service), both recovered by the controller; this machine then reaches the
        replaced nodes (the controller's inventory is adopted); `cancel` through the store;
    job 2: starts fresh although job 1's files are on the nodes and in the store, and a
        restart restores job 2's own checkpoint;
    job 3: `--env MGPU_RESUME_FROM=2` starts from job 2's newest checkpoint; then `down`
        while the controller is recovering a lost node-0: it stops the controller first, one
        `down` leaves nothing."""
    name = unique("mg-launch")
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    home = tmp_path / "home"
    home.mkdir()
    long_job = ["--", EXAMPLE, "--steps", "100000", "--save-every", "5", "--sleep", "0.1"]
    try:
        up = cli("up", "--provider", "docker", "--nodes", "2", "--name", name, "--store", url,
                 home=home, env={})
        assert up.returncode == 0, up.stderr
        job_one_recovers_a_lost_node_and_a_notice(url, name, home, long_job)
        job_two_restores_its_own_checkpoints(url, name, home, long_job)
        job_three_continues_job_two_then_down(url, name, home, long_job)
    finally:
        force_remove(name)


def test_gc_finds_and_removes_a_controller_left_behind(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller container whose inventory is gone (the machine that made it lost its
    state) is an orphan like any node: `gc` lists it, its deletion removes it."""
    from provision.cluster.providers.docker.controller import controller_of, create_controller
    from provision.cluster.providers.docker.engine import docker_client
    from provision.cluster.providers.docker.provider import DockerProvider
    from provision.model.inventory import CLUSTER_TAG, Inventory, ResourceRecord
    from provision.model.spec import build_cluster_spec

    name = unique("mg-gc")
    home = tmp_path / "home"
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(home))
    api = docker_client().api
    try:
        spec = build_cluster_spec({}, {"name": name, "provider": "docker", "nodes": 1})
        store = InventoryStore(home)
        inv = Inventory(name=name, provider="docker", spec=spec)
        store.create(inv)
        net = api.create_network(f"{name}-net", driver="bridge", labels={CLUSTER_TAG: name})
        store.record(inv, ResourceRecord(kind="network", id=net["Id"], name=f"{name}-net"))
        inv.controller = create_controller(inv, store)
        store.delete(name)  # the inventory is lost; the controller and network are not
        listed = cli("gc", "--provider", "docker", home=home, env={})
        assert listed.returncode == 0, listed.stderr
        assert f"{name}-controller" in listed.stdout and f"{name}-net" in listed.stdout
        # delete only this test's orphans (other clusters on this machine are not ours)
        prov = DockerProvider()
        mine = [r for r in prov.orphans(spec, set()) if r.extra.get("cluster") == name]
        assert {r.name for r in mine} == {f"{name}-controller", f"{name}-net"}, mine
        prov.delete_orphans(spec, mine)
        assert controller_of(api, name) is None and leftovers(name) == []
    finally:
        force_remove(name)


def test_a_lost_controller_is_made_again_and_takes_the_job_back(tmp_path: Path) -> None:
    name = unique("mg-tb")
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    home = tmp_path / "home"
    home.mkdir()
    env = {"MGPU_CONTROLLER_LOST_S": "8"}  # the heartbeat comes every 5 s
    try:
        res = cli("run", "--detach", "--provider", "docker", "--nodes", "2", "--name", name,
                  "--max-restarts", "2", "--store", url, EXAMPLE, "--steps", "120",
                  "--save-every", "5", "--sleep", "0.25", home=home, env=env)
        assert res.returncode == 0 and res.stdout.strip() == "1", res.stdout + res.stderr
        ckpts = f"{name}/data/jobs/1/checkpoints"
        wait_for(lambda: steps_in(url, ckpts), 180, "no checkpoint reached the store")
        kill(f"{name}-controller")
        time.sleep(3)  # the job runs on without it
        kill(f"{name}-node-1")
        time.sleep(10)  # the heartbeat goes stale
        assert "taken_back" not in events(url, name)
        jobs = cli("jobs", name, home=home, env=env)
        assert jobs.returncode == 0, jobs.stdout + jobs.stderr
        assert "taking the job back" in jobs.stderr, jobs.stderr
        assert "making a new one" in jobs.stderr, jobs.stderr
        wait_for(lambda: "torn_down" in events(url, name) or "failed" in events(url, name),
                 420, "the run did not end")
        got = events(url, name)
        assert got.count("finished") == 1 and "failed" not in got, got
        assert got.index("taken_back") < got.index("node_lost") < got.index("finished"), got
        assert "replaced" in got and got[-1] == "torn_down", got
        text = log_text(url, name)
        resumed = [int(m) for m in re.findall(r"\[node-0\] resumed from step (\d+)", text)]
        assert resumed and resumed[-1] > 0, text
        metrics = json.loads(open(folder / name / "data" / "jobs" / "1" / "outputs" /
                                  "metrics.json").read())
        assert metrics["steps"] == 120 and metrics["world_size"] == 4, metrics
        logs = cli("logs", name, "1", home=home, env=env)
        assert logs.returncode == 0, logs.stderr
        for line in ("[mgpu-cloud] started", "[mgpu-cloud] taken_back",
                     "[mgpu-cloud] node_lost", "[mgpu-cloud] finished"):
            assert line in logs.stdout, (line, logs.stdout[-3000:])
        wait_for(lambda: leftovers(name) == [], 60, f"left behind: {leftovers(name)}")
    finally:
        force_remove(name)
