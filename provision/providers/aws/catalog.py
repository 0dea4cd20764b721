"""Instance-type facts (from describe_instance_types) and the shipped on-demand price table."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from provision.errors import UserInputError

PRICES_FILE = Path(__file__).with_name("prices.yaml")

# Families whose EFA supports RDMA read/write (GPUDirect RDMA): FI_EFA_USE_DEVICE_RDMA=1.
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200"})


@dataclass(frozen=True)
class InstanceTypeInfo:
    name: str
    gpu_model: str
    gpu_count: int
    gpu_memory_mib: int  # per GPU
    efa_supported: bool
    max_efa_interfaces: int
    network_cards: int

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def efa_interfaces(self) -> int:
        """EFA interfaces to attach: one per network card, up to MaximumEfaInterfaces."""
        if not self.efa_supported:
            return 0
        return max(1, min(self.max_efa_interfaces, self.network_cards))

    @property
    def interfaces(self) -> int:
        return max(1, self.efa_interfaces)

    @property
    def device_rdma(self) -> bool:
        return self.family in RDMA_FAMILIES

    def gpu_summary(self) -> str:
        return f"{self.gpu_count} x {self.gpu_model} {self.gpu_memory_mib // 1024} GiB"


def parse_instance_type(item: dict[str, Any]) -> InstanceTypeInfo:
    """One DescribeInstanceTypes entry -> facts. UserInputError for a type without GPUs."""
    name = str(item["InstanceType"])
    gpus = (item.get("GpuInfo") or {}).get("Gpus") or []
    count = sum(int(g.get("Count", 0)) for g in gpus)
    if count < 1:
        raise UserInputError(
            f"instance type {name!r} has no GPUs",
            hint="use a GPU type, e.g. --instance-type p4d.24xlarge (8x A100) or p5.48xlarge (8x H100)",
        )
    net = item.get("NetworkInfo") or {}
    efa = bool(net.get("EfaSupported"))
    return InstanceTypeInfo(
        name=name,
        gpu_model=" + ".join(sorted({f"{g.get('Manufacturer', '')} {g.get('Name', '')}".strip() for g in gpus})),
        gpu_count=count,
        gpu_memory_mib=int((gpus[0].get("MemoryInfo") or {}).get("SizeInMiB", 0)),
        efa_supported=efa,
        max_efa_interfaces=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)) if efa else 0,
        network_cards=int(net.get("MaximumNetworkCards", 1) or 1),
    )


@cache
def price_table() -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(PRICES_FILE.read_text())
    return data


def hourly_price(instance_type: str, region: str) -> tuple[float, str]:
    """(USD per node-hour, where the number comes from). UserInputError if not in the table:
    a plan must state its cost, so a type without a known price is refused."""
    table = price_table()
    regions: dict[str, dict[str, float]] = table["regions"]
    source = f"{table['source']}, as of {table['date']}"
    if instance_type in regions.get(region, {}):
        return float(regions[region][instance_type]), source
    reference = table["reference_region"]
    if instance_type in regions.get(reference, {}):
        return (
            float(regions[reference][instance_type]),
            f"{source} ({reference} price; {region} may differ)",
        )
    known = ", ".join(sorted(regions.get(reference, {})))
    raise UserInputError(
        f"no price is known for {instance_type!r}, so the plan cannot state its cost",
        hint=f"types with a price: {known}",
    )
