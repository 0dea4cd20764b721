"""Fabric presets: what a pod needs for the network between GPUs, as the clouds publish it.

    efa    EKS: EFA through the device plugin (`vpc.amazonaws.com/efa: K`) or, with
           k8s.efa_dra, the EFA DRA driver (a ResourceClaimTemplate of DeviceClass
           efa.networking.k8s.aws; EKS 1.34+), and `hugepages-2Mi: 5120Mi` (EFA instances
           pre-allocate 2 MiB huge pages: AWS's EKS EFA examples); libfabric's settings in the
           job's environment (templates/nccl/aws-efa.env.j2), WITHOUT FI_EFA_USE_DEVICE_RDMA=1:
           libfabric turns device RDMA on where the device has it, and aborts when it is forced
           on a device without it (ofiwg/libfabric prov/efa efa_rdm_get_use_device_rdma)
    tcpx   GKE A3 High, GPUDirect-TCPX: eth0 + vpc1..4, the tcpx-daemon (receive datapath
           manager) beside the node container, /run/tcpx and the node's NVIDIA libraries
    tcpxo  GKE A3 Mega, GPUDirect-TCPXO: eth0 + vpc1..8, the tcpxo-daemon, its device
           annotation, /dev/aperture_devices, NCCL_FASTRAK_* and LD_LIBRARY_PATH
    rdma   GKE A3 Ultra / A4, GPUDirect RDMA: eth0, gvnic-1 and rdma-0..7, the gIB plugin
           (/home/kubernetes/bin/gib) and its set_nccl_env.sh
The GKE presets follow Google's reference pods (GoogleCloudPlatform/container-engine-
accelerators gpudirect-tcpx/nccl-test-unprivileged-without-hostnetwork.yaml,
gpudirect-tcpxo/nccl-test-latest.yaml and README.md "NCCL configs", gpudirect-rdma/
nccl-test.yaml), with the daemons as native sidecars (initContainers, restartPolicy Always,
Kubernetes 1.29+) so that the pod still ends with the node container (its exit status is
the pod's phase, manifests.START). Their hostPath volumes and NET_ADMIN (IPC_LOCK for TCPX)
are beyond Pod Security `baseline`: those presets need a `privileged` namespace
(POD_SECURITY, said by the plan and docs/kubernetes.md).

Environment that the ranks need goes to the job (`fabric_env`, the inventory's nccl_env):
a pod's env does not reach processes started over SSH.
Placement: Kueue Topology-Aware Scheduling (`kueue.x-k8s.io/podset-required-topology`), and
node affinity to every k8s.placement label. GPU nodes are usually tainted nvidia.com/gpu: a
pod asking for GPUs tolerates it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from provision.cluster.providers.k8s.request import K8sRequest

EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_DEVICE_CLASS = "efa.networking.k8s.aws"
HUGEPAGES = {"hugepages-2Mi": "5120Mi"}
TAS_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
GKE_INTERFACES = "networking.gke.io/interfaces"
GKE_DEFAULT_INTERFACE = "networking.gke.io/default-interface"
GPU_NICS = {"tcpx": 4, "tcpxo": 8, "rdma": 8}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
POD_SECURITY = {"none": "baseline", "efa": "baseline", "tcpx": "privileged",
                "tcpxo": "privileged", "rdma": "privileged"}
# images as Google's reference pods name them; the daemon's version goes with the NCCL plugin
# the cluster's installer DaemonSet put on the nodes (gpudirect-tcpxo/README.md)
TCPX_DAEMON = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.11"
TCPXO_DAEMON = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.15"
NVIDIA_LIB64 = "/usr/local/nvidia/lib64"
APERTURE = "/dev/aperture_devices"
GIB = "/usr/local/gib"


def gke_interfaces(fabric: str) -> str:
    """The multi-network annotation's value: eth0 on the default network, then the GPU NICs
    (vpcN for TCPX/TCPXO; gvnic-1 and rdma-0..7 for RDMA)."""
    items = [{"interfaceName": "eth0", "network": "default"}]
    nets = ([f"vpc{i}" for i in range(1, GPU_NICS[fabric] + 1)] if fabric != "rdma"
            else ["gvnic-1", *(f"rdma-{i}" for i in range(GPU_NICS["rdma"]))])
    items += [{"interfaceName": f"eth{i}", "network": n} for i, n in enumerate(nets, start=1)]
    return json.dumps(items, separators=(",", ":"))


def _host(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path}}


def _mount(name: str, path: str) -> dict[str, str]:
    return {"name": name, "mountPath": path}


def _daemon(name: str, image: str, command: list[str], caps: list[str],
            mounts: list[dict[str, str]]) -> dict[str, Any]:
    return {"name": name, "image": image, "restartPolicy": "Always", "command": command,
            "securityContext": {"capabilities": {"add": caps}}, "volumeMounts": mounts,
            "env": [{"name": "LD_LIBRARY_PATH", "value": NVIDIA_LIB64}]}


def _devices(extra: list[str]) -> str:
    """The NRI device injector's annotation value: the GPUs for the daemon container."""
    paths = [*(f"/dev/nvidia{i}" for i in range(8)), "/dev/nvidiactl", "/dev/nvidia-uvm", *extra]
    return "".join(f"- path: {p}\n" for p in paths)


def _gke(template: dict[str, Any], req: K8sRequest, annotations: dict[str, str]) -> None:
    spec, node = template["spec"], template["spec"]["containers"][0]
    annotations[GKE_DEFAULT_INTERFACE] = "eth0"
    annotations[GKE_INTERFACES] = gke_interfaces(req.fabric)
    sysfs = [_host("sys", "/sys"), _host("proc-sys", "/proc/sys")]
    sys_mounts = [_mount("sys", "/hostsysfs"), _mount("proc-sys", "/hostprocsysfs")]
    if req.fabric == "tcpx":
        annotations["devices.gke.io/container.tcpx-daemon"] = _devices([])
        spec["volumes"] += [_host("nvidia", "/home/kubernetes/bin/nvidia/lib64"),
                            _host("tcpx-socket", "/run/tcpx"), *sysfs]
        libs = [_mount("nvidia", NVIDIA_LIB64), _mount("tcpx-socket", "/run/tcpx")]
        spec["initContainers"] = [_daemon(
            "tcpx-daemon", TCPX_DAEMON,
            ["/tcpgpudmarxd/build/app/tcpgpudmarxd", "--gpu_nic_preset", "a3vm",
             "--gpu_shmem_type", "fd", "--uds_path", "/run/tcpx", "--setup_param",
             "--verbose 128 2 0"], ["NET_ADMIN"], [*libs, *sys_mounts])]
        node["volumeMounts"] += libs
        node["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    elif req.fabric == "tcpxo":
        annotations["devices.gke.io/container.tcpxo-daemon"] = _devices(
            ["/dev/dmabuf_import_helper"])
        spec["volumes"] += [_host("nvidia", "/home/kubernetes/bin/nvidia/lib64"),
                            _host("aperture-devices", APERTURE), *sysfs]
        spec["initContainers"] = [_daemon(
            "tcpxo-daemon", TCPXO_DAEMON,
            ["/bin/sh", "-c", "set -ex; chmod 755 /fts/entrypoint_rxdm_container.sh; "
             "/fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics=8 --uid= "
             "--alsologtostderr"], ["NET_ADMIN", "NET_BIND_SERVICE"],
            [_mount("nvidia", NVIDIA_LIB64), *sys_mounts])]
        node["volumeMounts"] += [_mount("nvidia", NVIDIA_LIB64),
                                 _mount("aperture-devices", APERTURE)]
    else:  # rdma
        spec["volumes"] += [_host("library-dir-host", "/home/kubernetes/bin/nvidia"),
                            _host("gib", "/home/kubernetes/bin/gib")]
        node["volumeMounts"] += [_mount("library-dir-host", "/usr/local/nvidia"),
                                 _mount("gib", GIB)]


def _efa(template: dict[str, Any], req: K8sRequest) -> None:
    spec, node = template["spec"], template["spec"]["containers"][0]
    res = node["resources"]
    res["requests"].update(HUGEPAGES)  # huge pages: requests = limits, and cpu/memory asked
    res.setdefault("limits", {}).update(HUGEPAGES)
    if req.efa_dra:
        spec["resourceClaims"] = [{"name": "efa",
                                   "resourceClaimTemplateName": efa_claim_name(req)}]
        res["claims"] = [{"name": "efa"}]
    else:
        res["limits"][EFA_RESOURCE] = res["requests"][EFA_RESOURCE] = str(req.efa_devices)


def efa_claim_name(req: K8sRequest) -> str:
    return f"{req.cluster}-efa"


def fabric_manifests(req: K8sRequest) -> list[dict[str, Any]]:
    """Objects a preset needs besides the pods: the EFA ResourceClaimTemplate (DRA)."""
    if req.fabric != "efa" or not req.efa_dra:
        return []
    from provision.model.inventory import CLUSTER_TAG

    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": efa_claim_name(req), "namespace": req.namespace,
                          "labels": {CLUSTER_TAG: req.cluster}},
             "spec": {"spec": {"devices": {"requests": [{"name": "efa", "exactly": {
                 "deviceClassName": EFA_DEVICE_CLASS, "allocationMode": "ExactCount",
                 "count": req.efa_devices}}]}}}}]


def node_setup(req: K8sRequest) -> str:
    """Shell run by the pod before sshd: RDMA's set_nccl_env.sh (Google: "source" it in the
    workload) into /etc/environment, which every SSH session reads (pam_env)."""
    if req.fabric != "rdma":
        return ""
    return (f"if [ -f {GIB}/scripts/set_nccl_env.sh ]; then "
            f"(. {GIB}/scripts/set_nccl_env.sh >/dev/null 2>&1; env | grep '^NCCL_') "
            ">> /etc/environment; fi; ")


def fabric_env(req: K8sRequest) -> dict[str, str]:
    """What every rank's environment needs for the preset (the job gets it: SSH sessions do
    not see a pod's env)."""
    from provision.model.render import parse_env_file, render

    machine = req.node_type or "the cluster's GPU nodes"
    if req.fabric == "efa":
        return parse_env_file(render("nccl/aws-efa.env.j2", instance_type=machine,
                                     efa_interfaces=req.efa_devices, device_rdma=False))
    if req.fabric == "rdma":
        return {"LD_LIBRARY_PATH": f"{NVIDIA_LIB64}:{GIB}/lib64", "NCCL_NET": "gIB"}
    if req.fabric not in GPU_NICS:
        return {}
    stack = SimpleNamespace(source="GKE's reference pods (container-engine-accelerators)",
                            lib_dir=NVIDIA_LIB64)
    text = render(f"nccl/gcp-{req.fabric}.env.j2", cluster=req.cluster, machine_type=machine,
                  stack=stack, nics_env="(fixed on GKE)", uds_path="/run/tcpx",
                  aperture_devices=APERTURE)
    nics = ",".join(f"eth{i}" for i in range(1, GPU_NICS[req.fabric] + 1))
    named = ({"NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": nics, "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0",
              # GKE's nccl-config.yaml, for the A3 High's NIC/CPU layout
              "NCCL_GPUDIRECTTCPX_TX_BINDINGS": "eth1:8-21,112-125;eth2:8-21,112-125;"
                                                "eth3:60-73,164-177;eth4:60-73,164-177",
              "NCCL_GPUDIRECTTCPX_RX_BINDINGS": "eth1:22-35,124-139;eth2:22-35,124-139;"
                                                "eth3:74-87,178-191;eth4:74-87,178-191"}
             if req.fabric == "tcpx" else
             {"NCCL_FASTRAK_CTRL_DEV": "eth0", "NCCL_FASTRAK_IFNAME": nics})
    return {**parse_env_file(text), "NCCL_SOCKET_IFNAME": "eth0", **named,
            "LD_LIBRARY_PATH": NVIDIA_LIB64}


def apply_fabric(template: dict[str, Any], req: K8sRequest) -> None:
    """Add the preset of `req.fabric`, the placement and the GPU toleration to a pod
    template (metadata + spec), in place."""
    spec = template["spec"]
    annotations: dict[str, str] = {}
    if req.fabric == "efa":
        _efa(template, req)
    elif req.fabric in GPU_NICS:
        _gke(template, req, annotations)
    if req.topology:
        annotations[TAS_REQUIRED] = req.topology
    if annotations:
        template["metadata"]["annotations"] = annotations
    if req.placement:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}
                for key, _, value in (p.partition("=") for p in req.placement)]}]}}}
    if req.gpus:
        spec["tolerations"] = [dict(GPU_TOLERATION)]
