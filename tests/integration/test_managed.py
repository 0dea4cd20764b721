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
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from engine import force_remove, leftovers, unique
from kit import cli
from storekit import StoreServer, Webhook

from provision.job.managed.records import JobView
from provision.model.inventory import InventoryStore
from remote.ckpt import SEALS
from remote.store import open_store

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")


def own_processes(home: Path, name: str) -> list[str]:
    """mgpu-cloud processes of this machine that belong to this test: started with its
    MGPU_CLOUD_HOME, or naming its cluster (other helpers' tests run beside it; the
    controller's processes run in a container, another PID namespace). There must be none."""
    mine = os.readlink("/proc/self/ns/pid")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) == os.getpid() or os.readlink(f"/proc/{pid}/ns/pid") != mine:
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        if "provision" not in args or "pytest" in args:
            continue
        if f"MGPU_CLOUD_HOME={home}".encode() in environ or name in args:
            found.append(f"{pid} {args}")
    return found


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def events(url: str, name: str, job: str = "1") -> list[str]:
    store = open_store(url)
    keys = store.list(f"{name}/jobs/{job}/events")
    return [json.loads(store.get_bytes(k) or b"{}")["event"] for k in keys]


def log_text(url: str, name: str, job: str = "1") -> str:
    return "".join(text for _, text in JobView(open_store(url), name, job).log_chunks())


def resumed_steps(url: str, name: str, job: str = "1") -> list[int]:
    return [int(m) for m in re.findall(r"\[node-0\] resumed from step (\d+)",
                                       log_text(url, name, job))]


def steps_in(url: str, prefix: str) -> list[int]:
    return sorted(int(m.group(1)) for k in open_store(url).list(prefix)
                  if (m := re.search(r"step_(\d+)\.pt$", k)))


def sealed_steps(url: str, prefix: str) -> list[int]:
    """The steps a seal vouches for under a checkpoint prefix: what a restore takes (a file
    in the store without its seal, its copy still under way, is left out: remote/storesync)."""
    store = open_store(url)
    found = set()
    for key in store.list(f"{prefix}/{SEALS}"):
        for rel in json.loads(store.get_bytes(key) or b"{}").get("files", {}):
            if m := re.search(r"step_(\d+)\.pt$", rel):
                found.add(int(m.group(1)))
    return sorted(found)


def kill(container: str) -> None:
    subprocess.run(["docker", "kill", container], check=True, capture_output=True)


def lose_and_resume(url: str, name: str, victim: int, job: str = "1") -> int:
    """Once the job's store has a sealed checkpoint newer than its last resume, kill node
    `victim`; wait until rank 0 resumed again; the step it resumed from."""
    before = resumed_steps(url, name, job)
    floor = before[-1] if before else -1
    wait_for(lambda: any(s > floor
                         for s in sealed_steps(url, f"{name}/data/jobs/{job}/checkpoints")),
             180, f"no sealed checkpoint after step {floor} reached the store")
    kill(f"{name}-node-{victim}")
    wait_for(lambda: len(resumed_steps(url, name, job)) > len(before)
             or "failed" in events(url, name, job), 300, f"no resume after node-{victim}")
    return resumed_steps(url, name, job)[-1]


# store kind -> the nodes killed, one after the other, in ONE run (--max-restarts 2): every
# store sees node-1 and node-0 lost (the done-when) at the cost of three clusters, not six
CASES = {"s3": ("s3", [1, 0]), "file": ("file", [0, 1]), "gs": ("gs", [1, 0])}
TERMINAL = {"finished", "failed", "cancelled", "torn_down"}


@pytest.mark.parametrize("case", list(CASES))
def test_unattended_run_survives_lost_nodes_and_cleans_up(
        case: str, tmp_path: Path, request: pytest.FixtureRequest, webhook: Webhook) -> None:
    kind, victims = CASES[case]
    name = unique(f"mg-{case}")
    env: dict[str, str] = {}
    if kind == "file":
        folder = tmp_path / "shared"
        folder.mkdir()
        url = f"file://{folder}"
    else:
        server: StoreServer = request.getfixturevalue("s3_store" if kind == "s3" else "gcs_store")
        url, env = server.url, server.env
        if kind == "s3":  # a secret no node may ever see (issue 34): theirs are minted by STS
            env = {**env, "AWS_SECRET_ACCESS_KEY": f"user-secret-{secrets.token_hex(6)}"}
    home = tmp_path / "home"
    home.mkdir()
    try:
        t0 = time.monotonic()
        res = cli("run", "--detach", "--provider", "docker", "--nodes", "2", "--name", name,
                  "--max-restarts", "2", "--store", url, "--notify", webhook.url, EXAMPLE,
                  "--steps", "80", "--save-every", "5", "--sleep", "0.25", home=home, env=env)
        returned = time.monotonic() - t0
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.strip() == "1", res.stdout
        # it returned while the job ran: started, and not ended yet
        at_return = events(url, name)
        assert "started" in at_return and not TERMINAL & set(at_return), at_return
        assert own_processes(home, name) == [], own_processes(home, name)
        if kind == "s3":
            stolen = steal_store_credentials(f"{name}-node-0")
            assert "AWS_SECRET_ACCESS_KEY" in stolen and "AWS_SESSION_TOKEN" in stolen
            assert env["AWS_SECRET_ACCESS_KEY"] not in stolen  # STS's, narrowed, not the user's
            assert_secret_unseen(f"{name}-node-0", env["AWS_SECRET_ACCESS_KEY"])
        store = open_store(url)
        steps = [lose_and_resume(url, name, victim) for victim in victims]
        assert 0 < steps[0] < steps[1], steps  # each restart from a newer saved step
        wait_for(lambda: "torn_down" in events(url, name) or "failed" in events(url, name),
                 420, "the run did not end")
        got = events(url, name)
        assert got == ["submitted", "started", "node_lost", "replaced", "resumed", "node_lost",
                       "replaced", "resumed", "ledger", "finished", "torn_down"], got
        wait_for(lambda: leftovers(name) == [], 30, f"left behind: {leftovers(name)}")
        # the outputs and checkpoints are in the store, pushed by the nodes
        metrics = json.loads(store.get_bytes(f"{name}/data/jobs/1/outputs/metrics.json")
                             or b"{}")
        assert metrics["steps"] == 80 and metrics["world_size"] == 4, metrics
        assert metrics["restart"] == 2 and int(metrics["resumed_from"]) == steps[1] + 1, metrics
        assert steps_in(url, f"{name}/data/jobs/1/checkpoints")[-1] == 79
        # the whole history, from the store, by the CLI of this machine
        logs = cli("logs", name, "--follow", home=home, env=env)
        assert logs.returncode == 0, logs.stdout + logs.stderr
        for victim in victims:
            assert f"failure: node lost (node-{victim})" in logs.stdout, logs.stdout
        assert f"[node-0] resumed from step {steps[1]}" in logs.stdout
        assert "[mgpu-cloud] torn_down" in logs.stdout, logs.stdout
        jobs = cli("jobs", name, "--json", home=home, env=env)
        [job] = json.loads(jobs.stdout)
        assert job["state"] == "succeeded" and job["restarts"] == 2 and job["torn_down"]
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
        assert own_processes(home, name) == []
        print(f"{case}: `run --detach` returned after {returned:.1f} s")
    finally:
        force_remove(name)


# What a hostile job does to the tool's own program on its node: remote.pyz is a file the
# job's user can replace, and the controller pipes each store command its credentials
THIEF = """import os, subprocess, sys
real = os.path.expanduser("~/.mgpu-cloud/remote.real.pyz")
if "--env-stdin" not in sys.argv:
    os.execv(sys.executable, [sys.executable, real, *sys.argv[1:]])
data = sys.stdin.buffer.read()
with open("/tmp/stolen", "ab") as fh:
    fh.write(data + b"\\n")
sys.exit(subprocess.run([sys.executable, real, *sys.argv[1:]], input=data).returncode)
"""


def steal_store_credentials(container: str) -> str:
    """Plant THIEF as the node's remote.pyz until a store command came through it; put the
    real one back; what it read on stdin."""
    pyz = "~/.mgpu-cloud/remote.pyz"
    plant = (f"cp {pyz} ~/.mgpu-cloud/remote.real.pyz && cat > {pyz}.new && mv {pyz}.new {pyz}")
    subprocess.run(["docker", "exec", "-i", container, "sh", "-c", plant], input=THIEF,
                   text=True, check=True)

    def got() -> str:
        return subprocess.run(["docker", "exec", container, "sh", "-c",
                               "cat /tmp/stolen 2>/dev/null"], capture_output=True,
                              text=True).stdout

    try:
        wait_for(lambda: "AWS_" in got(), 120, "no store command came through the node")
    finally:
        subprocess.run(["docker", "exec", container, "sh", "-c",
                        f"mv ~/.mgpu-cloud/remote.real.pyz {pyz}"], check=True)
    return got()


def assert_secret_unseen(container: str, secret: str) -> None:
    """Nothing a node's code can read holds `secret`: no process's environment or command
    line, no file of its home or /tmp, not the container's own configuration."""
    look = ("cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
            "find ~ /tmp -type f -size -10M -exec cat {} + 2>/dev/null")
    seen = subprocess.run(["docker", "exec", container, "sh", "-c", look], capture_output=True,
                          text=True, errors="replace").stdout
    assert len(seen) > 1000 and "MGPU" in seen  # it did read the node's processes and files
    assert secret not in seen
    assert secret not in subprocess.run(["docker", "inspect", container], capture_output=True,
                                        text=True).stdout


def container_id(name: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name], capture_output=True,
                          text=True, check=True).stdout.strip()


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

        # job 2: its own checkpoints only
        res = cli("launch", name, "--detach", "--max-restarts", "2", *long_job, home=home,
                  env={})
        assert res.returncode == 0 and res.stdout.strip() == "2", res.stdout + res.stderr
        wait_for(lambda: steps_in(url, f"{name}/data/jobs/2/checkpoints"), 180, "no checkpoint")
        wait_for(lambda: "checkpoint saved" in log_text(url, name, "2"), 30, "no log")
        assert "resumed from" not in log_text(url, name, "2")  # job 1's files not loaded
        step = lose_and_resume(url, name, 1, job="2")
        assert step in steps_in(url, f"{name}/data/jobs/2/checkpoints")
        assert step < steps_in(url, f"{name}/data/jobs/1/checkpoints")[-1]  # not job 1's newest
        assert cli("cancel", name, home=home, env={}).returncode == 0
        wait_for(lambda: "cancelled" in events(url, name, "2"), 120, "not cancelled")

        # job 3 continues job 2 on purpose
        newest = steps_in(url, f"{name}/data/jobs/2/checkpoints")[-1]
        res = cli("launch", name, "--detach", "--max-restarts", "1", "--env",
                  "MGPU_RESUME_FROM=2", *long_job, home=home, env={})
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


def test_docker_nodes_cannot_log_in_to_the_controller_nor_reach_the_stores_records(
        tmp_path: Path) -> None:
    """Issue 34 (docker): the controller authorizes its own login key only, so a node, which
    holds the cluster key, is refused by its sshd (the same login to a node works); a
    file:// store is mounted into the nodes as NAME/data only (cluster.json and the records
    stay out of their reach), into the controller whole; the hand-off and the run work."""
    name = unique("mg-trust")
    folder = tmp_path / "shared"
    folder.mkdir()
    url = f"file://{folder}"
    home = tmp_path / "home"
    home.mkdir()
    try:
        up = cli("up", "--provider", "docker", "--nodes", "1", "--name", name, "--store", url,
                 home=home, env={})
        assert up.returncode == 0, up.stderr
        res = cli("launch", name, "--detach", "--", EXAMPLE, "--steps", "3", "--save-every", "1",
                  home=home, env={})
        assert res.returncode == 0 and res.stdout.strip() == "1", res.stdout + res.stderr
        wait_for(lambda: "finished" in events(url, name), 180, "the job did not finish")
        assert steps_in(url, f"{name}/data/jobs/1/checkpoints"), "no checkpoint via data/"
        inv = InventoryStore(home).load(name)
        ctl, node = inv.controller, inv.nodes[0]
        assert ctl is not None

        def mounts(container: str) -> list[str]:
            out = subprocess.run(["docker", "inspect", "-f", "{{json .Mounts}}", container],
                                 capture_output=True, text=True, check=True).stdout
            return sorted(m["Source"] for m in json.loads(out))

        assert mounts(f"{name}-node-0") == [f"{folder}/{name}/data"]
        assert str(folder) in mounts(f"{name}-controller")
        assert (folder / name / "cluster.json").exists()
        in_node = subprocess.run(["docker", "exec", f"{name}-node-0", "ls", f"{folder}/{name}"],
                                 capture_output=True, text=True)
        assert in_node.stdout.split() == ["data"], in_node.stdout + in_node.stderr

        def login_from_node(address: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["docker", "exec", f"{name}-node-0", "ssh", "-i",
                 f"/root/.ssh/mgpu-cloud_{name}_ed25519", "-o", "BatchMode=yes",
                 "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                 "-o", "ConnectTimeout=10", f"root@{address}", "echo", "in"],
                capture_output=True, text=True, timeout=60)

        assert login_from_node(node.private_address).stdout == "in\n"  # the key works...
        refused = login_from_node(ctl.private_address)  # ...but not on the controller
        assert refused.returncode == 255, refused.stdout + refused.stderr
        assert "Permission denied (publickey)" in refused.stderr, refused.stderr
        authorized = subprocess.run(["docker", "exec", f"{name}-controller", "cat",
                                     "/root/.ssh/authorized_keys"], capture_output=True,
                                    text=True, check=True).stdout
        own = (home / "keys" / name / "controller_ed25519.pub").read_text()
        assert authorized == own, authorized
        inspected = subprocess.run(["docker", "inspect", f"{name}-controller",
                                    f"{name}-node-0"], capture_output=True, text=True).stdout
        assert "PRIVATE KEY" not in inspected
        down = cli("down", name, home=home, env={})
        assert down.returncode == 0, down.stderr
        assert leftovers(name) == []
    finally:
        force_remove(name)


# --- issue 36: the controller lost, then a node, with no controller running ---------------
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
