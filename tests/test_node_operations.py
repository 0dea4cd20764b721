"""bootstrap, workdir sync, launch, stop, fetch and the preflight gather, through a fake
transport: what each node is asked, and how failures are reported."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_nodes import FakeConnector, archive_files
from kit import until

from provision.job.collect import fetch_outputs
from provision.job.launch import run_job, workdir_of
from provision.model.errors import BootstrapError, LaunchError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import ensure_cluster_key
from provision.model.spec import build_job_spec
from provision.nodes import NodeGroup
from provision.nodes.bootstrap import bootstrap_cluster, sync_workdir
from provision.nodes.preflight import gather_preflights

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


@pytest.fixture
def cluster(mgpu_home: Path) -> tuple[Inventory, InventoryStore]:
    store = InventoryStore()
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=2, host_key="ssh-ed25519 AAAA")
             for r in range(2)]
    inv = Inventory(name="demo", provider="docker", nodes=nodes, status="ready")
    key, _ = ensure_cluster_key(store.keys_dir("demo"))
    inv.key_path = str(key)
    store.create(inv)
    return inv, store



def test_bootstrap_sends_one_archive_and_one_command_per_node(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, store = cluster
    fake = FakeConnector()
    job = build_job_spec({}, {"script": EXAMPLE, "launcher": "deepspeed"})
    bootstrap_cluster(inv, store, workdir=workdir_of(inv, job), log=lambda m: None,
                      group=NodeGroup(inv, connector=fake))
    for node in ("node-0", "node-1"):
        [command] = fake.commands(node)
        assert "tar -xzf - -C ~" in command and "authorized_keys" in command
        files = archive_files(fake.stdin(node)[0])
        assert {".mgpu-cloud/remote.pyz", ".mgpu-cloud/hostfile", ".mgpu-cloud/ds_config.json",
                ".mgpu-cloud/work/train_ddp.py", ".ssh/mgpu-cloud_demo_ed25519"} <= set(files)
        assert files[".mgpu-cloud/hostfile"].decode().split("\n")[:2] == [
            "node-0 slots=2", "node-1 slots=2"]
    assert store.load("demo").bootstrapped


def test_bootstrap_waits_for_gpus_pulls_the_image_and_names_every_failed_node(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, store = cluster
    inv.wait_for_gpu, inv.container_image = True, "nvcr.io/nvidia/pytorch:24.06-py3"
    fake = FakeConnector()
    fake.on(r"docker pull", node="node-1", exit_code=1, stderr="toomanyrequests: rate limit")
    with pytest.raises(BootstrapError) as info:
        bootstrap_cluster(inv, store, log=lambda m: None, group=NodeGroup(inv, connector=fake))
    assert "bootstrap failed on 1 of 2 node(s)" in info.value.message
    assert "node-1: pulling the container failed (exit 1): toomanyrequests" in info.value.message
    for node in ("node-0", "node-1"):
        cmds = fake.commands(node)
        assert cmds[0] == "nvidia-smi -L"
        assert cmds[-1] == "sudo -n docker pull nvcr.io/nvidia/pytorch:24.06-py3"


def test_a_node_without_egress_is_named_before_the_pull(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, store = cluster
    inv.container_image = "nvcr.io/nvidia/pytorch:24.06-py3"
    fake = FakeConnector()
    fake.on(r"/dev/tcp/nvcr\.io/443", node="node-1", exit_code=124)
    with pytest.raises(BootstrapError) as info:
        bootstrap_cluster(inv, store, log=lambda m: None, group=NodeGroup(inv, connector=fake))
    assert ("node-1: no path to the internet: nvcr.io:443 cannot be reached within 10 s"
            in info.value.message)
    assert not any("docker pull" in c for c in fake.commands("node-1"))
    fake.assert_ran("node-0", r"docker pull")


@pytest.mark.parametrize(("image", "registry"), [
    ("nvcr.io/nvidia/pytorch:24.06-py3", "nvcr.io"), ("ubuntu:22.04", "registry-1.docker.io"),
    ("pytorch/pytorch:2.4.0", "registry-1.docker.io"), ("localhost:5000/x:1", "localhost"),
    ("123.dkr.ecr.us-east-1.amazonaws.com/t:1", "123.dkr.ecr.us-east-1.amazonaws.com"),
])
def test_registry_of(image: str, registry: str) -> None:
    from provision.nodes.bootstrap import registry_of

    assert registry_of(image) == registry


def test_unreachable_node_is_named(cluster, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    inv, store = cluster
    monkeypatch.setattr("provision.nodes.bootstrap.SSH_DEADLINE_S", 0.2)
    fake = FakeConnector()
    fake.unreachable("node-0")
    with pytest.raises(BootstrapError, match=r"node-0: OSError: \[Errno 113\] No route"):
        bootstrap_cluster(inv, store, log=lambda m: None, group=NodeGroup(inv, connector=fake))
    assert fake.commands("node-1")  # the other node was still prepared


def test_sync_replaces_the_workdir_everywhere(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    fake = FakeConnector()
    sync_workdir(inv, workdir_of(inv, build_job_spec({}, {"script": EXAMPLE})), log=lambda m: None,
                 group=NodeGroup(inv, connector=fake))
    for node in ("node-0", "node-1"):
        assert fake.commands(node)[0].startswith(
            "python3 .mgpu-cloud/remote.pyz job idle --pidfile .mgpu-cloud/job.pid && "
            "rm -rf .mgpu-cloud/work && mkdir -p"), "no job may run where the workdir goes"
        assert ".mgpu-cloud/work/train_ddp.py" in archive_files(fake.stdin(node)[0])


def test_the_state_folder_and_key_files_are_never_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MGPU_CLOUD_HOME inside the script's folder, and a node key file beside the script:
    neither goes to the nodes, whatever its name."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "data" / "a.txt").write_text("a\n")
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(project / "data" / "state"))
    store = InventoryStore()
    own_key = project / "my_node_key"
    own_key.write_text("PRIVATE\n")
    nodes = [NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=4000,
                        private_address="node-0", host_key="ssh-ed25519 AAAA",
                        identity_file=str(own_key))]
    inv = Inventory(name="inside", provider="docker", nodes=nodes, status="ready")
    key, _ = ensure_cluster_key(store.keys_dir("inside"))
    inv.key_path = str(key)
    store.create(inv)
    (project / "data" / "state" / "history.jsonl").write_text("{}\n")
    fake = FakeConnector()
    sync_workdir(inv, workdir_of(inv, build_job_spec({}, {"script": str(project / "train.py")})),
                 log=lambda m: None, group=NodeGroup(inv, connector=fake))
    files = set(archive_files(fake.stdin("node-0")[0]))
    assert {".mgpu-cloud/work/train.py", ".mgpu-cloud/work/data/a.txt"} <= files
    leaked = [f for f in files if "/state" in f or "key" in f or "history" in f]
    assert leaked == [], leaked


def test_sync_names_the_nodes_where_a_job_still_runs(cluster) -> None:  # type: ignore[no-untyped-def]
    from provision.model.errors import LaunchError
    from provision.nodes.bootstrap import JOB_RUNNING

    inv, _ = cluster
    fake = FakeConnector()
    fake.on(r"job idle", node="node-1", exit_code=JOB_RUNNING)
    with pytest.raises(LaunchError, match=r"a job is still running on node-1: its workdir "
                                          r"was not replaced"):
        sync_workdir(inv, workdir_of(inv, build_job_spec({}, {"script": EXAMPLE})), log=lambda m: None,
                     group=NodeGroup(inv, connector=fake))


def test_run_job_streams_prefixed_lines_and_returns_zero(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    fake = FakeConnector()
    fake.on(r"torchrun", stream="step 1\nstep 2\n")
    out = io.StringIO()
    code = run_job(inv, build_job_spec({}, {"script": EXAMPLE}), log=lambda m: None, out=out,
                   group=NodeGroup(inv, connector=fake))
    assert code == 0
    assert "[node-0] step 2" in out.getvalue() and "[node-1] step 1" in out.getvalue()
    assert "--node_rank 1" in fake.assert_ran("node-1", "torchrun")


def test_a_failing_node_stops_the_others_and_its_code_is_returned(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    fake = FakeConnector()
    fake.on(r"torchrun", node="node-1", exit_code=7, stream="CUDA out of memory\n")
    logs: list[str] = []
    code = run_job(inv, build_job_spec({}, {"script": EXAMPLE}), log=logs.append,
                   out=io.StringIO(), group=NodeGroup(inv, connector=fake))
    assert code == 7
    assert any("node-1 exited with 7" in m for m in logs)
    assert any("likely cause" in m and "out of memory" in m.lower() for m in logs)


def test_deepspeed_pdsh_starts_from_node_0_only(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    fake = FakeConnector()
    job = build_job_spec({}, {"script": EXAMPLE, "launcher": "deepspeed"})
    assert run_job(inv, job, log=lambda m: None, out=io.StringIO(),
                   group=NodeGroup(inv, connector=fake)) == 0
    fake.assert_ran("node-0", r"deepspeed --hostfile")
    assert fake.commands("node-1") == []


def test_a_node_that_cannot_be_reached_is_a_launch_error(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    fake = FakeConnector()
    fake.unreachable("node-1")
    with pytest.raises(LaunchError, match="node-1: could not run the job"):
        run_job(inv, build_job_spec({}, {"script": EXAMPLE}), log=lambda m: None,
                out=io.StringIO(), group=NodeGroup(inv, connector=fake))


def test_fetch_copies_rank_0_outputs(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"weights"
        info = tarfile.TarInfo("./checkpoint.pt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    pack = ("mkdir -p .mgpu-cloud/outputs && tar -czf - --dereference --hard-dereference "
            "-C .mgpu-cloud/outputs .")
    fake = FakeConnector(files={("node-0", pack): buf.getvalue()})
    fetch_outputs(inv, tmp_path / "out", log=lambda m: None,
                  group=NodeGroup(inv, connector=fake))
    assert (tmp_path / "out" / "checkpoint.pt").read_bytes() == b"weights"
    assert fake.commands("node-0") == [pack]  # one command: nothing packed to, or left on, disk
    assert fake.commands("node-1") == []


def test_preflight_gather_keeps_a_report_or_the_reason_for_every_node(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster
    fake = FakeConnector()
    fake.on("preflight", node="node-0", stdout="noise\n" + json.dumps({"gpus": []}) + "\n")
    fake.on("preflight", node="node-1", exit_code=1, stderr="Traceback: ModuleNotFoundError")
    reports = gather_preflights(inv, group=NodeGroup(inv, connector=fake))
    assert reports["node-0"] == {"gpus": []}
    assert "ModuleNotFoundError" in reports["node-1"]["error"]
    assert "--master-addr node-0 --master-port 29500" in fake.assert_ran("node-1", "preflight")


def _follow_two(inv: Inventory, node_1: Callable[[threading.Event, list[str]], int],
                settle: float) -> tuple[int, list[str], list[str]]:
    """following.follow (split out of launch.py) with node-0 failing at once and node-1
    as scripted (handed an event that the stop sets, and the log so far); (code, what
    node-1 was sent, log lines)."""
    import concurrent.futures

    from provision.job import following

    fake = FakeConnector()
    stopped = threading.Event()
    logged: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool, \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(following, "PEERS_SETTLE_S", settle)
        real_stop = following.stop_job
        mp.setattr(following, "stop_job",
                   lambda *a, **k: (real_stop(*a, **k), stopped.set()))
        futures = {pool.submit(lambda: 1): inv.nodes[0],
                   pool.submit(node_1, stopped, logged): inv.nodes[1]}
        code = following.follow(futures, NodeGroup(inv, connector=fake), logged.append, None,
                                None, threading.Event())
    return code, fake.commands("node-1"), logged


def test_after_a_node_fails_the_others_may_end_by_themselves_first(cluster) -> None:  # type: ignore[no-untyped-def]
    """Their own launchers then report their ranks' own exit codes (a rank stopped while it
    was exiting from its crash reported -15, not its exit 1)."""
    inv, _ = cluster

    def ends_soon(stopped: threading.Event, logged: list[str]) -> int:
        until(lambda: any(line.startswith("node-0 exited") for line in logged), 60,
              what="node-0's failure never seen")  # node-0 ends first, whatever the load
        return 0 if stopped.wait(0.3) else 1  # ends by itself, unless stopped first

    code, sent, logged = _follow_two(inv, ends_soon, settle=30.0)
    assert code == 1 and sent == [], sent
    assert "node-0 exited with 1; stopping the other nodes" in logged


def test_a_node_that_does_not_end_is_stopped_after_the_settle(cluster) -> None:  # type: ignore[no-untyped-def]
    inv, _ = cluster

    def hangs(stopped: threading.Event, logged: list[str]) -> int:
        assert stopped.wait(60), "never stopped"
        return -15

    code, sent, _ = _follow_two(inv, hangs, settle=0.2)
    assert code == 1 and len(sent) == 1 and " stop --pidfile" in sent[0], sent


def test_a_node_whose_job_started_after_the_stop_is_stopped_again(cluster) -> None:  # type: ignore[no-untyped-def]
    """A cancel just after launch: the stop reached node-1 while its job was still starting
    (no pidfile yet), found nothing, and the job ran on (a managed `down` then waited its
    180 s for a controller that never ended the job: seen in a suite run). A node still
    running RESTOP_S after its stop is stopped again."""
    import concurrent.futures

    from provision.job import following

    inv, _ = cluster
    fake = FakeConnector()
    stops = threading.Semaphore(0)
    logged: list[str] = []

    def starts_late() -> int:  # the first stop finds no job; only a later one ends it
        assert stops.acquire(timeout=30), "never stopped"
        assert stops.acquire(timeout=10), "stopped once only: its job runs on"
        return -15

    polls = iter(["cancelled", *[None] * 10_000])
    monitor = type("M", (), {"poll": lambda self: next(polls), "line": lambda *a: None,
                             "finished": lambda *a: None})()
    with concurrent.futures.ThreadPoolExecutor(1) as pool, \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(following, "RESTOP_S", 0.2, raising=False)
        real_stop = following.stop_job
        mp.setattr(following, "stop_job", lambda *a, **k: (real_stop(*a, **k), stops.release()))
        futures = {pool.submit(starts_late): inv.nodes[1]}
        code = following.follow(futures, NodeGroup(inv, connector=fake), logged.append,
                                monitor, None, threading.Event())
    sent = fake.commands("node-1")
    assert code == following.STOPPED and len(sent) >= 2, sent
    assert all(" stop --pidfile" in c for c in sent), sent
    assert logged == ["cancelled; stopping the job on every node"], logged
