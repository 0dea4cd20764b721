"""Instance-type facts (describe_instance_types, or the shipped catalog.yaml when planning
offline) and prices: per type with its source and date, "unknown" instead of a refusal."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from provision.cluster.providers.catalogs import expectation_in
from provision.model.errors import UserInputError
from provision.model.inventory import FabricExpectation

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")

# Families whose EFA supports RDMA read/write (GPUDirect RDMA): FI_EFA_USE_DEVICE_RDMA=1.
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200"})


@dataclass(frozen=True)
class InstanceTypeInfo:
    name: str
    gpu_model: str
    gpu_count: int
    gpu_memory_mib: int  # per GPU
    # The network cards that get an EFA interface, one each (card_layout): p4d 0..3, p6-b300
    # 1..16 (its card 0 is ENA-only). Empty: no EFA.
    efa_cards: tuple[int, ...]
    network_cards: int

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def efa_interfaces(self) -> int:
        return len(self.efa_cards)

    @property
    def interfaces(self) -> int:
        """Network interfaces per node: the EFA ones, plus an ENA primary on card 0 when that
        card has no EFA."""
        return interface_count(self.efa_cards)

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


def interface_count(efa_cards: tuple[int, ...] | list[int]) -> int:
    return len(efa_cards) + (0 if 0 in efa_cards else 1)


def card_layout(net: dict[str, Any]) -> tuple[int, ...]:
    """The cards to put one EFA interface on, from DescribeInstanceTypes' NetworkInfo: the
    cards whose `InterfaceTypes` include 'efa' or 'efa-only' (NetworkCardInfo, EC2 API
    Reference), in index order, at most EfaInfo.MaximumEfaInterfaces. p6-b300's card 0 lists
    only 'interface' ("the primary network card (network card index 0) only supports ENA", AWS
    engineering in aws-parallelcluster issue #7143), so its EFA goes on cards 1..16. Answers
    without per-card interface types (older API data) fall back to cards 0..n-1."""
    if not net.get("EfaSupported"):
        return ()
    maximum = max(1, int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 1) or 1))
    cards = sorted(net.get("NetworkCards") or [], key=lambda c: int(c.get("NetworkCardIndex", 0)))
    if cards and all("InterfaceTypes" in c for c in cards):
        eligible = [int(c.get("NetworkCardIndex", 0)) for c in cards
                    if {"efa", "efa-only"} & set(c.get("InterfaceTypes") or [])]
    else:
        eligible = list(range(max(1, int(net.get("MaximumNetworkCards", 1) or 1))))
    return tuple(eligible[:maximum])


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
    return InstanceTypeInfo(
        name=name,
        gpu_model=" + ".join(sorted({f"{g.get('Manufacturer', '')} {g.get('Name', '')}".strip() for g in gpus})),
        gpu_count=count,
        gpu_memory_mib=int((gpus[0].get("MemoryInfo") or {}).get("SizeInMiB", 0)),
        efa_cards=card_layout(net),
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
    first = int(row.get("first_efa_card", 0))
    return InstanceTypeInfo(
        name=name, gpu_model=str(row["gpu"]["model"]), gpu_count=int(row["gpu"]["count"]),
        gpu_memory_mib=int(row["gpu"]["memory_mib"]),
        efa_cards=tuple(range(first, first + efa)), network_cards=int(row["network_cards"]),
    )


ALL_MARKETS = ("on-demand", "spot", "capacity-block", "reservation")


def markets_of(instance_type: str) -> tuple[str, ...]:
    """How the type can be bought (catalog.yaml `markets`; every way when not listed)."""
    row = catalog()["types"].get(instance_type) or {}
    return tuple(row.get("markets") or ALL_MARKETS)


def markets_source(instance_type: str) -> str:
    row = catalog()["types"].get(instance_type) or {}
    return str(row.get("markets_source") or "")


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


# ---------------------------------------------------------------------------------------------
# What each instance type's network should deliver between nodes (the fabric gate's
# expectation, Inventory.fabric). busbw_gbps: a published nccl-tests all_reduce_perf figure
# (2 nodes x 8 GPUs, 1-2 GB messages); None where no such figure was found (the gate then
# judges the transport and the pairs only). The same table, with links, is in
# docs/fabric-gate.md (tests/test_fabric.py keeps the two equal).
_AWESOME = ("aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md "
            "(commit 7217859f, 2026-02-21)")
FABRIC: dict[str, FabricExpectation] = {
    "p4d.24xlarge": FabricExpectation(
        transport="efa", busbw_gbps=77.35, nominal="4 x 100 Gb/s EFA",
        source="SkyPilot EFA example, 2 x p4d: 77.35 GB/s at 2 GB (non-EFA: 4.13)"),
    "p4de.24xlarge": FabricExpectation(
        transport="efa", busbw_gbps=78.33, nominal="4 x 100 Gb/s EFA",
        source=f"{_AWESOME}: 78.33 GB/s at 2 GB"),
    "p5.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=443.7, nominal="32 x 100 Gb/s EFA",
        source=f"{_AWESOME}: 443.7 GB/s at 2 GB (487.1 at 16 GB)"),
    "p5e.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=None, nominal="32 x 100 Gb/s EFA",
        source="no published 2-node figure found; same EFA as p5"),
    "p5en.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=None, nominal="16 x 200 Gb/s EFA (v3, unconfirmed)",
        source="no published 2-node figure found"),
    "p6-b200.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=None, nominal="8 x 400 Gb/s EFA (v4, unconfirmed)",
        source="no published 2-node figure found"),
}


def fabric_expectation(machine_type: str) -> FabricExpectation | None:
    """FABRIC's row for a type, or None (catalogs.expectation_in)."""
    return expectation_in(FABRIC, machine_type)
