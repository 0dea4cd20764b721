"""Managed runs on the k8s stand-in (issue 43): `run --detach --store s3://` returns while the
job runs; the controller is a pod of the cluster, calling the stand-in's API over HTTPS as
its own ServiceAccount (every request judged by its Role) and reaching the nodes at their
pod IPs. A node pod lost is replaced by it; then the controller pod itself is lost, and a
node with it: the user's next `jobs` takes the job back (a new controller pod), which
recovers the node, finishes, and removes the cluster, itself last; a later `jobs` removes
the identity it left. The pods and the controller reach moto's S3 at the docker0 address.
While it runs, `ssh` and `ssh-config` reach the pods (real OpenSSH through the relay)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import cli
from managedkit import events, log_text, steps_in, wait_for
from storekit import StoreServer

from remote.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "k8s"))

from standin import Standin, checked  # noqa: E402
from standin_kubelet import STANDIN_LABEL  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")


@pytest.fixture
def standin(tmp_path: Path, node_image: str) -> Iterator[Standin]:
    with checked(Standin(tmp_path, docker=True, image=node_image)) as s:
        yield s


def kill_pod(s: Standin, name: str, selector: str) -> str:
    """`docker kill` of the container of the pod matching `selector`: its node is gone."""
    [pod] = s.store.list("pods", "default", selector)
    subprocess.run(["docker", "kill", s.kubelet.container_name("default",
                                                              pod["metadata"]["name"])],
                   check=True, capture_output=True)
    return str(pod["metadata"]["uid"])


def node(name: str, rank: int) -> str:
    return f"mgpu-cloud-cluster={name},batch.kubernetes.io/job-completion-index={rank}"


def ssh_reaches_the_pods(name: str, home: Path, env: dict[str, str], tmp_path: Path) -> None:
    """`ssh` and `ssh-config` (real OpenSSH, the pods' sshd): through the tool's own
    port-forward relay, each pod's host key pinned (another known_hosts: refused)."""
    batch = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=30"]
    sshed = cli("ssh", name, "--node", "1", *batch, "hostname", home=home, env=env)
    assert (sshed.returncode, sshed.stdout.strip()) == (0, f"{name}-node-0-1"), sshed.stderr
    res = cli("ssh-config", name, home=home, env=env)
    assert res.returncode == 0, res.stderr
    config = tmp_path / "ssh_config"
    config.write_text(res.stdout)
    run_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run(["ssh", "-F", str(config), *batch, name, "hostname"], env=run_env,
                        capture_output=True, text=True, timeout=90)
    assert (ok.returncode, ok.stdout.strip()) == (0, f"{name}-node-0-0"), ok.stderr
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    config.write_text(re.sub(r"UserKnownHostsFile \S+", f"UserKnownHostsFile {empty}",
                             res.stdout))
    refused = subprocess.run(["ssh", "-F", str(config), *batch, f"{name}-node-1", "hostname"],
                             env=run_env, capture_output=True, text=True, timeout=90)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr


def test_a_managed_k8s_run_survives_a_lost_pod_and_a_lost_controller_pod(
        standin: Standin, tmp_path: Path, s3_store: StoreServer) -> None:
    name = f"k8m-{secrets.token_hex(3)}"
    url = s3_store.url
    env = {**standin.env(), **s3_store.env, "MGPU_CONTROLLER_LOST_S": "8"}
    home = tmp_path / "home"
    home.mkdir()
    res = cli("run", "--detach", "--provider", "k8s", "--nodes", "2", "--name", name,
              "--max-restarts", "3", "--store", url, EXAMPLE, "--steps", "140",
              "--save-every", "5", "--sleep", "0.25", home=home, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "1", res.stdout + res.stderr
    at_return = events(url, name)
    assert "started" in at_return and "finished" not in at_return, at_return
    ctl = standin.store.get("pods", "default", f"{name}-controller")
    assert ctl["spec"]["serviceAccountName"] == f"{name}-controller"
    ssh_reaches_the_pods(name, home, env, tmp_path)
    ckpts = f"{name}/data/jobs/1/checkpoints"
    # 1. a node pod lost: the controller (in the cluster) replaces it
    wait_for(lambda: steps_in(url, ckpts), 240, "no checkpoint reached the store")
    kill_pod(standin, name, node(name, 1))
    wait_for(lambda: "resumed" in events(url, name), 300, "no resume after node-1")
    # 2. the controller pod lost, then a node while nobody supervises
    first = max(steps_in(url, ckpts))
    wait_for(lambda: max(steps_in(url, ckpts)) > first, 180, "no newer checkpoint")
    kill_pod(standin, name, f"mgpu-cloud-cluster={name},mgpu-cloud-role=controller")
    time.sleep(3)  # the job runs on without it
    kill_pod(standin, name, node(name, 0))
    time.sleep(10)  # the heartbeat goes stale
    assert "taken_back" not in events(url, name)
    jobs = cli("jobs", name, home=home, env=env)
    assert jobs.returncode == 0, jobs.stdout + jobs.stderr
    assert "taking the job back" in jobs.stderr and "making a new one" in jobs.stderr, \
        jobs.stderr
    wait_for(lambda: "torn_down" in events(url, name) or "failed" in events(url, name),
             480, "the run did not end")
    got = events(url, name)
    assert got.count("finished") == 1 and "failed" not in got, got
    back = got.index("taken_back")  # node-1 recovered before, node-0 after the take-back
    assert got[:back].count("replaced") == 1 and "resumed" in got[:back], got
    after = got[back:]
    assert after.index("node_lost") < after.index("replaced") < after.index("finished"), got
    assert got[-1] == "torn_down", got
    # the controllers called the API as their ServiceAccount (judged by its Role), never as
    # the user: the stand-in records who sent each request
    as_ctl = {r.method for r in standin.api.requests
              if r.who == f"system:serviceaccount:default:{name}-controller"}
    assert {"GET", "DELETE"} <= as_ctl, as_ctl
    resumed = [int(m) for m in re.findall(r"\[node-0\] resumed from step (\d+)",
                                          log_text(url, name))]
    assert len(resumed) >= 2 and resumed[-1] > resumed[0] > 0, resumed
    metrics = json.loads(open_store(url).get_bytes(f"{name}/data/jobs/1/outputs/metrics.json")
                         or b"{}")
    assert metrics["steps"] == 140 and metrics["world_size"] == 4, metrics
    # its own pod goes last (TERM, then gone); what it could not remove (its identity) goes
    # with the next `jobs`
    identity = ["rolebindings", "roles", "serviceaccounts"]
    wait_for(lambda: sorted(x.split("/")[-3] for x in standin.labelled(name)) == identity, 60,
             f"the controller pod is not gone: {standin.labelled(name)}")
    again = cli("jobs", name, "--json", home=home, env=env)
    assert again.returncode == 0, again.stderr
    [job] = json.loads(again.stdout)
    assert job["state"] == "succeeded" and job["torn_down"], job
    assert standin.labelled(name) == []
    assert subprocess.run(["docker", "ps", "-aq", "--filter",
                           f"label={STANDIN_LABEL}={standin.sid}"], capture_output=True,
                          text=True, check=True).stdout.split() == []
