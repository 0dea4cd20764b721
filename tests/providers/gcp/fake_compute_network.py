"""The VPC part of the Compute fake: networks, subnetworks (GPUDirect's data networks) and
firewall rules, as a mixin of FakeCompute (fake_compute.py). Served like the real API: names
unique per scope (409), a subnetwork needs its network, a firewall rule needs its network, a
VM's NICs need theirs; a network with subnetworks or firewall rules, or a subnetwork a VM uses,
cannot be deleted (400 resourceInUseByAnotherResource: "Deleting a VPC network", "Deleting a
subnet")."""

from __future__ import annotations

import re
from typing import Any

from fake_compute_catalog import BASE, HttpError

DEFAULT_NETWORK = "default"  # every project has it (auto mode); not modelled further


def _name(link: str) -> str:
    return str(link).rstrip("/").rsplit("/", 1)[-1]


class NetworkMixin:
    networks: dict[tuple[str, str], dict[str, Any]]
    subnetworks: dict[tuple[str, str, str], dict[str, Any]]
    instances: dict[tuple[str, str, str], dict[str, Any]]
    firewalls: dict[tuple[str, str], dict[str, Any]]

    NETWORK_ROUTES: list[tuple[str, str, str]] = [
        ("POST", r"projects/([^/]+)/global/networks$", "_insert_network"),
        ("GET", r"projects/([^/]+)/global/networks$", "_list_networks"),
        ("GET", r"projects/([^/]+)/global/networks/([^/]+)$", "_get_network"),
        ("DELETE", r"projects/([^/]+)/global/networks/([^/]+)$", "_delete_network"),
        ("POST", r"projects/([^/]+)/regions/([^/]+)/subnetworks$", "_insert_subnetwork"),
        ("GET", r"projects/([^/]+)/regions/([^/]+)/subnetworks/([^/]+)$", "_get_subnetwork"),
        ("DELETE", r"projects/([^/]+)/regions/([^/]+)/subnetworks/([^/]+)$",
         "_delete_subnetwork"),
        ("GET", r"projects/([^/]+)/aggregated/subnetworks$", "_aggregated_subnetworks"),

        ("POST", r"projects/([^/]+)/global/firewalls$", "_insert_firewall"),
        ("GET", r"projects/([^/]+)/global/firewalls$", "_list_firewalls"),
        ("GET", r"projects/([^/]+)/global/firewalls/([^/]+)$", "_get_firewall"),
        ("DELETE", r"projects/([^/]+)/global/firewalls/([^/]+)$", "_delete_firewall"),
    ]

    def _init_network(self) -> None:
        self.networks = {}
        self.subnetworks = {}
        self.firewalls = {}

    # FakeCompute's write helpers: _dedup, _remember, _new_op, _public, _take_op_fault

    # --- checks used by the instance and firewall inserts ----------------------------------------
    def require_network(self, project: str, link: str) -> None:
        name = _name(link)
        if name != DEFAULT_NETWORK and (project, name) not in self.networks:
            raise HttpError(400, "invalid", f"network {link} not found")

    def require_nics(self, project: str, zone: str, nics: list[dict[str, Any]]) -> None:
        region = zone.rsplit("-", 1)[0]
        for nic in nics:
            self.require_network(project, nic.get("network", DEFAULT_NETWORK))
            sub = nic.get("subnetwork")
            if sub is None:
                continue
            found = self.subnetworks.get((project, region, _name(sub)))
            if found is None:
                raise HttpError(400, "invalid", f"subnetwork {sub} not found in {region}")
            if _name(found["network"]) != _name(nic.get("network", "")):
                raise HttpError(400, "invalid", f"subnetwork {sub} is not in {nic['network']}")

    # --- networks -----------------------------------------------------------------------------
    def _insert_network(self, project: str, query: dict[str, str], body: Any,
                        path: str) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        name = body["name"]
        if (project, name) in self.networks or name == DEFAULT_NETWORK:
            raise HttpError(409, "alreadyExists", f"network {name} already exists")
        target = f"projects/{project}/global/networks/{name}"
        fault = self._take_op_fault("POST", f"{path}/{name}") or self.network_quota_fault(project)
        op = self._new_op(project, "insert", target, None, fault)
        self._remember(query, op)
        if fault is None:
            self.networks[(project, name)] = dict(body, selfLink=f"{BASE}/{target}")
        return 200, self._public(op)

    def _list_networks(self, project: str, **_: Any) -> tuple[int, Any]:
        return 200, {"items": [v for (p, _n), v in self.networks.items() if p == project]}

    def _get_network(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        net = self.networks.get((project, name))
        if net is None:
            raise HttpError(404, "notFound", f"network {name} not found")
        return 200, net

    def _delete_network(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        if (project, name) not in self.networks:
            raise HttpError(404, "notFound", f"network {name} not found")
        users = [f"subnetwork {n}" for (p, _r, n), s in self.subnetworks.items()
                 if p == project and _name(s["network"]) == name]
        users += [f"firewall {n}" for (p, n), f in self.firewalls.items()
                  if p == project and _name(f.get("network", "")) == name]
        if users:
            raise HttpError(400, "resourceInUseByAnotherResource",
                            f"network {name} is in use by {', '.join(users)}")
        del self.networks[(project, name)]
        op = self._new_op(project, "delete", f"projects/{project}/global/networks/{name}", None)
        return 200, self._public(op)

    # --- subnetworks --------------------------------------------------------------------------
    def _insert_subnetwork(self, project: str, region: str, query: dict[str, str], body: Any,
                           path: str) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        name = body["name"]
        if (project, region, name) in self.subnetworks:
            raise HttpError(409, "alreadyExists", f"subnetwork {name} already exists")
        self.require_network(project, body.get("network", ""))
        if not re.fullmatch(r"\d+\.\d+\.\d+\.\d+/\d+", str(body.get("ipCidrRange", ""))):
            raise HttpError(400, "invalid", f"ipCidrRange {body.get('ipCidrRange')!r}")
        target = f"projects/{project}/regions/{region}/subnetworks/{name}"
        fault = self._take_op_fault("POST", f"{path}/{name}")
        op = self._new_op(project, "insert", target, ("region", region), fault)
        self._remember(query, op)
        if fault is None:
            self.subnetworks[(project, region, name)] = dict(
                body, region=f"{BASE}/projects/{project}/regions/{region}",
                selfLink=f"{BASE}/{target}")
        return 200, self._public(op)

    def _get_subnetwork(self, project: str, region: str, name: str, **_: Any) -> tuple[int, Any]:
        sub = self.subnetworks.get((project, region, name))
        if sub is None:
            raise HttpError(404, "notFound", f"subnetwork {name} not found")
        return 200, sub

    def _aggregated_subnetworks(self, project: str, **_: Any) -> tuple[int, Any]:
        items: dict[str, dict[str, list[Any]]] = {}
        for (p, r, _n), v in self.subnetworks.items():
            if p == project:
                items.setdefault(f"regions/{r}", {"subnetworks": []})["subnetworks"].append(v)
        return 200, {"items": items}

    def _delete_subnetwork(self, project: str, region: str, name: str,
                           **_: Any) -> tuple[int, Any]:
        if (project, region, name) not in self.subnetworks:
            raise HttpError(404, "notFound", f"subnetwork {name} not found")
        users = [inst["name"] for (p, z, _n), inst in self.instances.items()
                 if p == project and z.rsplit("-", 1)[0] == region
                 and any(_name(nic.get("subnetwork", "")) == name
                         for nic in inst.get("networkInterfaces", []))]
        if users:
            raise HttpError(400, "resourceInUseByAnotherResource",
                            f"subnetwork {name} is in use by {', '.join(users)}")
        del self.subnetworks[(project, region, name)]
        op = self._new_op(project, "delete",
                          f"projects/{project}/regions/{region}/subnetworks/{name}",
                          ("region", region))
        return 200, self._public(op)

    # --- firewalls --------------------------------------------------------------------------------
    def _insert_firewall(self, project: str, query: dict[str, str], body: Any,
                         path: str) -> tuple[int, Any]:
        if (dup := self._dedup(query)) is not None:
            return 200, dup
        name = body["name"]
        if (project, name) in self.firewalls:
            raise HttpError(409, "alreadyExists", f"firewall {name} already exists")
        self.require_network(project, body.get("network", "global/networks/default"))
        target = f"projects/{project}/global/firewalls/{name}"
        fault = self._take_op_fault("POST", path + "/" + name)
        op = self._new_op(project, "insert", target, None, fault)
        self._remember(query, op)
        if fault is None:
            self.firewalls[(project, name)] = dict(body, selfLink=f"{BASE}/{target}")
        return 200, self._public(op)

    def _list_firewalls(self, project: str, **_: Any) -> tuple[int, Any]:
        return 200, {"items": [v for (p, _n), v in self.firewalls.items() if p == project]}

    def _get_firewall(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        fw = self.firewalls.get((project, name))
        if fw is None:
            raise HttpError(404, "notFound", f"firewall {name} not found")
        return 200, fw

    def _delete_firewall(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        if self.firewalls.pop((project, name), None) is None:
            raise HttpError(404, "notFound", f"firewall {name} not found")
        op = self._new_op(project, "delete", f"projects/{project}/global/firewalls/{name}", None)
        return 200, self._public(op)
