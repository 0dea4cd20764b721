"""Instance-type facts (describe_instance_types, or the shipped catalog.yaml when planning
offline) and prices: per type with its source and date, "unknown" instead of a refusal."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from provision.errors import UserInputError

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")

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


@dataclass(frozen=True)
class Price:
    """USD per node-hour, or None when no price is known; `source` says where the number
    comes from (and when), or why there is none."""

    usd_per_hour: float | None
    source: str


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
def catalog() -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load(CATALOG_FILE.read_text())
    return data


def catalog_types() -> list[str]:
    return sorted(catalog()["types"])


def known_type(name: str) -> InstanceTypeInfo | None:
    """The shipped facts of `name` (for plans made without AWS), or None."""
    row = catalog()["types"].get(name)
    if row is None:
        return None
    efa = int(row["efa_interfaces"])
    return InstanceTypeInfo(
        name=name, gpu_model=str(row["gpu"]["model"]), gpu_count=int(row["gpu"]["count"]),
        gpu_memory_mib=int(row["gpu"]["memory_mib"]), efa_supported=efa > 0,
        max_efa_interfaces=efa, network_cards=int(row["network_cards"]),
    )


def _source(key: str, date: str) -> str:
    return f"{catalog()['sources'][key]}, as of {date}"


def hourly_price(instance_type: str, region: str) -> Price:
    """On-demand USD per node-hour of `instance_type` in `region` (the reference region's price,
    said so, when the region has none). Unknown is a Price of None, never an error: a plan
    then says "price unknown" and asks for confirmation."""
    row = catalog()["types"].get(instance_type)
    if row is None:
        return Price(None, f"{instance_type} is not in mgpu-cloud's price table ({CATALOG_FILE.name})")
    price = row["price"]
    prices: dict[str, float] = row.get("on_demand") or {}
    reference = catalog()["reference_region"]
    if region in prices:
        return Price(float(prices[region]), _source(price["source"], price["date"]))
    if reference in prices:
        return Price(float(prices[reference]),
                     f"{_source(price['source'], price['date'])} ({reference} price; "
                     f"{region} may differ)")
    why = price.get("unknown_because") or f"no on-demand price recorded for {instance_type}"
    return Price(None, f"{why} ({_source(price['source'], price['date'])})")


def network_prices() -> dict[str, Any]:
    """Public IPv4 / NAT gateway prices and their source line."""
    net = dict(catalog()["network"])
    net["source"] = _source(net["source"], net["date"])
    return net
