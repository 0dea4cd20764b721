"""Instances and resource policies, as a mixin of FakeCompute (fake_compute.py).

instances.bulkInsert is served like the real API: count/minCount, names from
perInstanceProperties, InstanceProperties with NAMES (machine type, resource policies); all or
nothing (a stockout or a failed name ends the operation with the error and creates none).
A resource policy in use by an instance cannot be deleted (400 resourceInUseByAnotherResource).
"""

from __future__ import annotations

import re
from typing import Any

from fake_compute_catalog import BASE, HttpError
from fake_compute_faults import OpFault


class InstancesMixin:
    zones: dict[str, list[str]]
    stockouts: set[str]
    instances: dict[tuple[str, str, str], dict[str, Any]]
    policies: dict[tuple[str, str, str], dict[str, Any]]
    instance_reservations: dict[tuple[str, str, str], tuple[str, str, str]]

    INSTANCE_ROUTES: list[tuple[str, str, str]] = [
        ("POST", r"projects/([^/]+)/zones/([^/]+)/instances$", "_insert_instance"),
        ("POST", r"projects/([^/]+)/zones/([^/]+)/instances/bulkInsert$", "_bulk_insert"),
        ("GET", r"projects/([^/]+)/zones/([^/]+)/instances$", "_list_instances"),
        ("GET", r"projects/([^/]+)/aggregated/instances$", "_aggregated_instances"),
        ("GET", r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$", "_get_instance"),
        ("DELETE", r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$", "_delete_instance"),
        ("POST", r"projects/([^/]+)/regions/([^/]+)/resourcePolicies$", "_insert_policy"),
        ("GET", r"projects/([^/]+)/regions/([^/]+)/resourcePolicies/([^/]+)$", "_get_policy"),
        ("DELETE", r"projects/([^/]+)/regions/([^/]+)/resourcePolicies/([^/]+)$",
         "_delete_policy"),
        ("GET", r"projects/([^/]+)/aggregated/resourcePolicies$", "_aggregated_policies"),
    ]

    def _init_instances(self) -> None:
        self.instance_reservations = {}
        self.instances = {}
        self.policies = {}

    # FakeCompute's write helpers: _dedup, _remember, _new_op, _public, _take_op_fault, _filter

    def _insert_instance(self, project: str, zone: str, query: dict[str, str], body: Any,
                         path: str) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        name = body["name"]
        if (project, zone, name) in self.instances:
            raise HttpError(409, "alreadyExists", f"instance {name} already exists")
        mt = body.get("machineType", "").rsplit("/", 1)[-1]
        if mt not in self.zones.get(zone, []):
            raise HttpError(400, "invalid", f"machine type {mt} not in {zone}")
        policies = []
        for link in body.get("resourcePolicies", []):
            m = re.search(r"regions/([^/]+)/resourcePolicies/([^/]+)$", link)
            if not m or (project, m.group(1), m.group(2)) not in self.policies:
                raise HttpError(400, "invalid", f"resource policy {link} not found")
            policies.append(f"{BASE}/projects/{project}/regions/{m.group(1)}/resourcePolicies/"
                            f"{m.group(2)}")  # answered as full URLs, like the API
        self.require_nics(project, zone, body.get("networkInterfaces", []))
        reservation = self.take_reservation(project, zone, dict(body, machineType=mt), 1)
        target = f"projects/{project}/zones/{zone}/instances/{name}"
        fault = self._take_op_fault("POST", f"{path}/{name}")
        if fault is None and zone in self.stockouts and reservation is None:
            fault = OpFault("POST", re.compile(""), "ZONE_RESOURCE_POOL_EXHAUSTED", 503, 1)
        op = self._new_op(project, "insert", target, ("zone", zone), fault)
        self._remember(query, op)
        if fault is None:
            self._store_instance(project, zone, dict(
                body, resourcePolicies=policies,
                machineType=f"{BASE}/projects/{project}/zones/{zone}/machineTypes/{mt}"))
            if reservation is not None:
                self.use_reservation(reservation, 1)
                self.instance_reservations[(project, zone, name)] = reservation
        return 200, self._public(op)

    def _bulk_insert(self, project: str, zone: str, query: dict[str, str], body: Any,
                     path: str) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        count = int(body.get("count", 0))
        min_count = int(body.get("minCount", count))
        names = list(body.get("perInstanceProperties", {}))
        props = dict(body.get("instanceProperties", {}))
        if not 1 <= min_count <= count or (names and len(names) != count):
            raise HttpError(400, "invalid", f"count {count}, minCount {min_count}, "
                            f"{len(names)} names")
        if not names:
            raise HttpError(400, "invalid", "namePattern is not served by this fake")
        if any((project, zone, n) in self.instances for n in names):
            raise HttpError(409, "alreadyExists", "an instance of that name already exists")
        mt = props.get("machineType", "")
        if "/" in mt:  # the documented answer to a URL here
            raise HttpError(500, "INTERNAL_ERROR", f"machineType must be a name: {mt}")
        if mt not in self.zones.get(zone, []):
            raise HttpError(400, "invalid", f"machine type {mt} not in {zone}")
        self.require_nics(project, zone, props.get("networkInterfaces", []))
        region = self._region_of(zone)
        policies = []
        for policy in props.get("resourcePolicies", []):
            if "/" in policy or (project, region, policy) not in self.policies:
                raise HttpError(400, "invalid", f"resource policy {policy} not in {region}")
            policies.append(f"{BASE}/projects/{project}/regions/{region}/resourcePolicies/{policy}")
        reservation = self.take_reservation(project, zone, props, count)
        fault = next((f for f in (self._take_op_fault("POST", f"{path.rsplit('/', 1)[0]}/{n}")
                                  for n in names) if f is not None), None)
        if fault is None and zone in self.stockouts and reservation is None:
            fault = OpFault("POST", re.compile(""), "ZONE_RESOURCE_POOL_EXHAUSTED", 503, 1)
        op = self._new_op(project, "bulkInsert", f"projects/{project}/zones/{zone}", ("zone", zone),
                          fault)
        self._remember(query, op)
        if fault is None:  # all or nothing
            for name in names:
                inst = dict(props, name=name, resourcePolicies=policies,
                            machineType=f"{BASE}/projects/{project}/zones/{zone}/machineTypes/{mt}")
                self._store_instance(project, zone, inst)
                if reservation is not None:
                    self.use_reservation(reservation, 1)
                    self.instance_reservations[(project, zone, name)] = reservation
        return 200, self._public(op)

    def _store_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        n = len(self.instances) + 2
        target = f"projects/{project}/zones/{zone}/instances/{body['name']}"
        inst = dict(body)
        inst.update({
            "kind": "compute#instance", "id": str(next(self._ids)), "status": "RUNNING",
            "zone": f"{BASE}/projects/{project}/zones/{zone}", "selfLink": f"{BASE}/{target}",
        })
        nics = [dict(nic) for nic in body.get("networkInterfaces", [])]
        for nic in nics:
            nic["networkIP"] = f"10.128.0.{n}"
            nic["accessConfigs"] = [dict(a, natIP=f"203.0.113.{n}")
                                    for a in nic.get("accessConfigs", [])]
        inst["networkInterfaces"] = nics
        self.instances[(project, zone, body["name"])] = inst
        self.vm_booted((project, zone, body["name"]))

    def _get_instance(self, project: str, zone: str, name: str, **_: Any) -> tuple[int, Any]:
        inst = self.instances.get((project, zone, name))
        if inst is None:
            raise HttpError(404, "notFound", f"instance {name} not found")
        return 200, inst

    def _list_instances(self, project: str, zone: str, query: dict[str, str],
                        **_: Any) -> tuple[int, Any]:
        items = [v for (p, z, _n), v in self.instances.items() if p == project and z == zone]
        return 200, {"items": self._filter(items, query.get("filter"))}

    def _aggregated_instances(self, project: str, query: dict[str, str],
                              **_: Any) -> tuple[int, Any]:
        by_zone: dict[str, list[dict[str, Any]]] = {}
        for (p, z, _n), v in self.instances.items():
            if p == project:
                by_zone.setdefault(f"zones/{z}", []).append(v)
        items = {scope: {"instances": self._filter(v, query.get("filter"))}
                 for scope, v in by_zone.items()}
        return 200, {"items": {k: v for k, v in items.items() if v["instances"]}}

    def _delete_instance(self, project: str, zone: str, name: str, query: dict[str, str],
                         **_: Any) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        if self.instances.pop((project, zone, name), None) is None:
            raise HttpError(404, "notFound", f"instance {name} not found")
        if (used := self.instance_reservations.pop((project, zone, name), None)) is not None:
            self.use_reservation(used, -1)
        op = self._new_op(project, "delete", f"projects/{project}/zones/{zone}/instances/{name}",
                          ("zone", zone))
        self._remember(query, op)
        return 200, self._public(op)


    # --- resource policies ---------------------------------------------------------------------
    def _insert_policy(self, project: str, region: str, query: dict[str, str], body: Any,
                       path: str) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        name = body["name"]
        if (project, region, name) in self.policies:
            raise HttpError(409, "alreadyExists", f"resource policy {name} already exists")
        target = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        fault = self._take_op_fault("POST", f"{path}/{name}")
        op = self._new_op(project, "insert", target, ("region", region), fault)
        self._remember(query, op)
        if fault is None:
            self.policies[(project, region, name)] = dict(
                body, region=f"{BASE}/projects/{project}/regions/{region}",
                selfLink=f"{BASE}/{target}", status="READY")
        return 200, self._public(op)

    def _get_policy(self, project: str, region: str, name: str, **_: Any) -> tuple[int, Any]:
        pol = self.policies.get((project, region, name))
        if pol is None:
            raise HttpError(404, "notFound", f"resource policy {name} not found")
        return 200, pol

    def _aggregated_policies(self, project: str, **_: Any) -> tuple[int, Any]:
        items: dict[str, dict[str, list[Any]]] = {}
        for (p, r, _n), v in self.policies.items():
            if p == project:
                items.setdefault(f"regions/{r}", {"resourcePolicies": []})[
                    "resourcePolicies"].append(v)
        return 200, {"items": items}

    def _delete_policy(self, project: str, region: str, name: str, query: dict[str, str],
                       **_: Any) -> tuple[int, Any]:
        if (project, region, name) not in self.policies:
            raise HttpError(404, "notFound", f"resource policy {name} not found")
        for inst in self.instances.values():
            if any(link.endswith(f"regions/{region}/resourcePolicies/{name}")
                   for link in inst.get("resourcePolicies", [])):
                raise HttpError(400, "resourceInUseByAnotherResource",
                                f"resource policy {name} is in use by {inst['name']}")
        del self.policies[(project, region, name)]
        op = self._new_op(project, "delete",
                          f"projects/{project}/regions/{region}/resourcePolicies/{name}",
                          ("region", region))
        return 200, self._public(op)
