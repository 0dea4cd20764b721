"""A small Compute Engine fake served over HTTP, for the real google-cloud-compute client.

Scripted, explicit behaviour (no MagicMock): state for instances, resource policies, firewall
rules and operations; every request captured (`requests`, `sent(...)`); faults injected with
`fail(...)` (HTTP error before acting, or after acting: the reply is lost but the change is made),
`stockout(zone)` (instance inserts there end in ZONE_RESOURCE_POOL_EXHAUSTED) and
`fail_operation(...)` (the operation ends DONE with an error code; for inserts the pattern is
matched against the collection path + "/" + the new resource's name).

instances.bulkInsert is served like the real API: count/minCount, names from
perInstanceProperties, InstanceProperties with NAMES (machine type, resource policies); all or
nothing (a stockout or a failed name ends the operation with the error and creates none).

Inserts honour requestId like the real API: the same requestId returns the first operation and
makes nothing new. Names are unique per scope (409 alreadyExists). A resource policy in use by an
instance cannot be deleted (400 resourceInUseByAnotherResource). Operations are RUNNING when
returned by an insert/delete and DONE at their first get/wait (`pending_polls` makes them need
more waits).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fake_compute_catalog import BASE, CatalogMixin, HttpError
from fake_compute_guest import GUEST_ROUTES, GuestMixin
from fake_compute_network import NetworkMixin
from fake_compute_project import PROJECT_ROUTES, ProjectMixin

PREFIX = "/compute/v1/"

@dataclass
class Captured:
    method: str
    path: str  # without /compute/v1/ and query
    query: dict[str, str]
    body: Any
    status: int = 0  # the HTTP status answered (set once handled)


@dataclass
class Fault:
    method: str
    pattern: re.Pattern[str]
    status: int
    reason: str
    times: int
    after: bool  # act first, then answer with the error (the reply is "lost")
    html: bytes | None = None  # answer with this HTML page instead (a proxy's, say)


@dataclass
class OpFault:
    method: str
    pattern: re.Pattern[str]
    code: str
    http_status: int
    times: int
    details: list[dict[str, Any]] = field(default_factory=list)


class FakeCompute(NetworkMixin, CatalogMixin, GuestMixin, ProjectMixin):
    def __init__(self, zones: dict[str, list[str]] | None = None) -> None:
        self._init_catalog(zones)
        self._init_network()
        self._init_guest()
        self._init_project()
        self.instance_reservations: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.policies: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.firewalls: dict[tuple[str, str], dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.request_ids: dict[str, str] = {}
        self.requests: list[Captured] = []
        self.faults: list[Fault] = []
        self.op_faults: list[OpFault] = []
        self.stockouts: set[str] = set()
        self.pending_polls = 0
        self._ids = itertools.count(1000)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connection
            # Headers and body go out in two writes: with Nagle's algorithm on, the body waits
            # for the client's delayed ACK (~40 ms per request on Linux).
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload = fake.handle(method, self.path, raw)
                html = isinstance(payload, bytes)
                data = payload if html else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if html else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._serve("DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)  # stop() waits one poll, 20 ms
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    # --- scripting ----------------------------------------------------------------------------
    def fail(self, method: str, pattern: str, status: int, *, times: int = 1,
             reason: str = "", after: bool = False) -> None:
        """Answer requests matching METHOD + regex on the path with an HTTP error."""
        self.faults.append(Fault(method, re.compile(pattern), status, reason, times, after))

    def html(self, method: str, pattern: str, status: int = 200, *, times: int = 1) -> None:
        """Answer matching requests with an HTML page (a proxy's error page)."""
        self.faults.append(Fault(method, re.compile(pattern), status, "", times, False,
                                 b"<!DOCTYPE html><html><body>Please sign in</body></html>"))

    def fail_operation(self, method: str, pattern: str, code: str, *, http_status: int = 400,
                       times: int = 1, details: list[dict[str, Any]] | None = None) -> None:
        """Let the matching write be accepted, then end its operation DONE with `code`
        (nothing is made)."""
        self.op_faults.append(OpFault(method, re.compile(pattern), code, http_status, times,
                                      details or []))

    def stockout(self, *zones: str) -> None:
        self.stockouts.update(zones)

    def network_quota_fault(self, project: str) -> OpFault | None:
        """A network insert beyond the NETWORKS quota ends in QUOTA_EXCEEDED."""
        if self.networks_used(project) < self.networks_quota:
            return None
        details = [{"quotaInfo": {"metricName": "compute.googleapis.com/networks",
                                  "limitName": "NETWORKS-per-project", "dimensions": {}}}]
        return OpFault("POST", re.compile(""), "QUOTA_EXCEEDED", 403, 1, details)

    def sent(self, method: str, pattern: str) -> list[Captured]:
        rx = re.compile(pattern)
        return [r for r in self.requests if r.method == method and rx.search(r.path)]

    def all_resources(self) -> list[str]:
        with self._lock:
            return ([f"instance {k[1]}/{k[2]}" for k in self.instances]
                    + [f"policy {k[1]}/{k[2]}" for k in self.policies]
                    + [f"firewall {k[1]}" for k in self.firewalls]
                    + [f"network {k[1]}" for k in self.networks]
                    + [f"subnetwork {k[1]}/{k[2]}" for k in self.subnetworks])

    # --- dispatch -----------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, raw: bytes) -> tuple[int, Any]:
        """(status, JSON-able payload, or bytes of an HTML page)."""
        parts = urlsplit(raw_path)
        path = parts.path.removeprefix(PREFIX)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        body = json.loads(raw) if raw else None
        with self._lock:
            captured = Captured(method, path, query, body)
            self.requests.append(captured)
            status, payload = self._handle(captured)
            captured.status = status
            return status, payload

    def _handle(self, captured: Captured) -> tuple[int, Any]:
        method, path, query, body = captured.method, captured.path, captured.query, captured.body
        fault = self._take_fault(method, path)
        if fault is not None and fault.html is not None:
            return fault.status, fault.html
        try:
            if fault is not None and not fault.after:
                raise HttpError(fault.status, fault.reason or "injected", "injected fault")
            status, payload = self._route(method, path, query, body)
            if fault is not None:
                raise HttpError(fault.status, fault.reason or "injected", "injected fault")
            return status, payload
        except HttpError as exc:
            return exc.status, {"error": {
                "code": exc.status, "message": exc.message,
                "errors": [{"message": exc.message, "domain": "global",
                            "reason": exc.reason}]}}

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.pattern.search(path):
                fault.times -= 1
                return fault
        return None

    def _take_op_fault(self, method: str, path: str) -> OpFault | None:
        for fault in self.op_faults:
            if fault.times > 0 and fault.method == method and fault.pattern.search(path):
                fault.times -= 1
                return fault
        return None

    ROUTES: list[tuple[str, str, str]] = [
        ("GET", r"projects/([^/]+)/regions/([^/]+)$", "_get_region"),
        ("GET", r"projects/([^/]+)/zones/([^/]+)/machineTypes/([^/]+)$", "_get_machine_type"),
        ("GET", r"projects/([^/]+)/zones/([^/]+)/acceleratorTypes/([^/]+)$", "_get_accelerator"),
        ("GET", r"projects/([^/]+)/global/images/family/([^/]+)$", "_get_image_family"),
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
        ("POST", r"projects/([^/]+)/global/firewalls$", "_insert_firewall"),
        ("GET", r"projects/([^/]+)/global/firewalls$", "_list_firewalls"),
        ("GET", r"projects/([^/]+)/global/firewalls/([^/]+)$", "_get_firewall"),
        ("DELETE", r"projects/([^/]+)/global/firewalls/([^/]+)$", "_delete_firewall"),
        ("GET", r"projects/([^/]+)/(?:zones|regions)/([^/]+)/operations/([^/]+)$", "_get_op"),
        ("POST", r"projects/([^/]+)/(?:zones|regions)/([^/]+)/operations/([^/]+)/wait$",
         "_wait_op"),
        ("GET", r"projects/([^/]+)/global/operations/([^/]+)$", "_get_global_op"),
        ("POST", r"projects/([^/]+)/global/operations/([^/]+)/wait$", "_wait_global_op"),
    ]

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        for verb, pattern, handler in (self.ROUTES + self.NETWORK_ROUTES + GUEST_ROUTES
                                       + PROJECT_ROUTES + self.CATALOG_ROUTES):
            m = re.match(pattern, path)
            if verb == method and m:
                result: tuple[int, Any] = getattr(self, handler)(*m.groups(), query=query,
                                                                  body=body, path=path)
                return result
        raise HttpError(404, "notFound", f"no route for {method} {path}")

    # --- helpers ------------------------------------------------------------------------------
    def _new_op(self, project: str, kind: str, target: str, scope: tuple[str, str] | None,
                error: OpFault | None = None, status: str = "RUNNING") -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name,
            "operationType": kind, "targetLink": f"{BASE}/{target}", "status": status,
            "progress": 0, "_polls": self.pending_polls,
        }
        if scope is not None:
            op[scope[0]] = f"{BASE}/projects/{project}/{scope[0]}s/{scope[1]}"
        if error is not None:
            op["_error"] = {"errors": [{"code": error.code, "message": f"injected {error.code}",
                                        "errorDetails": error.details}]}
            op["_http_status"] = error.http_status
        self.operations[name] = op
        return op

    def _public(self, op: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def _advance(self, name: str) -> dict[str, Any]:
        op = self.operations.get(name)
        if op is None:
            raise HttpError(404, "notFound", f"operation {name} not found")
        if op["status"] != "DONE":
            if op["_polls"] > 0:
                op["_polls"] -= 1
            else:
                op["status"] = "DONE"
                op["progress"] = 100
                if "_error" in op:
                    op["error"] = op["_error"]
                    op["httpErrorStatusCode"] = op["_http_status"]
                    op["httpErrorMessage"] = "INJECTED"
        return self._public(op)

    def _dedup(self, query: dict[str, str]) -> dict[str, Any] | None:
        rid = query.get("requestId")
        if rid and rid in self.request_ids:
            return self._public(self.operations[self.request_ids[rid]])
        return None

    def _remember(self, query: dict[str, str], op: dict[str, Any]) -> None:
        if query.get("requestId"):
            self.request_ids[query["requestId"]] = op["name"]

    @staticmethod
    def _filter(items: list[dict[str, Any]], flt: str | None) -> list[dict[str, Any]]:
        if not flt:
            return items
        m = re.fullmatch(r'\s*labels\.([\w-]+)\s*(?::\s*\*|=\s*"?([\w-]+)"?)\s*', flt)
        if not m:
            raise HttpError(400, "invalid", f"unsupported filter {flt!r}")
        key, value = m.groups()
        return [i for i in items if key in i.get("labels", {})
                and (value is None or i["labels"][key] == value)]

    # --- instances ------------------------------------------------------------------------------
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

    # --- operations -----------------------------------------------------------------------------
    def _get_op(self, project: str, scope: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)

    def _wait_op(self, project: str, scope: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)

    def _get_global_op(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)

    def _wait_global_op(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)
