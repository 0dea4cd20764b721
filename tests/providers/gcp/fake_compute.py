"""A small Compute Engine fake served over HTTP, for the real google-cloud-compute client.

Scripted, explicit behaviour (no MagicMock): state for instances, resource policies, firewall
rules and operations; every request captured (`requests`, `sent(...)`); faults injected with
`fail(...)` (HTTP error before acting, or after acting: the reply is lost but the change is made),
`stockout(zone)` (instance inserts there end in ZONE_RESOURCE_POOL_EXHAUSTED) and
`fail_operation(...)` (the operation ends DONE with an error code; for inserts the pattern is
matched against the collection path + "/" + the new resource's name).

Inserts honour requestId like the real API: the same requestId returns the first operation and
makes nothing new. Names are unique per scope (409 alreadyExists). Operations are RUNNING when
returned by an insert/delete and DONE at their first get/wait (`pending_polls` makes them need
more waits).

This module serves, captures, scripts faults (fake_compute_faults.py) and runs operations; each
API's resources are a mixin: instances and resource policies (fake_compute_instances.py),
networks, subnetworks and firewall rules (fake_compute_network.py), the catalog
(fake_compute_catalog.py), the guest agent (fake_compute_guest.py), quotas and reservations
(fake_compute_project.py).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fake_compute_catalog import BASE, CatalogMixin, HttpError
from fake_compute_faults import Fault, OpFault
from fake_compute_guest import GUEST_ROUTES, GuestMixin
from fake_compute_instances import InstancesMixin
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


class FakeCompute(InstancesMixin, NetworkMixin, CatalogMixin, GuestMixin, ProjectMixin):
    def __init__(self, zones: dict[str, list[str]] | None = None) -> None:
        self._init_catalog(zones)
        self._init_network()
        self._init_guest()
        self._init_project()
        self._init_instances()
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
        ("GET", r"projects/([^/]+)/(?:zones|regions)/([^/]+)/operations/([^/]+)$", "_get_op"),
        ("POST", r"projects/([^/]+)/(?:zones|regions)/([^/]+)/operations/([^/]+)/wait$",
         "_wait_op"),
        ("GET", r"projects/([^/]+)/global/operations/([^/]+)$", "_get_global_op"),
        ("POST", r"projects/([^/]+)/global/operations/([^/]+)/wait$", "_wait_global_op"),
    ]

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        for verb, pattern, handler in (self.ROUTES + self.INSTANCE_ROUTES + self.NETWORK_ROUTES
                                       + GUEST_ROUTES
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

    # --- operations -----------------------------------------------------------------------------
    def _get_op(self, project: str, scope: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)

    def _wait_op(self, project: str, scope: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)

    def _get_global_op(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)

    def _wait_global_op(self, project: str, name: str, **_: Any) -> tuple[int, Any]:
        return 200, self._advance(name)
