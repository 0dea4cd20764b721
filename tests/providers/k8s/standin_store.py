"""The stand-in API server's state: objects by resource, a resourceVersion counter, the event
stream watches read, and label selectors as the API parses them.

Resources are keyed like the API's paths: "pods", "services", "secrets", "namespaces",
"nodes", "events", "resourcequotas" (core v1) and "GROUP/VERSION/PLURAL" for the others
(jobsets; Kueue's workloads and localqueues under their storage version, v1beta2).
Controllers (kubelet, JobSet, Kueue stand-ins) subscribe and get every event on their own
queue, so none runs inside the store's lock.

Deletion as the generic registry does it (k8s.io/apiserver pkg/registry/generic/registry/
store.go, Delete and updateForGracefulDeletionAndFinalizers): an object with finalizers is
only marked (deletionTimestamp); it goes once its finalizers are removed and, for a pod, once
its deletion grace period is 0 (the kubelet's final DELETE; `shouldDeleteDuringUpdate` in
pkg/registry/core/pod/strategy.go).
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import queue
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

KINDS = {"pods": ("v1", "Pod"), "services": ("v1", "Service"), "secrets": ("v1", "Secret"),
         "namespaces": ("v1", "Namespace"), "nodes": ("v1", "Node"), "events": ("v1", "Event"),
         "resourcequotas": ("v1", "ResourceQuota"),
         "serviceaccounts": ("v1", "ServiceAccount"),
         "kueue.x-k8s.io/v1beta2/workloadpriorityclasses": ("kueue.x-k8s.io/v1beta2",
                                                            "WorkloadPriorityClass"),
         "rbac.authorization.k8s.io/v1/roles": ("rbac.authorization.k8s.io/v1", "Role"),
         "rbac.authorization.k8s.io/v1/rolebindings": ("rbac.authorization.k8s.io/v1",
                                                       "RoleBinding"),
         "jobset.x-k8s.io/v1alpha2/jobsets": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
         "resource.k8s.io/v1/resourceclaimtemplates": ("resource.k8s.io/v1",
                                                       "ResourceClaimTemplate"),
         "kueue.x-k8s.io/v1beta2/workloads": ("kueue.x-k8s.io/v1beta2", "Workload"),
         "kueue.x-k8s.io/v1beta2/localqueues": ("kueue.x-k8s.io/v1beta2", "LocalQueue")}
CLUSTER_SCOPED = {"namespaces", "nodes", "kueue.x-k8s.io/v1beta2/workloadpriorityclasses"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def now(after_s: float = 0) -> str:
    """RFC 3339 in seconds, as the API writes times; `after_s` from now."""
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=after_s)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


_TERM = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def parse_selector(text: str) -> list[Callable[[dict[str, str]], bool]]:
    """`a=b,c!=d,e,!f,g in (x,y)`: one predicate per term."""
    terms, depth, cur = [], 0, ""
    for ch in text or "":
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    preds: list[Callable[[dict[str, str]], bool]] = []
    for term in (t for t in terms if t.strip()):
        m = _TERM.match(term)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
        neg, key, op, val, setop, vals = m.groups()
        if op in ("=", "=="):
            preds.append(lambda ls, k=key, v=val: ls.get(k) == v)
        elif op == "!=":
            preds.append(lambda ls, k=key, v=val: ls.get(k) != v)
        elif setop:
            options = {v.strip() for v in vals.split(",")}
            inside = setop == "in"
            preds.append(lambda ls, k=key, o=options, i=inside: (ls.get(k) in o) == i)
        else:
            preds.append(lambda ls, k=key, n=bool(neg): (k in ls) != n)
    return preds


def matches(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(p(labels) for p in parse_selector(selector))


def finalized(obj: dict[str, Any]) -> bool:
    """Marked for deletion, no finalizer left, and no grace period running (a pod's kubelet
    ends it with a DELETE of grace 0; other kinds have no grace period)."""
    meta = obj["metadata"]
    return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers") and \
        meta.get("deletionGracePeriodSeconds", 0) == 0


class Store:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []
        self.rv = 0
        self.subscribers: list[queue.Queue[tuple[str, str, dict[str, Any]]]] = []

    def subscribe(self) -> queue.Queue[tuple[str, str, dict[str, Any]]]:
        q: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
        with self.lock:
            self.subscribers.append(q)
        return q

    def _emit(self, kind: str, res: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        snap = copy.deepcopy(obj)
        self.events.append((self.rv, kind, res, snap))
        for q in self.subscribers:
            q.put((kind, res, snap))
        self.lock.notify_all()

    def create(self, res: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        api_version, kind = KINDS[res]
        obj["apiVersion"], obj["kind"] = api_version, kind
        if res not in CLUSTER_SCOPED:
            meta["namespace"] = ns
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        if res == "secrets" and "stringData" in obj:  # as the API stores it
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(v.encode()).decode()
        with self.lock:
            key = (res, ns, meta["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{res} "{meta["name"]}" already exists')
            self.objects[key] = obj
            self._emit("ADDED", res, obj)
            return copy.deepcopy(obj)

    def get(self, res: str, ns: str, name: str) -> dict[str, Any]:
        with self.lock:
            found = self.objects.get((res, ns, name))
            if found is None:
                raise ApiError(404, "NotFound", f'{res} "{name}" not found')
            return copy.deepcopy(found)

    def list(self, res: str, ns: str | None, selector: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for (r, n, _), o in sorted(self.objects.items())
                    if r == res and (ns is None or n == ns) and matches(o, selector)]

    def update(self, res: str, ns: str, name: str,
               change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.get((res, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{res} "{name}" not found')
            change(obj)
            if finalized(obj):
                del self.objects[(res, ns, name)]
                self._emit("DELETED", res, obj)
            else:
                self._emit("MODIFIED", res, obj)
            return copy.deepcopy(obj)

    def remove(self, res: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.pop((res, ns, name), None)
            if obj is not None:
                self._emit("DELETED", res, obj)
            return obj

    def owned_by(self, uid: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [key for key, o in self.objects.items()
                    if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))]

    def wait_events(self, after: int, timeout: float) -> list[tuple[int, str, str, dict[str, Any]]]:
        with self.lock:
            if self.rv <= after:
                self.lock.wait(timeout)
            return [e for e in self.events if e[0] > after]
