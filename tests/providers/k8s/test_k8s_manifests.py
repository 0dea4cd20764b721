"""The manifests, pure: golden files per fabric preset (regenerate with UPDATE_GOLDEN=1 and
review the diff), each judged by the official schemas (Kubernetes 1.30 and 1.33, 1.34 for
DRA; the JobSet CRD) and by the Pod Security level the preset says it needs, and the rules
the provider relies on, one test each."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import k8s_schemas
import pytest
import yaml
from standin import Standin
from standin_admission import level_of, pod_security

from provision.cluster.providers.k8s.fabric import (
    EFA_RESOURCE,
    GKE_INTERFACES,
    POD_SECURITY,
    TAS_REQUIRED,
    fabric_env,
)
from provision.cluster.providers.k8s.manifests import (
    INDEX_LABEL,
    cluster_manifests,
    jobset,
    placeholder_manifests,
    plain_pod,
)
from provision.cluster.providers.k8s.request import K8sRequest

GOLDEN = Path(__file__).parent / "golden"
BASE = dict(cluster="c1", namespace="ml", context=None, mode="jobset", nodes=2, gpus=0,
            slots=2, image="registry.example/mgpu-node:1", cpu="2", memory="4Gi")
P5 = dict(gpus=8, slots=8, cpu="172", memory="1843Gi", guaranteed=True, node_type="p5.48xlarge")
A3 = dict(gpus=8, slots=8, cpu="187", memory="1684Gi", guaranteed=True)
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-jobset": {},
    # Kubernetes' well-known labels (kubernetes.io/docs/reference/labels-annotations-taints),
    # which EKS nodes carry: the machine type and the zone (one placement group lives in one)
    "eks-efa-jobset": dict(**P5, fabric="efa", efa_devices=32, deadline_s=28800,
                           placement=["node.kubernetes.io/instance-type=p5.48xlarge",
                                      "topology.kubernetes.io/zone=us-east-1a"]),
    "eks-efa-dra-jobset": dict(**P5, fabric="efa", efa_devices=32, efa_dra=True),
    "gke-tcpxo-kueue-tas": dict(**A3, node_type="a3-megagpu-8g", fabric="tcpxo",
                                queue="team-a", topology="cloud.google.com/gce-topology-block"),
    "gke-tcpx-pods": dict(**A3, node_type="a3-highgpu-8g", mode="pods", nodes=3, fabric="tcpx",
                          placement=["cloud.google.com/gke-placement-group=pg-1",
                                     "cloud.google.com/gke-accelerator=nvidia-h100-80gb"]),
    "gke-rdma-jobset": dict(gpus=8, slots=8, cpu="201", memory="2656Gi", guaranteed=True,
                            node_type="a3-ultragpu-8g", fabric="rdma"),
}


def request(**over: Any) -> K8sRequest:
    return K8sRequest(**{**BASE, **over})


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_golden_manifests_pass_the_official_schemas(preset: str) -> None:
    req = request(**PRESETS[preset])
    docs = placeholder_manifests(req)
    for doc in docs:
        assert k8s_schemas.problems(doc) == [], doc["kind"]
    # the Pod Security level the preset says it needs is the strictest that admits its pods
    pod = jobset(req)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"] \
        if req.mode == "jobset" else plain_pod(req, 0)["spec"]
    assert level_of(pod) == POD_SECURITY[req.fabric]
    text = yaml.safe_dump_all(docs, sort_keys=False)
    path = GOLDEN / f"{preset}.yaml"
    if os.environ.get("UPDATE_GOLDEN") and (not path.exists() or path.read_text() != text):
        path.write_text(text)
        pytest.fail(f"golden file {path} rewritten: review `git diff`, then rerun")
    assert text == path.read_text(), f"{path} differs (UPDATE_GOLDEN=1 rewrites it)"


def test_the_schema_check_can_fail() -> None:
    js = jobset(request())
    js["spec"]["replicatedJobs"][0]["replicas"] = "1"
    js["spec"]["failurePolicy"]["maxRestart"] = 0  # a typo: no such field
    found = "\n".join(k8s_schemas.problems(js))
    assert "'1' is not of type 'integer'" in found and "'maxRestart' was unexpected" in found
    pod = plain_pod(request(mode="pods"), 0)
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "22"
    found = "\n".join(k8s_schemas.problems(pod))
    assert "k8s 1.30.0" in found and "k8s 1.33.0" in found


def test_a_lost_pod_never_restarts_the_whole_jobset() -> None:
    spec = jobset(request(deadline_s=3600))["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 0}
    job = spec["replicatedJobs"][0]["template"]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 2
    assert job["podReplacementPolicy"] == "Failed"
    assert job["podFailurePolicy"]["rules"][0] == {"action": "Ignore", "onPodConditions": [
        {"type": "DisruptionTarget", "status": "True"}]}
    assert job["activeDeadlineSeconds"] == 3600
    assert job["template"]["spec"]["activeDeadlineSeconds"] == 3600


def test_pods_get_no_api_token_requests_always_and_gpus_only_when_asked() -> None:
    cpu = jobset(request())["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert cpu["automountServiceAccountToken"] is False and cpu["enableServiceLinks"] is False
    # never BestEffort (evicted first, refused by a compute quota): requests always
    assert cpu["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    assert "tolerations" not in cpu
    gpu = plain_pod(request(mode="pods", gpus=4, cpu="40", memory="400Gi", guaranteed=True),
                    1)["spec"]
    assert gpu["containers"][0]["resources"] == {
        "requests": {"cpu": "40", "memory": "400Gi"},
        "limits": {"cpu": "40", "memory": "400Gi", "nvidia.com/gpu": "4"}}
    assert gpu["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    assert {"name": "MGPU_RANK", "value": "1"} in gpu["containers"][0]["env"]


def test_efa_as_aws_publishes_it() -> None:
    """Devices through the device plugin or the DRA driver, huge pages, libfabric's settings
    in the job's environment, and never FI_EFA_USE_DEVICE_RDMA=1 (libfabric aborts where
    the EFA device has no RDMA)."""
    req = request(mode="pods", **P5, fabric="efa", efa_devices=32)
    res = plain_pod(req, 0)["spec"]["containers"][0]["resources"]
    assert res["limits"][EFA_RESOURCE] == res["requests"][EFA_RESOURCE] == "32"
    assert res["limits"]["hugepages-2Mi"] == res["requests"]["hugepages-2Mi"] == "5120Mi"
    env = fabric_env(req)
    assert env["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in env
    dra = request(**P5, fabric="efa", efa_devices=16, efa_dra=True)
    docs = placeholder_manifests(dra)
    claim = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    assert claim["metadata"]["labels"] == {"mgpu-cloud-cluster": "c1"}
    assert claim["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "efa.networking.k8s.aws", "allocationMode": "ExactCount",
        "count": 16}
    pod = jobset(dra)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "efa", "resourceClaimTemplateName": "c1-efa"}]
    assert pod["containers"][0]["resources"]["claims"] == [{"name": "efa"}]
    assert EFA_RESOURCE not in pod["containers"][0]["resources"]["limits"]


def test_tcpxo_as_gke_publishes_it_and_needs_privileged() -> None:
    req = request(**A3, fabric="tcpxo", queue="q", topology="rack")
    tcpxo = jobset(req)
    template = tcpxo["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    meta, spec = template["metadata"], template["spec"]
    assert meta["annotations"][TAS_REQUIRED] == "rack"
    assert meta["annotations"][GKE_INTERFACES].count("interfaceName") == 9  # eth0 + 8 NICs
    assert "/dev/dmabuf_import_helper" in meta["annotations"][
        "devices.gke.io/container.tcpxo-daemon"]
    daemon = spec["initContainers"][0]
    assert daemon["name"] == "tcpxo-daemon" and daemon["restartPolicy"] == "Always"
    assert "NET_ADMIN" in daemon["securityContext"]["capabilities"]["add"]
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {
        "/home/kubernetes/bin/nvidia/lib64", "/dev/aperture_devices", "/sys", "/proc/sys"}
    env = fabric_env(req)
    assert env["NCCL_FASTRAK_IFNAME"] == "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8"
    assert env["NCCL_FASTRAK_CTRL_DEV"] == "eth0" and env["LD_LIBRARY_PATH"] == \
        "/usr/local/nvidia/lib64"
    assert env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
    broken = pod_security(spec, "baseline")
    assert any("hostPath volumes" in b for b in broken) and any('"NET_ADMIN"' in b
                                                               for b in broken)
    assert tcpxo["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert tcpxo["spec"]["suspend"] is True


def test_several_placement_labels_all_apply() -> None:
    spec = plain_pod(request(mode="pods", placement=["a.example/pool=x", "gpu=h100"]), 0)["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [  # one term: every label at once
        {"key": "a.example/pool", "operator": "In", "values": ["x"]},
        {"key": "gpu", "operator": "In", "values": ["h100"]}]}]


def test_each_pod_ends_itself_at_the_clusters_end() -> None:
    """The absolute end travels with the template, so a pod the Job makes later (a
    replacement, after a Kueue resume) ends then too; a plain replacement pod's deadline is
    only what is left."""
    req = request(mode="pods", deadline_s=7200, end_unix=1_900_000_000)
    pod = plain_pod(req, 0, deadline_s=600)
    assert pod["spec"]["activeDeadlineSeconds"] == 600
    assert {"name": "MGPU_END_UNIX", "value": "1900000000"} in pod["spec"]["containers"][0]["env"]
    assert plain_pod(req, 0)["spec"]["activeDeadlineSeconds"] == 7200


def test_each_pod_reads_its_own_host_key_by_index() -> None:
    docs = cluster_manifests(request(nodes=3), ["K0", "K1", "K2"], "ssh-ed25519 AAA pub")
    secret = docs[0]
    assert secret["stringData"] == {"host-key-0": "K0\n", "host-key-1": "K1\n",
                                    "host-key-2": "K2\n", "authorized-keys": "ssh-ed25519 AAA pub\n"}
    start = docs[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"][-1]
    assert "host-key-$r" in start and "${JOB_COMPLETION_INDEX:-$MGPU_RANK}" in start
    assert INDEX_LABEL == "batch.kubernetes.io/job-completion-index"


def test_the_standin_refuses_a_broken_manifest_with_422(standin: Standin) -> None:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(standin.kubeconfig))
    pod = plain_pod(request(mode="pods"), 0)
    pod["metadata"]["namespace"] = "default"
    pod["spec"]["restartPolicy"] = 7
    with pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(api).create_namespaced_pod("default", pod)
    assert exc.value.status == 422 and "restartPolicy" in exc.value.body
    assert standin.api.violations
    standin.api.violations.clear()  # seen: the fixture fails the test on any left


def test_portforward_carries_bytes_both_ways(standin: Standin) -> None:
    """The transport's socket over the stand-in's websocket, to an echo server as the pod."""
    from provision.cluster.providers.k8s.transport import open_portforward

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def echo() -> None:
        conn, _ = listener.accept()
        while data := conn.recv(1 << 16):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=echo, daemon=True).start()
    standin.kubelet.address = lambda pod: ("127.0.0.1", 0)
    standin.store.create("pods", "default", {"metadata": {"name": "echo"}, "spec": {
        "containers": [{"name": "c", "image": "x"}]}})
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(standin.kubeconfig))
    sock = open_portforward(api, "default", "echo", port)
    payload = os.urandom(1 << 20)
    sock.sendall(payload)
    got = b""
    sock.settimeout(5)
    while len(got) < len(payload):
        got += sock.recv(1 << 16)
    assert got == payload
    sock.settimeout(0.05)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.close()
    listener.close()


def test_the_docs_say_the_pod_security_level_each_preset_needs() -> None:
    import re

    text = (Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md").read_text()
    table = text.split("| preset | Pod Security level it needs |")[1].split("\n\n")[0]
    said = {name.strip(): level for names, level in re.findall(r"^\| ([^|]+) \| (\w+) \|$",
                                                               table, re.M)
            for name in names.split(",")}
    assert said == POD_SECURITY
