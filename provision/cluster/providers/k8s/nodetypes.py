"""The pods' CPU and memory requests, from the GPU machine type they run on (`k8s.node_type`).

A pod without requests is BestEffort: evicted first under memory pressure, and refused (403)
in a namespace whose ResourceQuota tracks cpu/memory ("must specify requests.cpu"). With a
node type, each pod asks for its share of the machine (its GPUs' fraction) less what the
kubelet reserves and the DaemonSets use (SHARE), requests = limits (QoS Guaranteed: evicted
last; whole cores for the CPU manager). Without one: one core and 2 GiB per slot, requests
only (Burstable: the pod may use the rest of its node).
"""

from __future__ import annotations

import math

from provision.model.errors import UserInputError

# vCPUs, memory GiB, GPUs.
# AWS: DescribeInstanceTypes (tests/providers/k8s checks these rows against moto's copy of it).
# GCP: a2/a3-high rows from SkyPilot's GCP catalog v8 (skypilot-org/skypilot-catalog
# catalogs/v8/gcp/vms.csv, commit 006059e0); a3-mega/ultra and a4 from Compute Engine's
# accelerator-optimized machine family page (read by hand, not by a program).
NODE_TYPES: dict[str, tuple[int, int, int]] = {
    "p4d.24xlarge": (96, 1152, 8),
    "p4de.24xlarge": (96, 1152, 8),
    "p5.48xlarge": (192, 2048, 8),
    "p5e.48xlarge": (192, 2048, 8),
    "p5en.48xlarge": (192, 2048, 8),
    "p6-b200.48xlarge": (192, 2048, 8),
    "g5.12xlarge": (48, 192, 4),
    "g5.48xlarge": (192, 768, 8),
    "g6e.48xlarge": (192, 1536, 8),
    "a2-highgpu-8g": (96, 680, 8),
    "a2-ultragpu-8g": (96, 1360, 8),
    "a3-highgpu-8g": (208, 1872, 8),
    "a3-megagpu-8g": (208, 1872, 8),
    "a3-ultragpu-8g": (224, 2952, 8),
    "a4-highgpu-8g": (224, 3968, 8),
}
# EKS reserves well under 1 core and a few GiB on these machines (kube-reserved: 255 MiB +
# 11 MiB per pod; eviction threshold 100 MiB), GKE ~2.5% of memory (its allocatable table);
# DaemonSets (CNI, device plugins, GPU/TCPXO installers, logging) a few cores: 90% is left.
SHARE = 0.9
PER_SLOT_MEMORY_GIB = 2


def pod_resources(node_type: str | None, gpus: int, slots: int, cpu: str | None,
                  memory: str | None) -> tuple[str, str, bool]:
    """(cpu, memory, guaranteed) of every pod. Explicit values win; a node type gives both
    (its GPUs' share of the machine); otherwise the per-slot floor, requests only."""
    if node_type is not None and node_type not in NODE_TYPES:
        raise UserInputError(
            f"k8s.node_type {node_type!r} is not a machine type this tool knows",
            hint=f"one of {', '.join(sorted(NODE_TYPES))}; or give k8s.cpu and k8s.memory "
                 "yourself (e.g. cpu: 90, memory: 900Gi)")
    if node_type is None:
        return (cpu or str(slots), memory or f"{PER_SLOT_MEMORY_GIB * slots}Gi",
                cpu is not None and memory is not None)
    vcpus, mem_gib, type_gpus = NODE_TYPES[node_type]
    share = SHARE * (min(gpus, type_gpus) / type_gpus if gpus else 1.0)
    return (cpu or str(max(1, math.floor(vcpus * share))),
            memory or f"{max(1, math.floor(mem_gib * share))}Gi", True)
