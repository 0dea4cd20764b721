"""What a real cluster does that surprises, and the provider meeting it (stand-in with the
kubelet that runs nothing; the exit codes of a real pod's shell are test_k8s_pods_docker.py's):
a lost node's pods (forced, replaced), Kueue (the `default` LocalQueue, v1beta2, the newest
condition), ResourceQuota and Pod Security refusals, the deadline as an absolute end, image
pulls, several placement labels, the README's dry run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kit import until
from standin import OnLog, Standin

from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Recoverable
from provision.model.errors import CapacityError, ProvisionError, SpecError, UserInputError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"


def provider() -> Recoverable[Any]:
    prov = get_provider("k8s")
    assert isinstance(prov, Recoverable)
    return prov


def pods_of(s: Standin, cluster: str = "c1") -> list[dict[str, Any]]:
    return s.store.list("pods", "default", f"mgpu-cloud-cluster={cluster}")


# --- the stand-in's model, shown -----------------------------------------------------------
def test_standin_a_deleted_pod_whose_process_exits_0_completes_its_index(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    """The surprise of issue 43: exit 0 on TERM is Succeeded, and the Job controller counts
    the index complete: no new pod, ever. Exit 143: Failed, a new pod."""
    inv = up(make_spec())
    standin.kubelet.term_exit_code = 0
    standin.api.delete("pods", "default", inv.nodes[1].address)
    until(lambda: not any(p["metadata"]["name"] == inv.nodes[1].address for p in pods_of(
        standin)))
    time.sleep(0.5)  # the controller resyncs every 0.2 s: it would have made one by now
    assert [p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
            for p in pods_of(standin)] == ["0"]
    standin.kubelet.term_exit_code = 143
    standin.api.delete("pods", "default", inv.nodes[0].address)
    new = until(lambda: [p for p in pods_of(standin)
                         if p["metadata"]["uid"] != inv.nodes[0].resource_id])
    assert new[0]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"


def test_standin_graceful_deletion_on_a_lost_node_never_completes_podgc_frees_it(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    inv = up(make_spec())
    lost = inv.nodes[1].address
    node = standin.kubelet.lose_node(lost)
    standin.nodes.monitor_grace_s = 0.05
    until(lambda: any(c["type"] == "Ready" and c["status"] == "False" for c in standin.store.get(
        "pods", "default", lost)["status"]["conditions"]))
    pod = standin.store.get("pods", "default", lost)
    assert pod["status"]["phase"] == "Running"  # nothing on the node can say otherwise
    assert {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 300} in pod["spec"]["tolerations"]
    standin.api.delete("pods", "default", lost)
    time.sleep(0.5)
    pod = standin.store.get("pods", "default", lost)  # terminating for good: its index too
    assert pod["metadata"]["deletionTimestamp"] and len(pods_of(standin)) == 2
    standin.store.update("nodes", "", node, lambda o: o["spec"]["taints"].append(
        {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}))
    until(lambda: all(p["metadata"]["name"] != lost for p in pods_of(standin))
          and len(pods_of(standin)) == 2)  # PodGC failed it, deleted it; a new pod came


def test_standin_a_terminal_phase_is_final(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    """A container that exits at once may be seen ended before its start is reported: the
    later Running (or an image wait's Pending) must not take the pod out of Succeeded, or
    it would live on in the store until a deadline (a suite run's failure, kubelet_pods.go)."""
    inv = up(make_spec(k8s={"api": "pods"}))
    pod = standin.store.get("pods", "default", inv.nodes[0].address)
    standin.kubelet.ended(pod, 0, "Completed")
    standin.kubelet.running(pod, "10.244.0.99")
    standin.kubelet.waiting(pod, "ImagePullBackOff", "Back-off pulling image")
    status = standin.store.get("pods", "default", inv.nodes[0].address)["status"]
    assert status["phase"] == "Succeeded" and status.get("podIP") != "10.244.0.99", status


# --- 1, 2: a lost pod is freed and replaced ------------------------------------------------
@pytest.mark.parametrize("mode", ["jobset", "pods"])
def test_a_pod_on_a_lost_node_is_not_alive_and_is_forced_and_replaced(
        standin: Standin, mode: str, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
        caplog: pytest.LogCaptureFixture) -> None:
    """Its pod reads Running (for 300 s and more); the node controller marks it not Ready;
    graceful deletion would never end there: the provider forces it (Failed +
    DisruptionTarget, grace 0) and the new pod comes."""
    inv = up(make_spec(k8s={"api": mode, "ready_timeout_s": 20}))
    prov = provider()
    lost = inv.nodes[1]
    standin.kubelet.lose_node(lost.address)
    standin.nodes.monitor_grace_s = 0.05
    until(lambda: not prov.node_alive(inv, lost))
    with caplog.at_level("INFO", logger="mgpu_cloud"):
        new = prov.replace(inv, store, lost)
    assert new.resource_id != lost.resource_id and prov.node_alive(inv, new)
    assert "node is not ready" in caplog.text and "forcing its deletion" in caplog.text
    forced = [e for _, kind, res, e in standin.store.events if res == "pods"
              and e["metadata"]["uid"] == lost.resource_id
              and e.get("status", {}).get("phase") == "Failed"]
    assert forced and any(c["type"] == "DisruptionTarget" and c["reason"] ==
                          "DeletionByMgpuCloud" for c in forced[-1]["status"]["conditions"])
    if mode == "jobset":  # ignored by the podFailurePolicy: no count against backoffLimit
        js = standin.store.get(JOBSETS, "default", "c1")
        assert standin.jobsets.jobs[js["metadata"]["uid"]].failed == 0


def test_freeing_a_pod_leaves_another_pod_made_under_its_name(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod read, then made again under its name (plain pods; someone's replace) before the
    DELETE: the DELETE carries the uid read as its precondition, the API answers 409, and
    the new pod stays as it was (by name alone it would be deleted; waited on as if it were
    the old one, it would be forced Failed FORCE_AFTER_S later)."""
    import copy

    from provision.cluster.providers.k8s import deletion
    from provision.cluster.providers.k8s.client import kube

    inv = up(make_spec(k8s={"api": "pods"}))
    name = inv.nodes[1].address
    k = kube("default", None)
    read = deletion.read_pod
    reads = []

    def first_read_before_it_was_made_again(k: Any, pod_name: str) -> Any:
        pod = read(k, pod_name)
        if not reads:  # the first read is of the earlier pod; later ones see the new one
            pod = copy.deepcopy(pod)
            pod.metadata.uid = "uid-of-the-pod-deleted-meanwhile"
        reads.append(pod.metadata.uid)
        return pod

    monkeypatch.setattr(deletion, "read_pod", first_read_before_it_was_made_again)
    deletion.free_pod(k, name, "c1", lambda m: None)
    pod = standin.store.get("pods", "default", name)
    assert pod["metadata"]["uid"] == inv.nodes[1].resource_id
    assert not pod["metadata"].get("deletionTimestamp")
    assert pod["status"]["phase"] == "Running" and not any(
        c["type"] == "DisruptionTarget" for c in pod["status"].get("conditions", [])), pod
    assert reads[1:] == [inv.nodes[1].resource_id], reads  # seen as another pod: left alone
    deletes = [r for r in standin.api.requests if r.method == "DELETE" and name in r.path]
    assert deletes and all(r.body["preconditions"] == {"uid": "uid-of-the-pod-deleted-meanwhile"}
                           for r in deletes)


# --- 3, 4: Kueue ----------------------------------------------------------------------------
def test_kueue_holds_a_jobset_made_without_queue_when_localqueue_default_exists(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.add_queue("default")
    standin.kueue.quota_pods = 1
    with OnLog("waiting in queue default", lambda m: standin.kueue.set_quota(4)) as said:
        inv = up(make_spec(k8s={"ready_timeout_s": 5}))
    assert len(inv.nodes) == 2
    assert said.seen and "insufficient unused quota for pods" in said.seen[0], said.seen
    posted = next(r.body for r in standin.api.requests if r.method == "POST"
                  and r.path.endswith("/jobsets"))
    assert "suspend" not in posted["spec"]  # Kueue's webhook suspended it, not the provider


def test_kueue_managing_jobs_without_queue_name_is_said_with_the_fix(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.api.manage_jobs_without_queue_name = True
    with pytest.raises(CapacityError, match="manageJobsWithoutQueueName") as exc:
        up(make_spec(k8s={"queue_timeout_s": 0.3, "ready_timeout_s": 5}))
    assert "--queue" in (exc.value.hint or "")
    assert standin.labelled("c1") == []


def test_kueue_v1beta2_only(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                            make_spec: Callable[..., ClusterSpec],
                            up: Callable[[ClusterSpec], Inventory]) -> None:
    """A Kueue that dropped v1beta1 (its removal is planned): the queue is still found and
    waited on."""
    s = Standin(tmp_path, kueue_versions=("v1beta2",))
    try:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        s.add_queue("team-a")
        s.kueue.quota_pods = 0
        with OnLog("waiting in queue team-a", lambda m: s.kueue.set_quota(4)):
            inv = up(make_spec(k8s={"queue": "team-a"}))
        assert len(inv.nodes) == 2
        kueue = {r.path.split("/")[3] for r in s.api.requests if "kueue.x-k8s.io" in r.path}
        assert kueue == {"v1beta2"}
    finally:
        s.stop()


def test_the_queue_reason_is_the_newest_condition(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    """After an eviction Kueue's list ends with Evicted; the news is QuotaReserved, changed in
    place at the list's head."""
    from provision.cluster.providers.k8s.client import kube
    from provision.cluster.providers.k8s.queue import queue_reason

    standin.add_queue("team-a")
    up(make_spec(k8s={"queue": "team-a"}))
    standin.kueue.quota_pods = 1
    standin.kueue.evict("default", "c1")
    standin.kueue._pass()
    uid = standin.store.get(JOBSETS, "default", "c1")["metadata"]["uid"]
    wl = standin.store.list("kueue.x-k8s.io/v1beta2/workloads", "default")[0]
    assert [c["type"] for c in wl["status"]["conditions"]][-1] == "Evicted"
    assert "insufficient unused quota" in queue_reason(kube("default", None), uid)


def test_a_clusterqueue_without_efa_is_said(standin: Standin,
                                            make_spec: Callable[..., ClusterSpec],
                                            up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.add_queue("team-a")
    standin.kueue.covered = {"cpu", "memory", "nvidia.com/gpu", "hugepages-2Mi"}
    with pytest.raises(CapacityError, match="resource vpc.amazonaws.com/efa unavailable in "
                                            "ClusterQueue"):
        up(make_spec(gpus_per_node=8, k8s={"queue": "team-a", "fabric": "efa",
                                           "node_type": "p5.48xlarge", "queue_timeout_s": 0.3}))


# --- 6, 7: admission: Pod Security, ResourceQuota --------------------------------------------
def test_a_baseline_namespace_refuses_the_tcpxo_preset_by_name(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.store.update("namespaces", "", "default", lambda o: o["metadata"].update(
        labels={"pod-security.kubernetes.io/enforce": "baseline"}))
    with pytest.raises(UserInputError, match="Pod Security level refuses") as exc:
        up(make_spec(gpus_per_node=8, k8s={"fabric": "tcpxo", "node_type": "a3-megagpu-8g",
                                           "ready_timeout_s": 20}))
    assert "hostPath volumes" in exc.value.message and '"NET_ADMIN"' in exc.value.message
    assert standin.labelled("c1") == []


@pytest.mark.parametrize("mode", ["jobset", "pods"])
def test_a_compute_quota_admits_the_pods_and_a_full_one_is_named(
        standin: Standin, mode: str, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    """Pods without requests are refused by any cpu/memory quota ("must specify"); with
    them they fit, and a quota too small is said as the quota (JobSet: only the Job's
    FailedCreate event says it)."""
    standin.add_quota("compute", {"requests.cpu": "4", "requests.memory": "8Gi"})
    inv = up(make_spec(k8s={"api": mode, "ready_timeout_s": 20}))
    assert len(inv.nodes) == 2
    with pytest.raises(CapacityError, match="ResourceQuota is full: .*exceeded quota: compute"):
        up(make_spec(name="c2", k8s={"api": mode, "ready_timeout_s": 20}))
    assert standin.labelled("c2") == []


def test_requests_come_from_the_node_type() -> None:
    from provision.cluster.providers.k8s.nodetypes import pod_resources

    assert pod_resources("p5.48xlarge", 8, 8, None, None) == ("172", "1843Gi", True)
    assert pod_resources("p5.48xlarge", 4, 4, None, None) == ("86", "921Gi", True)
    assert pod_resources("a3-megagpu-8g", 8, 8, "100", None) == ("100", "1684Gi", True)
    assert pod_resources(None, 0, 2, None, None) == ("2", "4Gi", False)
    with pytest.raises(UserInputError, match="not a machine type this tool knows"):
        pod_resources("p9.huge", 8, 8, None, None)


def test_the_aws_node_types_are_what_ec2_says() -> None:
    """Against moto's copy of DescribeInstanceTypes."""
    import gzip
    import json
    from pathlib import Path

    import moto

    from provision.cluster.providers.k8s.nodetypes import NODE_TYPES

    data = json.loads(gzip.decompress((Path(moto.__file__).parent / "ec2" / "resources" /
                                       "instance_types.json.gz").read_bytes()))
    for name, (vcpus, mem_gib, gpus) in NODE_TYPES.items():
        if "." in name:
            it = data[name]
            assert (it["VCpuInfo"]["DefaultVCpus"], it["MemoryInfo"]["SizeInMiB"] // 1024,
                    it["GpuInfo"]["Gpus"][0]["Count"]) == (vcpus, mem_gib, gpus), name


# --- 8: the deadline is an absolute end ---------------------------------------------------
@pytest.mark.parametrize("mode", ["jobset", "pods"])
def test_a_replacement_gets_only_what_is_left_of_max_hours(
        standin: Standin, mode: str, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    import datetime as dt

    inv = up(make_spec(max_hours=1, k8s={"api": mode}))
    end = int((dt.datetime.fromisoformat(inv.created_at).replace(tzinfo=dt.UTC)
               + dt.timedelta(hours=1)).timestamp())
    inv.created_at = (dt.datetime.fromisoformat(inv.created_at)
                      - dt.timedelta(minutes=30)).isoformat()  # half of it is gone
    store.save(inv)
    standin.kubelet.ended(standin.store.get("pods", "default", inv.nodes[1].address), 137,
                          "Error")
    new = provider().replace(inv, store, inv.nodes[1])
    pod = standin.store.get("pods", "default", new.address)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    if mode == "jobset":  # the template made at `up`: the Job's new pods end at the end
        assert int(env["MGPU_END_UNIX"]) == end
    else:  # made again now, from the (older) creation time
        assert int(env["MGPU_END_UNIX"]) in (end - 1800, end - 1801)
        assert 1700 < pod["spec"]["activeDeadlineSeconds"] <= 1800


# --- 9: image pulls -------------------------------------------------------------------------
def test_a_transient_pull_error_is_waited_out_and_said(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.kubelet.pull_backoff_s = 0.3
    standin.kubelet.pull_failures[standin.image] = 4  # per pull, any pod: 4 failures in all
    with OnLog("waits for its image", lambda m: None) as said:
        inv = up(make_spec(k8s={"ready_timeout_s": 30}))
    assert len(inv.nodes) == 2
    assert any("ErrImagePull" in m and "i/o timeout" in m for m in said.seen), said.seen
    assert any("ImagePullBackOff" in m and "the kubelet retries" in m for m in said.seen)


def test_a_missing_image_ends_up_after_the_pulls_and_a_bad_name_at_once(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    standin.kubelet.pull_backoff_s = 0.02
    standin.kubelet.missing_images.add(standin.image)
    with pytest.raises(ProvisionError, match="could not be pulled in 3 tries: .*not found"):
        up(make_spec(k8s={"ready_timeout_s": 60, "pull_attempts": 3}))
    assert standin.labelled("c1") == []
    with pytest.raises(ProvisionError, match="InvalidImageName"):
        up(make_spec(name="c2", k8s={"image": "Registry/Bad Image", "ready_timeout_s": 60}))
    assert "Registry/Bad Image" not in standin.kubelet.pulls  # never tried


# --- 11, 12: placement, the README's dry run -------------------------------------------------
def test_several_placement_labels_from_yaml_and_the_cli(
        standin: Standin, make_spec: Callable[..., ClusterSpec], tmp_path: Any) -> None:
    from kit import cli

    spec = make_spec(k8s={"placement": ["node.kubernetes.io/instance-type=p5.48xlarge",
                                        "topology.kubernetes.io/zone=us-east-1a"]})
    assert len(spec.options_as(type(spec.k8s)).placement) == 2  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match="write it as KEY=VALUE"):
        make_spec(k8s={"placement": ["gpu h100"]})
    dry = cli("up", "--provider", "k8s", "--nodes", "2", "--name", "dry", "--dry-run",
              "--placement", "a.example/pool=x,gpu=h100", home=tmp_path, env=standin.env())
    assert dry.returncode == 0, dry.stderr
    assert "key: a.example/pool" in dry.stderr and "key: gpu" in dry.stderr


def test_the_readme_dry_run_exits_0_and_lists_the_image(standin: Standin, tmp_path: Any) -> None:
    from kit import cli

    env = {**standin.env(), "MGPU_CLOUD_K8S_IMAGE": ""}
    dry = cli("up", "--provider", "k8s", "--nodes", "4", "--dry-run", home=tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "unresolved: the pods' image is not set: --pod-image IMAGE" in dry.stderr
    assert "kind: JobSet" in dry.stderr and "dry run: nothing was created" in dry.stderr
    real = cli("up", "--provider", "k8s", "--nodes", "4", "--name", "noimage", home=tmp_path,
               env=env, stdin="y\n")
    assert real.returncode == 2 and "the pods' image is not set" in real.stderr, real.stderr
    assert standin.labelled() == []
