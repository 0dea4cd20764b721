"""`mgpu-cloud run --provider k8s` for real on the stand-in cluster: the API server of
tests/providers/k8s/ and a kubelet that runs each pod as a container of the node image on the
local engine, reached over SSH through the API's port-forward. One stand-in for the module.

Each run: every rank sees world 4, rank 0's outputs come back, and afterwards no object
carries the cluster's label and no pod container is left; the queue holds a run until Kueue
admits it; a pod killed mid-run, or deleted through the API, is replaced alone and the job
resumes from its checkpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine import unique
from kit import cli, cli_env, until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "k8s"))

import rbac  # noqa: E402
from standin import Standin  # noqa: E402
from standin_kubelet import STANDIN_LABEL  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Iterator[Standin]:
    s = Standin(tmp_path_factory.mktemp("k8s-standin"), docker=True, image=node_image)
    try:
        yield s
        left = pod_containers(s)  # before stop(), which removes whatever is left
    finally:
        s.stop()
    assert s.api.violations == [], "\n".join(s.api.violations)
    assert left == []
    denied = rbac.denied_to_anyone(s.api.requests)
    assert denied == [], "requests the Role of docs/kubernetes.md does not allow:\n" + \
        "\n".join(denied)


def pod_containers(s: Standin) -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label={STANDIN_LABEL}={s.sid}"],
                          capture_output=True, text=True, check=True).stdout.split()


class K8sRun:
    """`mgpu-cloud run --provider k8s` as a process read line by line."""

    def __init__(self, s: Standin, name: str, args: list[str], cwd: Path) -> None:
        self.lines: list[str] = []
        env = cli_env(None, {**s.env(), "PYTHONUNBUFFERED": "1"})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "provision.cli", "run", "--provider", "k8s", "--name", name,
             "--nodes", "2", *args], cwd=cwd, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait_for(self, pattern: str, timeout: float = 240) -> None:
        assert self.proc.stdout is not None
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stdout:
                self.lines.append(line)
                if re.search(pattern, line):
                    return
        finally:
            timer.cancel()
        raise AssertionError(f"{pattern!r} never appeared:\n{self.output}")

    def finish(self, timeout: float = 400) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines.append(out)
        return self.proc.returncode

    @property
    def output(self) -> str:
        return "".join(self.lines)


def ranks_seen(out: str, world: int) -> None:
    found = sorted(int(m.group(1)) for m in re.finditer(rf"rank (\d+)/{world} on ", out))
    assert found == list(range(world)), out
    assert not re.search(r"rank \d+/1 on", out), "a process ran alone (world size 1)"


def left_nothing(s: Standin, name: str) -> None:
    assert s.labelled(name) == [], s.labelled(name)
    # a pod deleted at once (a finished one: the API does not wait for the kubelet) leaves its
    # container to the kubelet's housekeeping, which removes it soon after
    until(lambda: pod_containers(s) == [], 60, "the stand-in kubelet left containers")


@pytest.mark.parametrize("args,script", [
    (["--launcher", "deepspeed", "--master-port", "29521"], "train_deepspeed.py"),
    (["--launcher", "accelerate", "--master-port", "29522"], "train_accelerate.py"),
], ids=["deepspeed", "accelerate"])
def test_run_trains_world_4_and_leaves_nothing(standin: Standin, tmp_path: Path,
                                               args: list[str], script: str) -> None:
    name = unique("k8s-" + script.split("_")[1].split(".")[0])
    run = K8sRun(standin, name, [*args, str(ROOT / "examples" / script), "--steps", "6"],
                 tmp_path)
    code = run.finish()
    out = run.output
    assert code == 0, out
    ranks_seen(out, 4)
    assert "done: world_size=4" in out, out
    assert "JobSet (jobset.x-k8s.io/v1alpha2)" in out
    fetched = [p for p in (tmp_path / "mgpu-outputs" / name).rglob("*") if p.is_file()]
    assert fetched, "rank 0's outputs were not copied back"
    left_nothing(standin, name)


def test_run_waits_in_the_queue_then_trains_world_4(standin: Standin, tmp_path: Path) -> None:
    """torchrun with the fabric gate, held by Kueue until its quota allows."""
    name = unique("k8s-torchrun")
    standin.add_queue("team-q")
    standin.kueue.quota_pods = 0
    run = K8sRun(standin, name, ["--queue", "team-q", "--fabric-check", "on",
                                 str(ROOT / "examples" / "train_ddp.py"), "--steps", "6"],
                 tmp_path)
    run.wait_for(r"waiting in queue team-q \(.*insufficient unused quota")
    assert not standin.store.list("pods", "default", f"mgpu-cloud-cluster={name}")
    standin.kueue.set_quota(8)
    code = run.finish()
    out = run.output
    assert code == 0, out
    assert "admitted by queue team-q" in out and "fabric gate: pass" in out, out
    ranks_seen(out, 4)
    assert "done: world_size=4" in out and "JobSet (jobset.x-k8s.io/v1alpha2)" in out, out
    assert [p for p in (tmp_path / "mgpu-outputs" / name).rglob("*") if p.is_file()]
    left_nothing(standin, name)


def test_a_killed_pod_is_replaced_alone_and_the_run_resumes(standin: Standin,
                                                            tmp_path: Path) -> None:
    name = unique("k8s-lost")
    run = K8sRun(standin, name, ["--max-restarts", "1", "--max-hours", "1",
                                 str(ROOT / "examples" / "train_ddp.py"), "--steps", "40",
                                 "--save-every", "5", "--sleep", "0.25",
                                 "--hold-once-at-step", "20"], tmp_path)  # lost before its end
    run.wait_for(r"kept checkpoint from node-0: .*step_0000(09|14)")
    pods = standin.store.list("pods", "default", f"mgpu-cloud-cluster={name}")
    assert all(p["spec"]["activeDeadlineSeconds"] == 3600 for p in pods)
    lost = next(p for p in pods
                if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
    kept = next(p for p in pods if p is not lost)
    subprocess.run(["docker", "kill", standin.kubelet.container_name(
        "default", lost["metadata"]["name"])], check=True, capture_output=True)
    code = run.finish()
    out = run.output
    assert code == 0, out
    assert re.search(r"failure: node lost \(node-1\)", out), out
    assert "replacing node-1 (node lost)" in out and "restart 1 of 1" in out, out
    resumed = re.search(r"resumed from step (\d+)", out)
    assert resumed and int(resumed.group(1)) >= 9, out
    metrics = json.loads((tmp_path / "mgpu-outputs" / name / "metrics.json").read_text())
    assert metrics["steps"] == 40 and metrics["world_size"] == 4 and metrics["restart"] == 1
    # alone: node-0's pod is the one it was; node-1's was made again at the same index
    ends = [e for _, kind, res, e in standin.store.events if res == "pods" and kind == "ADDED"
            and e["metadata"]["labels"].get("mgpu-cloud-cluster") == name]
    assert [e["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
            for e in ends] .count("0") == 1, [e["metadata"]["name"] for e in ends]
    assert kept["metadata"]["uid"] in {e["metadata"]["uid"] for e in ends}
    left_nothing(standin, name)


def test_a_pod_deleted_under_a_running_job_is_replaced_and_the_run_resumes(
        standin: Standin, tmp_path: Path) -> None:
    """`kubectl delete pod` mid-run (what a drain, an eviction, a preemption do): the kubelet
    TERMs the pod's shell, the pod ends Failed (exit 143), the Job makes a new pod at that
    index, and the run resumes from its checkpoint. (A shell exiting 0 on TERM ends the pod
    Succeeded: the Job counts the index complete and never makes it again.) The pod goes
    while the ranks are held at step 20, after step 19's save: no save can follow its notice,
    and the wait for one ends when the pod is gone (5 s of grace), not 90 s later."""
    from kubernetes import client, config

    name = "k8s-deleted"
    run = K8sRun(standin, name, ["--max-restarts", "1", str(ROOT / "examples" /
                                                            "train_ddp.py"),
                                 "--steps", "40", "--save-every", "5", "--sleep", "0.25",
                                 "--hold-once-at-step", "20"],  # lost before its end
                 tmp_path)
    run.wait_for(r"kept checkpoint from node-0: .*step_000019")
    pods = standin.store.list("pods", "default", f"mgpu-cloud-cluster={name}")
    lost = next(p for p in pods
                if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
    api = config.new_client_from_config(config_file=str(standin.kubeconfig))
    client.CoreV1Api(api).delete_namespaced_pod(lost["metadata"]["name"], "default")
    code = run.finish()
    out = run.output
    assert code == 0, out
    assert "replacing node-1" in out and "restart 1 of 1" in out, out
    assert "no checkpoint was saved within" not in out, out  # the notice's wait: not 90 s
    resumed = re.search(r"resumed from step (\d+)", out)
    assert resumed and int(resumed.group(1)) == 19, out
    ended = [e["status"]["phase"] for _, _, res, e in list(standin.store.events)
             if res == "pods" and e["metadata"]["uid"] == lost["metadata"]["uid"]
             and e.get("status", {}).get("phase") in ("Failed", "Succeeded")]
    assert ended and ended[-1] == "Failed", ended
    metrics = json.loads((tmp_path / "mgpu-outputs" / name / "metrics.json").read_text())
    assert metrics["steps"] == 40 and metrics["world_size"] == 4 and metrics["restart"] == 1
    left_nothing(standin, name)


def test_day2_jobs_logs_exec_cancel_monitor(standin: Standin, tmp_path: Path) -> None:
    """The day-2 commands through the pods' transport, as on the other providers."""
    name, env = "k8s-day2", standin.env()
    res = cli("up", "--provider", "k8s", "--nodes", "2", "--name", name, home=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    try:
        res = cli("launch", name, "-d", "--", str(ROOT / "examples" / "train_ddp.py"),
                  "--steps", "100000", "--sleep", "0.2", home=tmp_path, env=env)
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip()
        deadline = time.monotonic() + 180
        while "step 0 loss" not in cli("logs", name, job, home=tmp_path, env=env).stdout:
            assert time.monotonic() < deadline, "the job never started training"
            time.sleep(1)
        running = cli("exec", name, "--", "pgrep -c -f '[t]rain_ddp.py'", home=tmp_path, env=env)
        assert running.stdout.count("exit 0") == 2, running.stdout
        mon = cli("monitor", name, "--once", "--json", home=tmp_path, env=env)
        assert mon.returncode == 0, mon.stderr
        assert [n["node"] for n in json.loads(mon.stdout)["nodes"]] == ["node-0", "node-1"]
        res = cli("cancel", name, job, "--grace", "5", home=tmp_path, env=env)
        assert res.returncode == 0 and f"job {job}: cancelled" in res.stdout, res.stderr
        left = cli("exec", name, "--", "pgrep -f '[t]rain_ddp.py' || echo none", home=tmp_path,
                   env=env)
        assert left.stdout.count("none") == 2, left.stdout
    finally:
        down = cli("down", name, home=tmp_path, env=env)
        assert down.returncode == 0, down.stderr
    left_nothing(standin, name)


def test_an_attached_run_keeps_its_checkpoints_in_the_store(standin: Standin, tmp_path: Path,
                                                            s3_store: Any) -> None:
    """--store s3:// (moto's server at an address the pods reach): the pods push their
    checkpoints to the store themselves, as docker nodes do."""
    import boto3

    name = unique("k8s-store")
    run = K8sRun(standin, name, ["--store", s3_store.url, str(ROOT / "examples" /
                                                              "train_ddp.py"),
                                 "--steps", "6", "--save-every", "5"], tmp_path)
    code = run.finish()
    out = run.output
    assert code == 0, out
    bucket, prefix = s3_store.url.removeprefix("s3://").split("/", 1)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/{name}/").get("Contents", [])]
    assert any("/data/" in k and "checkpoints/" in k and k.endswith(".pt") for k in keys), keys
    left_nothing(standin, name)


def test_a_detached_run_ends_its_pods_succeeded(standin: Standin, tmp_path: Path) -> None:
    """`run --detach`: when the job has ended each pod stops itself (ProviderInfo.self_stop),
    Succeeded, its index complete (not made again), holding no quota; `down` removes them."""
    name, env = "k8s-detached", standin.env()
    res = cli("run", "--provider", "k8s", "--nodes", "2", "--name", name, "--detach",
              "--idle-minutes", "0", str(ROOT / "examples" / "train_ddp.py"), "--steps", "4",
              home=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert "each pod ends itself (Succeeded)" in res.stderr, res.stderr
    deadline = time.monotonic() + 240
    while True:
        phases = sorted(p.get("status", {}).get("phase", "") for p in standin.store.list(
            "pods", "default", f"mgpu-cloud-cluster={name}"))
        if phases == ["Succeeded", "Succeeded"]:
            break
        assert time.monotonic() < deadline, phases
        time.sleep(1)
    down = cli("down", name, home=tmp_path, env=env)
    assert down.returncode == 0, down.stderr
    left_nothing(standin, name)
