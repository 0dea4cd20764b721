"""The docker provider against the real Docker engine: real sshd, real torchrun, real teardown.

Every test drives the CLI as a separate process (signals, crashes and exit codes are real).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine import LABEL, created_since, force_remove, leftovers, unique
from kit import cli

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image")]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
RUN_NAME, FAIL, UP, HOSTKEY, GONE, CRASH, OWN, TAKEN, LEFTOVER = map(unique, (
    "it-run", "it-fail", "it-up", "it-hostkey", "it-gone", "it-crash", "it-own", "taken",
    "leftover"))
RACE = unique("gc-race")


def popen_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "provision.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )


def wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout: float = 240) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"{pattern!r} never appeared; output:\n{''.join(seen)}")


@pytest.fixture
def cleanup():  # type: ignore[no-untyped-def]
    """Remove any cluster a failed test left behind (never hides a leak: tests assert first)."""
    names: list[str] = []
    yield names
    for name in names:
        cli("down", name)
        force_remove(name)


def test_run_trains_across_two_nodes_and_fetches_checkpoint(tmp_path: Path, cleanup) -> None:  # type: ignore[no-untyped-def]
    cleanup.append(RUN_NAME)
    res = cli("run", "--provider", "docker", "--nodes", "2", "--name", RUN_NAME, EXAMPLE,
              "--steps", "15", cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    # All 4 ranks (2 nodes x 2 slots) are accounted for, each on the right node.
    for rank in range(4):
        node = rank // 2
        assert re.search(rf"\[node-{node}\] rank {rank}/4 on node-{node}:", out), out
    assert "[node-0] done: world_size=4" in out
    # the run's last lines name where its bring-up's time went
    assert re.search(r"run timeline: [\d.]+ s to first output line; slowest phase: \w", out), out
    ckpt = tmp_path / "mgpu-outputs" / RUN_NAME / "checkpoint.pt"
    metrics = json.loads((ckpt.parent / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["steps"] == 15

    import torch

    state = torch.load(ckpt, weights_only=True)
    assert state["steps"] == 15 and "0.weight" in state["model"]
    assert leftovers(RUN_NAME) == []


def test_failing_script_stops_all_nodes_and_tears_down(tmp_path: Path, cleanup) -> None:  # type: ignore[no-untyped-def]
    cleanup.append(FAIL)
    res = cli("run", "--nodes", "2", "--name", FAIL, EXAMPLE, "--steps", "50",
              "--fail-at-step", "2", cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "failing on purpose at step 2" in out
    assert f"cluster {FAIL!r} removed" in out
    assert leftovers(FAIL) == []


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_training_tears_down(tmp_path: Path, cleanup, sig: int, code: int) -> None:  # type: ignore[no-untyped-def]
    name = unique(f"it-sig{int(sig)}")
    cleanup.append(name)
    proc = popen_cli("run", "--nodes", "2", "--name", name, EXAMPLE, "--steps", "100000",
                     "--sleep", "0.05", cwd=tmp_path)
    try:
        wait_for_line(proc, r"\[node-0\] step 0 loss")
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, rest
    assert f"cluster {name!r} removed" in rest
    assert leftovers(name) == []


def test_up_exec_status_ssh_trust_down_twice(tmp_path: Path, cleanup) -> None:  # type: ignore[no-untyped-def]
    cleanup.append(UP)
    res = cli("up", "--nodes", "2", "--name", UP)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == UP

    res = cli("exec", UP, "--", "hostname")
    assert res.returncode == 0, res.stderr
    assert "--- node-0 (exit 0) ---\nnode-0" in res.stdout
    assert "--- node-1 (exit 0) ---\nnode-1" in res.stdout

    # Per-node exit codes: fails on node-1 only, and the result says so for each node.
    res = cli("exec", UP, "--", 'test "$(hostname)" = node-0')
    assert res.returncode == 1
    assert "--- node-0 (exit 0) ---" in res.stdout and "--- node-1 (exit 1) ---" in res.stdout

    # Nodes reach each other by name, passwordless, with pinned host keys (DeepSpeed/pdsh).
    res = cli("exec", UP, "--", "ssh -o BatchMode=yes node-1 hostname && "
              "cat ~/.mgpu-cloud/hostfile")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node-1\nnode-0 slots=2\nnode-1 slots=2" in res.stdout
    res = cli("exec", UP, "--", "pdsh -R ssh -w node-0,node-1 hostname | sort")
    assert "node-0: node-0\nnode-1: node-1" in res.stdout, res.stdout + res.stderr

    res = cli("status", "--json")
    rows = json.loads(res.stdout)
    assert [r["name"] for r in rows] == [UP]
    # where `up`'s time went, phase by phase (a part indented under its phase)
    res = cli("status", UP, "--timeline")
    assert res.returncode == 0, res.stderr
    for phase in ("  plan ", "  create call ", "    nodes running ", "  bootstrap ",
                  "    ssh answers "):
        assert phase in res.stdout, res.stdout
    assert "slowest phase: " in res.stdout
    (tl,) = json.loads(cli("status", UP, "--timeline", "--json").stdout)[UP]
    assert [p["phase"] for p in tl["phases"]] == ["plan", "create call", "nodes running",
                                                  "bootstrap", "ssh answers"]
    assert [n["address"] for n in rows[0]["nodes"]] == ["127.0.0.1", "127.0.0.1"]
    # node-1 is its IP on the cluster's own network, named in /etc/hosts
    # (bootstrap's block, written in place: the engine bind-mounts that file)
    ip = rows[0]["nodes"][1]["private_address"]
    res = cli("exec", UP, "--", "getent hosts node-1")
    answers = re.findall(r"^(\S+)\s+node-1$", res.stdout, re.M)  # node-1 also has the engine's
    assert len(answers) >= 2 and set(answers) == {ip}, res.stdout

    # Containers publish SSH on loopback only.
    ports = subprocess.run(["docker", "port", f"{UP}-node-0", "22"], capture_output=True,
                           text=True).stdout
    assert ports.startswith("127.0.0.1:"), ports

    # The host key and authorized_keys are copied in, 0600, before the start: nothing of them
    # is in the container's configuration (`docker inspect`), nor in sshd's environment or a
    # session's (a job never sees them).
    inspected = subprocess.run(["docker", "inspect", f"{UP}-node-0", f"{UP}-node-1"],
                               capture_output=True, text=True, check=True).stdout
    assert "PRIVATE KEY" not in inspected and "MGPU_HOST_KEY" not in inspected
    res = cli("exec", UP, "--", "env; tr '\\0' '\\n' < /proc/1/environ; "
              "stat -c '%a %U' /etc/ssh/ssh_host_ed25519_key /root/.ssh/authorized_keys")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "MGPU_HOST_KEY" not in res.stdout and "PRIVATE KEY" not in res.stdout
    assert "MGPU_AUTHORIZED_KEY" not in res.stdout
    assert res.stdout.count("\n600 root\n600 root\n") == 2, res.stdout

    _run_to_file_over_real_ssh(UP, tmp_path)

    assert cli("down", UP).returncode == 0
    assert leftovers(UP) == []  # its own network too (labelled with the cluster)
    again = cli("down", UP)
    assert again.returncode == 0 and "nothing to remove" in again.stderr


def _run_to_file_over_real_ssh(name: str, tmp_path: Path) -> None:
    """NodeConnection.run_to_file over the real SSH transport: stdout arrives byte for byte
    while stderr, more than a channel window (2 MiB) of each, is read alongside (a reader
    that took one after the other would wait forever), its last 64 KiB kept; fetch_tree
    packs straight into the
    transfer and says why when tar cannot."""
    import hashlib

    from provision.model.inventory import InventoryStore
    from provision.nodes import NodeGroup, NodeStepError, fetch_tree

    inv = InventoryStore().load(name)
    with NodeGroup(inv) as group:
        conn = group.connection(inv.nodes[1])
        both = ("head -c 3000000 /dev/zero | tr '\\0' e >&2 & "
                "head -c 3000000 /dev/urandom | tee /tmp/sent; wait; sha256sum /tmp/sent >&2")
        res = conn.run_to_file(both, tmp_path / "got")
        assert res.ok
        got = (tmp_path / "got").read_bytes()
        assert len(got) == 3000000
        # all of it was read (the sha256 line came after 3 MB of e), its last 64 KiB kept
        assert len(res.stderr) == 64 << 10 and res.stderr.startswith("e" * 60000)
        assert res.stderr.endswith(f"{hashlib.sha256(got).hexdigest()}  /tmp/sent\n")

        conn.run("mkdir -p d/sub && echo hi > d/sub/a.txt && echo there > d/b.txt")
        assert fetch_tree(conn, "d", tmp_path / "tree", node="node-1") == 2
        assert (tmp_path / "tree" / "sub" / "a.txt").read_text() == "hi\n"
        with pytest.raises(NodeStepError, match=r"packing d failed: .*missing\.pt"):
            fetch_tree(conn, "d", tmp_path / "tree", ["b.txt", "missing.pt"], node="node-1")
        left = conn.run("ls -A . ~/.mgpu-cloud").stdout.split()
        assert not [n for n in left if n.endswith(".tgz")], left  # nothing packed to disk


def test_changed_host_key_is_refused(tmp_path: Path, cleanup, mgpu_home: Path) -> None:  # type: ignore[no-untyped-def]
    cleanup.append(HOSTKEY)
    assert cli("up", "--nodes", "1", "--name", HOSTKEY).returncode == 0
    from provision.model.inventory import InventoryStore
    from provision.model.keys import generate_ed25519, host_key_only
    from provision.nodes.sshconn import write_cluster_known_hosts

    store = InventoryStore()
    inv = store.load(HOSTKEY)
    inv.nodes[0].host_key = host_key_only(generate_ed25519().public_openssh)
    store.save(inv)
    write_cluster_known_hosts(inv, store)
    res = cli("exec", HOSTKEY, "--", "hostname")
    assert res.returncode != 0
    assert "BadHostKeyException" in res.stderr or "host key" in res.stderr.lower(), res.stderr
    assert cli("down", HOSTKEY).returncode == 0
    assert leftovers(HOSTKEY) == []


def test_down_after_containers_removed_by_hand(cleanup) -> None:  # type: ignore[no-untyped-def]
    cleanup.append(GONE)
    assert cli("up", "--nodes", "2", "--name", GONE, "--no-bootstrap").returncode == 0
    subprocess.run(f"docker rm -f {GONE}-node-0 {GONE}-node-1", shell=True, check=True,
                   capture_output=True)
    res = cli("down", GONE)
    assert res.returncode == 0, res.stderr
    assert leftovers(GONE) == []
    assert cli("status", "--json").stdout.strip() == "[]"


def test_down_works_from_the_inventory_after_the_controller_crashed(tmp_path: Path, cleanup) -> None:  # type: ignore[no-untyped-def]
    cleanup.append(CRASH)
    proc = popen_cli("run", "--nodes", "2", "--name", CRASH, EXAMPLE, "--steps", "100000",
                     "--sleep", "0.05", cwd=tmp_path)
    try:
        wait_for_line(proc, r"\[node-0\] step 0 loss")
        proc.kill()  # SIGKILL: no finally, no teardown, as if the laptop died
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert leftovers(CRASH), "the crash should have left the nodes behind"
    # The job noticed its controller was gone (stdin closed) and stopped itself.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ps = subprocess.run(["docker", "exec", f"{CRASH}-node-0", "pgrep", "-f", "train_ddp"],
                            capture_output=True, text=True)
        if ps.returncode != 0:
            break
        time.sleep(1)
    assert ps.returncode != 0, "training processes outlived their controller"
    res = cli("down", CRASH)
    assert res.returncode == 0, res.stderr
    assert leftovers(CRASH) == []


def test_down_removes_only_what_the_engine_labels_as_the_clusters(node_image: str,
                                                                 cleanup) -> None:  # type: ignore[no-untyped-def]
    """An inventory naming another cluster's container and an unlabelled one (as one adopted
    from a hostile store would): `down` removes the cluster's own, refuses those by name and
    leaves them running; the next `down` finishes."""
    from provision.model.inventory import InventoryStore, ResourceRecord

    cleanup.append(OWN)
    assert cli("up", "--nodes", "1", "--name", OWN, "--no-bootstrap").returncode == 0
    victims = {f"{OWN}-victim-a": ["--label", "mgpu-cloud-cluster=someone-else"],
               f"{OWN}-victim-b": []}
    try:
        for victim, labels in victims.items():
            subprocess.run(["docker", "run", "-d", "--name", victim, *labels, "--label", LABEL,
                            node_image,
                            "sleep", "600"], check=True, capture_output=True)
        store = InventoryStore()
        inv = store.load(OWN)
        for victim in victims:
            store.record(inv, ResourceRecord(kind="container", id=_id(victim, full=True),
                                             name=f"{OWN}-node-9"))
        res = cli("down", OWN)
        assert res.returncode == 6, res.stderr
        assert (f"container {OWN}-victim-a ({_id(f'{OWN}-victim-a')}) is labelled "
                f"mgpu-cloud-cluster=someone-else, not {OWN}'s: left as it is") in res.stderr
        assert (f"container {OWN}-victim-b ({_id(f'{OWN}-victim-b')}) has no "
                "mgpu-cloud-cluster label") in res.stderr, res.stderr
        for victim in victims:
            running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", victim],
                                     capture_output=True, text=True)
            assert running.stdout.strip() == "true", running.stderr
        assert leftovers(OWN) == []
        again = cli("down", OWN)
        assert again.returncode == 0, again.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", *victims], capture_output=True)


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["run", "--nodes", "2", "/nonexistent/train.py"], 2, "does not exist"),
        (["run", "--nodes", "0", EXAMPLE], 2, "nodes: Input should be greater than or equal to 1"),
        (["up", "--provider", "azure"], 2, "unknown provider 'azure'"),
        (["up", "--name", "Bad_Name"], 2, "invalid cluster name"),
    ],
)
def test_bad_input_creates_nothing(args: list[str], code: int, message: str, tmp_path: Path) -> None:
    name = unique("it-bad")
    since = time.time()
    res = cli(*args, *([] if "--name" in args else ["--name", name]), cwd=tmp_path)
    assert res.returncode == code, res.stdout + res.stderr
    assert message in res.stderr
    # what the engine made since: nothing of that cluster, not even for a moment (other
    # tests of this run and other runs make containers meanwhile: asked by the cluster label)
    for label in (name, "Bad_Name"):
        assert created_since(since, label) == [], label


def test_malformed_yaml(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("name: x\nnodes: [2\n")
    res = cli("up", "--config", str(cfg))
    assert res.returncode == 2 and "not valid YAML at line" in res.stderr


def test_name_in_use_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    from provision.model.inventory import Inventory, InventoryStore

    InventoryStore().create(Inventory(name=TAKEN, provider="docker"))
    res = cli("up", "--name", TAKEN, "--nodes", "1")
    assert res.returncode == 2 and "already exists" in res.stderr
    assert leftovers(TAKEN) == []


def test_a_killed_runs_containers_are_named_before_anything_is_made(node_image: str) -> None:
    # what a machine restart in the middle of a run leaves: containers, and no inventory
    subprocess.run(["docker", "create", "--name", f"{LEFTOVER}-node-0", "--label", LABEL, "--label",
                    f"mgpu-cloud-cluster={LEFTOVER}", node_image, "true"], check=True,
                   capture_output=True)
    try:
        res = cli("up", "--name", LEFTOVER, "--nodes", "2")
        assert res.returncode == 2, res.stderr
        assert f"that no inventory here knows: {LEFTOVER}-node-0" in res.stderr, res.stderr
        assert f"docker rm -f {LEFTOVER}-node-0" in res.stderr and "Conflict" not in res.stderr
        assert leftovers(LEFTOVER) == [f"container:{_id(f'{LEFTOVER}-node-0')}"], "untouched"
    finally:
        subprocess.run(["docker", "rm", "-f", f"{LEFTOVER}-node-0"], capture_output=True)


def _id(container: str, full: bool = False) -> str:
    cid = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", container], capture_output=True,
                         text=True, check=True).stdout.strip()
    return cid if full else cid[:12]


def test_docker_not_reachable(tmp_path: Path) -> None:
    res = cli("up", "--name", "nodocker", env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert res.returncode == 4, res.stderr
    assert "Docker engine is not reachable" in res.stderr and "hint:" in res.stderr
    assert not (Path(os.environ["MGPU_CLOUD_HOME"]) / "clusters" / "nodocker.yaml").exists()


def test_gc_lists_past_a_container_removed_while_it_lists(node_image: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Another cluster's `down` between the engine's list and the SDK's inspect of each listed
    container: gone is no orphan, nor an error (before: gc failed, "No such container")."""
    from provision.cluster.providers.docker.engine import docker_client
    from provision.cluster.providers.docker.removal import orphans

    for n in ("node-0", "node-1"):
        subprocess.run(["docker", "create", "--name", f"{RACE}-{n}", "--label", LABEL, "--label",
                        f"mgpu-cloud-cluster={RACE}", node_image, "true"], check=True,
                       capture_output=True)
    client = docker_client()
    listing = client.api.containers

    def then_one_removed(*args: object, **kwargs: object) -> object:
        found = listing(*args, **kwargs)
        subprocess.run(["docker", "rm", f"{RACE}-node-0"], check=True, capture_output=True)
        return found

    monkeypatch.setattr(client.api, "containers", then_one_removed)
    try:
        names = {r.name for r in orphans(client, set()) if r.extra.get("cluster") == RACE}
        assert names == {f"{RACE}-node-1"}
    finally:
        force_remove(RACE)
