"""The shipped Compute Engine catalog (catalog.yaml): GPU facts of machine types, for plans
made without Compute, and prices with their source and date ("unknown" instead of a refusal)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from provision.cluster.providers.catalogs import expectation_in
from provision.model.inventory import FabricExpectation

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


@cache
def catalog() -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(CATALOG_PATH.read_text())
    return data


def known_gpus(machine_type: str) -> tuple[str | None, int] | None:
    """(bundled GPU type, count) of a catalog machine type; (None, 0) for N1; None if unknown."""
    row = catalog()["machine_types"].get(machine_type)
    if row is None:
        return None
    return row["gpu"]["type"], int(row["gpu"]["count"])


def gpu_machine_types() -> list[str]:
    return sorted(n for n, r in catalog()["machine_types"].items() if r["gpu"]["count"])


@dataclass
class Cost:
    """Whole-cluster USD/hour of what has a price; `unpriced` names what has none."""

    usd_per_hour: float = 0.0
    unpriced: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def add(self, what: str, entry: dict[str, Any], times: float) -> None:
        source = f"{catalog()['sources'][entry['source']]}, as of {entry['date']}"
        if source not in self.sources:
            self.sources.append(source)
        if entry.get("usd") is None:
            why = entry.get("unknown_because") or "no price recorded"
            self.unpriced.append(f"{what}: {why}")
            return
        self.usd_per_hour += float(entry["usd"]) * times


def cluster_cost(machine_type: str, accelerator: str | None, gpus: int, nodes: int,
                 disk_gb: int, spot: bool, disk_type: str = "pd-balanced",
                 region: str | None = None) -> Cost:
    """The cost of `nodes` VMs: machine type, guest GPUs, boot disk and external address, at
    the catalog's reference region's prices; another `region` is unpriced (the catalog has no
    regional prices)."""
    data = catalog()
    kind = "spot" if spot else "on_demand"
    market = "spot" if spot else "on-demand"
    cost = Cost()
    if region is not None and region != data["reference_region"]:
        cost.unpriced.append(f"{region}: mgpu-cloud's price table has "
                             f"{data['reference_region']} prices only")
    row = data["machine_types"].get(machine_type)
    if row is None:
        cost.unpriced.append(f"{machine_type}: not in mgpu-cloud's price table")
    else:
        cost.add(f"{machine_type} ({market})", row[kind], nodes)
    if accelerator:
        acc = data["accelerators"].get(accelerator)
        if acc is None:
            cost.unpriced.append(f"{accelerator}: not in mgpu-cloud's price table")
        else:
            cost.add(f"{accelerator} ({market})", acc[kind], nodes * gpus)
    disk = data["disk_gb_month"] if disk_type == "pd-balanced" else \
        data["disk_types_gb_month"].get(disk_type, {"usd": None, "source": "remembered-2025-06",
                                                    "date": "2025-06-01"})
    cost.add(f"boot disk ({disk_type})", disk, nodes * disk_gb / 730.0)
    ip = data["external_ipv4_hour"]
    cost.add("external IPv4", {"usd": ip["spot" if spot else "standard"],
                               "source": ip["source"], "date": ip["date"]}, nodes)
    cost.usd_per_hour = round(cost.usd_per_hour, 4)
    return cost


# ---------------------------------------------------------------------------------------------
# What each instance type's network should deliver between nodes (the fabric gate's
# expectation, Inventory.fabric). busbw_gbps: a published nccl-tests all_reduce_perf figure
# (2 nodes x 8 GPUs, 1-2 GB messages); None where no such figure was found (the gate then
# judges the transport and the pairs only). The same table, with links, is in
# docs/fabric-gate.md (tests/test_fabric.py keeps the two equal).
FABRIC: dict[str, FabricExpectation] = {
    "a3-highgpu-8g": FabricExpectation(
        transport="tcpx", busbw_gbps=88.18, nominal="4 x 200 Gb/s GPUDirect-TCPX",
        source="GoogleCloudPlatform/ai-infra-cluster-provisioning sample_workloads/nccltest/"
               "a3/README.md: 88.18 GB/s at 2 GB; SkyPilot examples/gcp_gpu_direct_tcpx "
               "(commit 9a3aa4d9): 65.72 with TCPX, 19.39 without"),
    "a3-megagpu-8g": FabricExpectation(
        transport="tcpxo", busbw_gbps=None, nominal="8 x 200 Gb/s GPUDirect-TCPXO",
        source="no sourced 2-node figure (a lab guide of unknown origin: 317.84 GB/s)"),
    "a3-ultragpu-8g": FabricExpectation(
        transport="rdma", busbw_gbps=None, nominal="8 x 400 Gb/s GPUDirect RDMA (RoCE)",
        source="no published 2-node figure found"),
}


def fabric_expectation(machine_type: str) -> FabricExpectation | None:
    """FABRIC's row for a type, or None (catalogs.expectation_in)."""
    return expectation_in(FABRIC, machine_type)
