"""A small Kubernetes API server for the real `kubernetes` client, over HTTP on 127.0.0.1:
what the k8s provider uses, nothing more.

    GET  /version /api /apis                         discovery (JobSet/Kueue groups optional)
    core v1: namespaces/NS/{pods,services,secrets,events,resourcequotas,serviceaccounts}[/NAME]
                                                     create get list watch patch delete
             namespaces/NS/pods/NAME/status          PATCH (as PodGC marks a pod Failed)
             namespaces/NS/pods/NAME/log             the kubelet's container log
             namespaces/NS/pods/NAME/portforward     websocket (standin_ws.py) to the pod's port
    apis/GROUP/VERSION/namespaces/NS/PLURAL[/NAME]   jobsets; Kueue's workloads, localqueues
                                                     (v1beta2 stored, v1beta1 served while
                                                     `kueue_versions` has it); roles,
                                                     rolebindings (rbac.authorization.k8s.io)

Every create and patch the client sends is judged by the official schemas (k8s_schemas.py):
a broken manifest gets 422 Invalid and is kept in `violations` (tests fail on any). Then
admission (standin_admission.py): defaults, ResourceQuota, Kueue's JobSet webhook. Every
request is recorded in `requests`. A bearer token is required: the kubeconfig's, or a
ServiceAccount's a pod got (standin_incluster.py: HTTPS for pods, RBAC, the ServiceAccount
admission). A DELETE's preconditions.uid is checked (409 Conflict when the name holds
another object: apimachinery registry/generic/registry/store.go).
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import k8s_schemas
import standin_admission as admission
import standin_ws
from standin_delete import check_preconditions
from standin_incluster import RBAC_GROUP, InCluster
from standin_store import CLUSTER_SCOPED, KINDS, ApiError, Store, now

TOKEN = "standin-token"  # noqa: S105 - the stand-in's own: the user's kubeconfig
KUEUE_TOKEN = "kueue-controller"  # noqa: S105 - the Kueue stand-in's (not the user's Role)
KUEUE = "kueue.x-k8s.io"
# Kueue: v1beta2 is the storage version since 0.16, v1beta1 deprecated since 0.15 and served
# until its removal (kueue v0.19 apis/kueue/v1beta2/*_types.go +kubebuilder:storageversion;
# v1beta1 +kubebuilder:deprecatedversion)
KUEUE_STORED = "v1beta2"


@dataclass
class Seen:
    method: str
    path: str
    body: Any
    query: dict[str, str]
    who: str  # "user" (the kubeconfig's token) | "kueue"


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class ApiServer:
    """Start with `start()`; `kubeconfig(path)` writes a kubeconfig for it."""

    def __init__(self, groups: tuple[str, ...] = ("jobset.x-k8s.io", KUEUE, "resource.k8s.io"),
                 kueue_versions: tuple[str, ...] = ("v1beta2", "v1beta1")) -> None:
        self.store = Store()
        self.groups = groups
        self.versions = {"jobset.x-k8s.io": ("v1alpha2",), KUEUE: kueue_versions,
                         "resource.k8s.io": ("v1",)}
        self.manage_jobs_without_queue_name = False  # Kueue's configuration
        self.stream_idle_timeout_s: float | None = None  # kubelet's: 4 h (None here)
        self.requests: list[Seen] = []
        self.violations: list[str] = []
        self.kubelet: Any = None  # pod address, logs, termination (standin_kubelet.py)
        self.faults: list[tuple[str, str, ApiError]] = []  # (method, path part, error)
        self.store.create("namespaces", "", {"metadata": {"name": "default"}})
        self.incluster = InCluster(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.incluster.stop()

    def serve_pods(self, host: str) -> None:
        """The same API over HTTPS on `host`, for processes in pods (their ServiceAccount)."""
        self.incluster.serve_tls(host, _handler(self))

    def identify(self, auth: str | None) -> str | None:
        who = {f"Bearer {TOKEN}": "user", f"Bearer {KUEUE_TOKEN}": "kueue"}.get(auth or "")
        return who or self.incluster.identify(auth or "")

    def kubeconfig(self, path: Path, context: str = "standin") -> Path:
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": TOKEN}}],
            "contexts": [{"name": context, "context": {"cluster": "standin", "user": "standin",
                                                       "namespace": "default"}}]}))
        return path

    # --- what the handler calls -------------------------------------------------------------
    def judge(self, obj: dict[str, Any]) -> None:
        if obj.get("kind") in ("Workload", "LocalQueue"):  # the tests' own Kueue objects
            return
        found = k8s_schemas.problems(obj)
        if found:
            self.violations += found
            raise ApiError(422, "Invalid", f"{obj.get('kind')} is invalid: " + "; ".join(found))

    def create(self, res: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Admission, then the store: what a user's POST and a controller's create share."""
        obj = copy.deepcopy(obj)  # admission changes the stored object, not the request
        if res == "pods":
            self.incluster.admit_pod(ns, obj)
            admission.default_requests(obj)
            admission.default_tolerations(obj)
            admission.enforce_pod_security(self.store, ns, obj)
            admission.resource_quota(self.store, ns, obj)
        if res.endswith("/jobsets") and KUEUE in self.groups:
            admission.kueue_jobset_webhook(self.store, ns, obj,
                                           self.manage_jobs_without_queue_name)
        return self.store.create(res, ns, obj)

    def delete(self, res: str, ns: str, name: str, grace: int | None = None,
               uid: str | None = None) -> dict[str, Any]:
        """As the generic registry deletes (store.go Delete; BeforeDelete in
        k8s.io/apiserver pkg/registry/rest/delete.go): a pod's grace period is the request's,
        else its terminationGracePeriodSeconds (30), 0 when it is unscheduled or already
        terminal (pkg/registry/core/pod/strategy.go CheckGracefulDelete); a pod being deleted
        can only have its period shortened. Grace > 0: only marked, its kubelet ends it and
        deletes it with grace 0. Finalizers keep any object (marked) until they are removed."""
        obj = self.store.get(res, ns, name)
        meta = obj["metadata"]
        if uid and uid != meta["uid"]:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                                            f"UID in object meta: {meta['uid']}")
        if res == "pods":
            if grace is None:
                grace = int(obj["spec"].get("terminationGracePeriodSeconds", 30))
            if not obj["spec"].get("nodeName") or \
                    obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                grace = 0
            if meta.get("deletionTimestamp") and grace >= meta.get(
                    "deletionGracePeriodSeconds", 0):
                return obj  # pending: only a shorter period changes it
        else:
            grace = 0
        if grace > 0 or meta.get("finalizers"):
            # the time it should be gone: now + its grace (rest/delete.go BeforeDelete), set
            # again when a pod's period is shortened; an object's first mark otherwise stays
            when = now(grace) if res == "pods" or not meta.get("deletionTimestamp") \
                else meta["deletionTimestamp"]
            return self.store.update(res, ns, name, lambda o: o["metadata"].update(
                deletionTimestamp=when, deletionGracePeriodSeconds=grace))
        self.store.remove(res, ns, name)
        for r, n, child in self.store.owned_by(meta["uid"]):
            try:
                self.delete(r, n, child)
            except ApiError:
                pass
        return obj


def _route(path: str) -> tuple[str, str | None, str | None, str | None, str]:
    """(resource, namespace, name, subresource, version asked) of an API path; ApiError 404
    otherwise. Kueue's kinds are stored once, under their storage version."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest, prefix, version = parts[2:], "", "v1"
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        version = parts[2]
        stored = KUEUE_STORED if parts[1] == KUEUE else version
        rest, prefix = parts[3:], f"{parts[1]}/{stored}/"
    else:
        raise ApiError(404, "NotFound", f"the server could not find {path}")
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        ns, res = rest[1], prefix + rest[2]
        name = rest[3] if len(rest) > 3 else None
        sub = rest[4] if len(rest) > 4 else None
    elif rest[:1] == ["namespaces"] and not prefix:
        ns, res, name, sub = "", "namespaces", (rest[1] if len(rest) > 1 else None), None
    elif rest[:1] == ["nodes"] and not prefix:
        ns, res, name, sub = "", "nodes", (rest[1] if len(rest) > 1 else None), None
    elif rest and prefix + rest[0] in CLUSTER_SCOPED:  # e.g. Kueue's WorkloadPriorityClasses
        ns, res, name, sub = "", prefix + rest[0], (rest[1] if len(rest) > 1 else None), None
    else:
        raise ApiError(404, "NotFound", f"the server could not find {path}")
    if res not in KINDS:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                                        f"({res})")
    return res, ns, name, sub, version


def _handler(api: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as Go's kube-apiserver; Nagle: +40 ms per reply

        def log_message(self, *args: Any) -> None:
            return None

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n)) if n else None

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = self._body() if method in ("POST", "PATCH", "PUT", "DELETE") else None
            who = api.identify(self.headers.get("Authorization"))
            api.requests.append(Seen(method, url.path, body, query, who or "nobody"))
            try:
                if who is None:
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                api.incluster.authorize(who, method, url.path, query, body)
                for m, part, error in api.faults:  # injected by a test
                    if m == method and part in url.path:
                        raise error
                self._dispatch(method, url.path, query, body)
            except ApiError as exc:
                self._send(exc.code, exc.status())

        def _dispatch(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
            _dispatch(self, api, method, path, query, body)

        def store_get(self, res: str, ns: str, name: str | None) -> dict[str, Any]:
            return api.store.get(res, ns, name or "")

        def _any(self) -> None:
            self._serve(self.command)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any  # noqa: N815 - http.server's

    return Handler


def _dispatch(h: Any, api: ApiServer, method: str, path: str, query: dict[str, str],
              body: Any) -> None:
    """One request, authenticated: discovery, a subresource, a watch, or plain CRUD."""
    if path.rstrip("/") in ("/version", "/api", "/apis"):
        return h._send(200, _discovery(api, path.rstrip("/")))
    res, ns, name, sub, version = _route(path)
    group = res.split("/")[0] if "/" in res else ""
    if group and group != RBAC_GROUP and (group not in api.groups
                                          or version not in api.versions[group]):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    ns = ns or ""
    if sub == "status" and method == "PATCH" and res == "pods":
        return h._send(200, api.store.update(
            res, ns, name or "", lambda o: o.update(status=merge_patch(
                o.get("status", {}), (body or {}).get("status", {})))))
    if sub == "log":
        h.store_get(res, ns, name)
        text = api.kubelet.logs(ns, name, query) if api.kubelet else ""
        return h._send(200, text.encode(), "text/plain")
    if sub == "portforward":
        pod = h.store_get(res, ns, name)
        target = api.kubelet.address(pod) if api.kubelet else None
        return standin_ws.serve_portforward(h, target, query, api.stream_idle_timeout_s)
    if method == "GET" and name is None and query.get("watch", "").lower() in ("true", "1"):
        return _watch(h, api, res, ns, query)
    code, answer = _crud(api, method, res, ns, name, query, body)
    if group and isinstance(answer, dict):  # as asked: v1beta1 or v1beta2
        for obj in [answer, *answer.get("items", [])]:
            obj["apiVersion"] = f"{group}/{version}"
    h._send(code, answer)


def _discovery(api: ApiServer, path: str) -> dict[str, Any]:
    if path == "/version":
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-standin"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}
                                       for v in api.versions[g]],
               "preferredVersion": {"groupVersion": f"{g}/{api.versions[g][0]}",
                                    "version": api.versions[g][0]}}
              for g in api.groups]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _crud(api: ApiServer, method: str, res: str, ns: str, name: str | None,
          query: dict[str, str], body: Any) -> tuple[int, Any]:
    store = api.store
    if method == "POST" and name is None:
        api.judge(body)
        return 201, api.create(res, ns, body)
    if method == "GET" and name is None:
        api_version, kind = KINDS[res]
        items = [o for o in store.list(res, ns if res not in CLUSTER_SCOPED else None,
                                       query.get("labelSelector", ""))
                 if fields_match(o, query.get("fieldSelector", ""))]
        return 200, {"kind": f"{kind}List", "apiVersion": api_version, "items": items,
                     "metadata": {"resourceVersion": str(store.rv)}}
    if name is None:
        raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
    if method == "GET":
        return 200, store.get(res, ns, name)
    if method == "DELETE":
        check_preconditions(res, store.get(res, ns, name), body)
        grace = query.get("gracePeriodSeconds", (body or {}).get("gracePeriodSeconds"))
        uid = ((body or {}).get("preconditions") or {}).get("uid")
        return 200, api.delete(res, ns, name, None if grace is None else int(grace), uid)
    if method == "PATCH":
        current = store.get(res, ns, name)
        if isinstance(body, list):
            raise ApiError(415, "UnsupportedMediaType", "json-patch is not served here")
        patched = merge_patch(current, body)
        api.judge({k: v for k, v in patched.items() if k != "status"})

        def change(obj: dict[str, Any]) -> None:
            obj.clear()
            obj.update(patched)

        return 200, store.update(res, ns, name, change)
    raise ApiError(405, "MethodNotAllowed", method)


def fields_match(obj: dict[str, Any], selector: str) -> bool:
    """`a.b=v,c!=w` on the fields an object's kind makes selectable (for events: reason,
    type, involvedObject.*; pkg/registry/core/event/strategy.go ToSelectableFields)."""
    for term in (t for t in selector.split(",") if t):
        key, op, want = term.partition("!=") if "!=" in term else term.partition("=")
        have: Any = obj
        for part in key.strip().split("."):
            have = have.get(part, "") if isinstance(have, dict) else ""
        if (str(have) == want.lstrip("=")) != (op == "="):
            return False
    return True


def _watch(h: Any, api: ApiServer, res: str, ns: str, query: dict[str, str]) -> None:
    """Chunked JSON lines: ADDED for what exists (or events after resourceVersion), then
    events as they come, until timeoutSeconds."""
    import time

    from standin_store import matches

    selector = query.get("labelSelector", "")
    deadline = time.monotonic() + float(query.get("timeoutSeconds") or 300)
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()

    def chunk(data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    with api.store.lock:
        last = api.store.rv
        initial = api.store.list(res, ns, selector)
    try:
        for obj in initial:
            chunk(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        while (left := deadline - time.monotonic()) > 0:
            for rv, kind, r, obj in api.store.wait_events(last, min(left, 1.0)):
                last = rv
                if r == res and obj["metadata"].get("namespace", "") == ns and \
                        matches(obj, selector):
                    chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        chunk(b"")
    except OSError:  # the client went (BrokenPipe, ConnectionReset; over TLS SSLEOFError)
        pass
