"""The project-level part of the Compute fake, as a mixin of FakeCompute (fake_compute.py):
the project's quotas (projects.get) and reservations.

Served like the real API:
    projects.get: `quotas[]` with metric NETWORKS (limit `networks_quota`, default 5, as new
        projects get; usage = the default network + the networks made) ("VPC quotas",
        https://cloud.google.com/vpc/docs/quota); a network insert beyond it ends its
        operation in QUOTA_EXCEEDED (FakeCompute.network_quota_fault);
    reservations.get / aggregatedList (filter `name = "X"`): zonal reservations made with
        `add_reservation`; a bulkInsert with reservationAffinity SPECIFIC_RESERVATION needs one
        in its zone, of its machine type, with enough VMs free ("Consume reservations",
        https://cloud.google.com/compute/docs/instances/reservations-consume: the VMs'
        properties must match the reservation's; this fake answers 400 where Compute would
        refuse), and uses them until the VMs are deleted.
"""

from __future__ import annotations

import re
from typing import Any

from fake_compute_catalog import BASE, HttpError

PROJECT_ROUTES: list[tuple[str, str, str]] = [
    ("GET", r"projects/([^/]+)$", "_get_project"),
    ("GET", r"projects/([^/]+)/zones/([^/]+)/reservations/([^/]+)$", "_get_reservation"),
    ("GET", r"projects/([^/]+)/aggregated/reservations$", "_aggregated_reservations"),
]
NAME_FILTER = re.compile(r'\s*name\s*=\s*"?([\w-]+)"?\s*')


def name_filter(flt: str | None) -> str | None:
    """The NAME of a `name = "NAME"` filter (None: no filter); 400 for any other filter."""
    if not flt:
        return None
    match = NAME_FILTER.fullmatch(flt)
    if not match:
        raise HttpError(400, "invalid", f"unsupported filter {flt!r}")
    return match.group(1)


class ProjectMixin:
    networks: dict[tuple[str, str], dict[str, Any]]
    reservations: dict[tuple[str, str, str], dict[str, Any]]
    networks_quota: int

    def _init_project(self) -> None:
        self.reservations = {}
        self.networks_quota = 5

    def networks_used(self, project: str) -> int:
        return 1 + sum(1 for p, _n in self.networks if p == project)  # + the default network

    def add_reservation(self, project: str, zone: str, name: str, machine_type: str, count: int,
                        in_use: int = 0, status: str = "READY") -> None:
        self.reservations[(project, zone, name)] = {
            "kind": "compute#reservation", "name": name, "status": status,
            "zone": f"{BASE}/projects/{project}/zones/{zone}",
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}/reservations/{name}",
            "specificReservationRequired": True,
            "specificReservation": {"count": str(count), "inUseCount": str(in_use),
                                    "instanceProperties": {"machineType": machine_type}},
        }

    def _get_project(self, project: str, **_: Any) -> tuple[int, Any]:
        return 200, {"kind": "compute#project", "name": project, "quotas": [
            {"metric": "NETWORKS", "limit": float(self.networks_quota),
             "usage": float(self.networks_used(project))},
            {"metric": "FIREWALLS", "limit": 200.0, "usage": 4.0},
        ]}

    def _get_reservation(self, project: str, zone: str, name: str,
                         **_: Any) -> tuple[int, Any]:
        res = self.reservations.get((project, zone, name))
        if res is None:
            raise HttpError(404, "notFound", f"reservation {name} not found in {zone}")
        return 200, res

    def _aggregated_reservations(self, project: str, query: dict[str, str],
                                 **_: Any) -> tuple[int, Any]:
        wanted = name_filter(query.get("filter"))
        items: dict[str, dict[str, list[Any]]] = {}
        for (p, z, n), res in self.reservations.items():
            if p == project and wanted in (None, n):
                items.setdefault(f"zones/{z}", {"reservations": []})["reservations"].append(res)
        return 200, {"items": items}

    def take_reservation(self, project: str, zone: str, props: dict[str, Any],
                         count: int) -> tuple[str, str, str] | None:
        """Check a bulkInsert's reservationAffinity; the reservation it uses (None: none)."""
        affinity = props.get("reservationAffinity", {})
        if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
            return None
        value = (affinity.get("values") or [""])[0]
        res_project = value.split("/")[1] if value.startswith("projects/") else project
        key = (res_project, zone, value.rsplit("/", 1)[-1])
        res = self.reservations.get(key)
        if res is None:
            raise HttpError(400, "invalid", f"reservation {value} does not exist in {zone}")
        spec = res["specificReservation"]
        if spec["instanceProperties"]["machineType"] != props.get("machineType"):
            raise HttpError(400, "invalid", f"reservation {value} holds "
                            f"{spec['instanceProperties']['machineType']} VMs")
        if int(spec["count"]) - int(spec["inUseCount"]) < count:
            raise HttpError(400, "invalid", f"reservation {value} has too few VMs free")
        return key

    def use_reservation(self, key: tuple[str, str, str], delta: int) -> None:
        spec = self.reservations[key]["specificReservation"]
        spec["inUseCount"] = str(int(spec["inUseCount"]) + delta)
