"""Fabric presets: what a pod template needs for the network between GPUs, per cluster kind.

    efa    EKS: `vpc.amazonaws.com/efa: K` (the EFA device plugin's resource) next to the GPUs,
           and libfabric's EFA settings in the environment
    tcpx   GKE A3 High: GPUDirect-TCPX, eth0 + 4 GPU NICs (vpc1..vpc4) through the
           multi-network annotations
    tcpxo  GKE A3 Mega: GPUDirect-TCPXO, eth0 + 8 GPU NICs (vpc1..vpc8)
Placement: Kueue Topology-Aware Scheduling (`kueue.x-k8s.io/podset-required-topology`: every
pod in one domain of that level), or node affinity to one node label (a placement group,
GKE compact placement). GPU nodes are usually tainted nvidia.com/gpu: a pod asking for GPUs
tolerates it. The names are the providers' documented ones; docs/kubernetes.md says which
were exercised only against the stand-in (all of them: no GPU cluster here).
"""

from __future__ import annotations

import json
from typing import Any

from provision.cluster.providers.k8s.request import K8sRequest

EFA_RESOURCE = "vpc.amazonaws.com/efa"
TAS_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
GKE_INTERFACES = "networking.gke.io/interfaces"
GKE_DEFAULT_INTERFACE = "networking.gke.io/default-interface"
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_SOCKET_IFNAME": "^lo"}
GPU_NICS = {"tcpx": 4, "tcpxo": 8}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gke_interfaces(nics: int) -> str:
    """The multi-network annotation's value: eth0 on the default network, ethN on vpcN."""
    items = [{"interfaceName": "eth0", "network": "default"}]
    items += [{"interfaceName": f"eth{i}", "network": f"vpc{i}"} for i in range(1, nics + 1)]
    return json.dumps(items, separators=(",", ":"))


def apply_fabric(template: dict[str, Any], req: K8sRequest) -> None:
    """Add the preset of `req.fabric`, the placement and the GPU toleration to a pod
    template (metadata + spec), in place."""
    spec, container = template["spec"], template["spec"]["containers"][0]
    annotations: dict[str, str] = {}
    if req.fabric == "efa":
        limits = container.setdefault("resources", {}).setdefault("limits", {})
        limits[EFA_RESOURCE] = str(req.efa_devices)
        container["resources"]["requests"] = dict(limits)
        container.setdefault("env", []).extend(
            {"name": k, "value": v} for k, v in EFA_ENV.items())
    elif req.fabric in GPU_NICS:
        annotations[GKE_DEFAULT_INTERFACE] = "eth0"
        annotations[GKE_INTERFACES] = gke_interfaces(GPU_NICS[req.fabric])
    if req.topology:
        annotations[TAS_REQUIRED] = req.topology
    if annotations:
        template["metadata"]["annotations"] = annotations
    if req.placement:
        key, _, value = req.placement.partition("=")
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}]}]}}}
    if req.gpus:
        spec["tolerations"] = [dict(GPU_TOLERATION)]
