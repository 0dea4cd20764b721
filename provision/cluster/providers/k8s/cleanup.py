"""Deleting a cluster's objects: only what the API shows with the cluster's label, checked
at the source at deletion time. Every object, listed by label selector or recorded in the
inventory, goes through `delete_if_labelled`: read, its label checked, deleted with the read's
uid and resourceVersion as preconditions, so the API itself refuses (409 Conflict) to delete
an object that changed after the read (its label taken off between the listing and the
deletion, say); it is then read again. `down` waits until no labelled pod is left, so nothing
of the cluster runs once it returns.

    kinds   JobSet (with its Jobs, pods and Service: foreground), ResourceClaimTemplate
            (the EFA DRA preset's), Pod, Service, Secret; the controller's ServiceAccount,
            RoleBinding and Role (controller.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provision.cluster.providers.k8s import pods
from provision.cluster.providers.k8s.client import (
    CUSTOM,
    Kube,
    is_not_found,
    status_of,
)
from provision.cluster.providers.k8s.pods import selector
from provision.model.inventory import CLUSTER_TAG

GONE_TIMEOUT_S = 180.0
ATTEMPTS = 5  # reads of one object that keeps changing under a delete before giving up
KINDS = ("k8s-jobset", "k8s-resourceclaimtemplate", "k8s-pod", "k8s-service", "k8s-secret",
         "k8s-serviceaccount", "k8s-rolebinding", "k8s-role")
# built-in kind -> (the client's API class, the noun of its *_namespaced_NOUN calls)
CALLS = {"k8s-pod": ("CoreV1Api", "pod"), "k8s-service": ("CoreV1Api", "service"),
         "k8s-secret": ("CoreV1Api", "secret"),
         "k8s-serviceaccount": ("CoreV1Api", "service_account"),
         "k8s-role": ("RbacAuthorizationV1Api", "role"),
         "k8s-rolebinding": ("RbacAuthorizationV1Api", "role_binding")}


@dataclass
class Found:
    kind: str  # one of KINDS
    name: str
    uid: str
    cluster: str  # its label's value


@dataclass
class Outcome:
    deleted: list[Found] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # recorded, but not the cluster's
    failures: list[str] = field(default_factory=list)


def _meta(obj: Any) -> tuple[str, str, dict[str, str]]:
    if isinstance(obj, dict):
        m = obj.get("metadata") or {}
        return m.get("name", ""), m.get("uid", ""), m.get("labels") or {}
    return obj.metadata.name, obj.metadata.uid, obj.metadata.labels or {}


def core_call(k: Kube, verb: str, kind: str) -> Callable[..., Any]:
    """The client's `verb`_namespaced_NOUN call for a built-in kind (CALLS)."""
    from kubernetes import client

    api_class, noun = CALLS[kind]
    api = k.core if api_class == "CoreV1Api" else getattr(client, api_class)(k.api)
    call: Callable[..., Any] = getattr(api, f"{verb}_namespaced_{noun}")
    return call


def labelled(k: Kube, label_selector: str, groups: set[str] | None = None) -> list[Found]:
    """Every object of KINDS in the namespace matching the selector (JobSets only where the
    server serves them)."""
    out: list[Found] = []
    for kind in KINDS:
        if kind in CUSTOM:
            group, version, plural = CUSTOM[kind]
            if groups is not None and group not in groups:
                continue
            try:
                items = k.custom.list_namespaced_custom_object(
                    group, version, k.namespace, plural,
                    label_selector=label_selector).get("items", [])
            except Exception as exc:
                if is_not_found(exc):  # the API is not installed
                    continue
                raise
        else:
            items = core_call(k, "list", kind)(k.namespace, label_selector=label_selector).items
        for obj in items:
            name, uid, labels = _meta(obj)
            out.append(Found(kind, name, uid, labels.get(CLUSTER_TAG, "")))
    return out


def delete(k: Kube, found: Found, resource_version: str) -> None:
    """Delete one object if it is still the one read (its uid and resourceVersion as the
    delete's preconditions: the API answers 409 Conflict otherwise); NotFound is success."""
    from kubernetes import client

    same = client.V1Preconditions(uid=found.uid or None,
                                  resource_version=resource_version or None)
    try:
        if found.kind in CUSTOM:  # a body's options win over the query's (apiserver)
            group, version, plural = CUSTOM[found.kind]
            body = client.V1DeleteOptions(propagation_policy="Foreground", preconditions=same)
            k.custom.delete_namespaced_custom_object(group, version, k.namespace, plural,
                                                     found.name, body=body)
            return
        body = client.V1DeleteOptions(propagation_policy="Background", preconditions=same)
        core_call(k, "delete", found.kind)(found.name, k.namespace, body=body)
    except Exception as exc:
        if not is_not_found(exc):
            raise


def delete_if_labelled(k: Kube, kind: str, name: str, cluster: str) -> bool:
    """Delete one object only while the API labels it with `cluster`, checked at deletion
    time (the module doc). True when it is deleted or gone; False when it is not (or no
    longer) the cluster's, and left as it is."""
    for _ in range(ATTEMPTS):
        now = read(k, kind, name)
        if now is None:
            return True
        uid, labels, resource_version = now
        if not cluster or labels.get(CLUSTER_TAG) != cluster:
            return False
        try:
            delete(k, Found(kind, name, uid, cluster), resource_version)
            return True
        except Exception as exc:
            if status_of(exc)[0] != 409:  # Conflict: it changed since the read: read again
                raise
    raise RuntimeError(f"{kind} {name} changed under every one of {ATTEMPTS} deletes")


def read(k: Kube, kind: str, name: str) -> tuple[str, dict[str, str], str] | None:
    """(uid, labels, resourceVersion) of an object as the API has it now; None when gone."""
    try:
        if kind in CUSTOM:
            group, version, plural = CUSTOM[kind]
            obj = k.custom.get_namespaced_custom_object(group, version, k.namespace, plural,
                                                        name)
            resource_version = (obj.get("metadata") or {}).get("resourceVersion", "")
        else:
            obj = core_call(k, "read", kind)(name, k.namespace)
            resource_version = obj.metadata.resource_version or ""
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise
    _, uid, labels = _meta(obj)
    return uid, labels, resource_version


def delete_cluster(k: Kube, cluster: str, recorded: list[tuple[str, str]],
                   groups: set[str] | None) -> Outcome:
    """Everything labelled with `cluster`, plus what the inventory records (kind, name) if
    the API still labels it so; a recorded object without the label is refused by name and
    left alone. Then waits until no labelled pod is left (bounded)."""
    out = Outcome()
    targets = labelled(k, selector(cluster), groups)
    names = {(f.kind, f.name) for f in targets}
    targets += [Found(kind, name, "", cluster) for kind, name in recorded
                if (kind, name) not in names and kind in KINDS]
    for found in targets:  # JobSets first (KINDS order): their pods go with them
        try:
            if delete_if_labelled(k, found.kind, found.name, cluster):
                out.deleted.append(found)
            else:
                out.refused.append(f"{found.kind} {found.name} is not labelled "
                                   f"{CLUSTER_TAG}={cluster}: left as it is")
        except Exception as exc:  # noqa: BLE001 - every object is tried, failures reported
            status, reason, message = status_of(exc)
            said = f"HTTP {status} {reason} {message}" if status else str(exc)
            out.failures.append(f"{found.kind} {found.name}: {said}")
    wait_pods_gone(k, cluster, out)
    return out


def wait_pods_gone(k: Kube, cluster: str, out: Outcome,
                   timeout_s: float | None = None) -> None:
    timeout_s = GONE_TIMEOUT_S if timeout_s is None else timeout_s  # read now: tests set it
    deadline = time.monotonic() + timeout_s
    while True:
        left = k.core.list_namespaced_pod(k.namespace, label_selector=selector(cluster)).items
        if not left:
            return
        if time.monotonic() > deadline:
            out.failures.append("pods still terminating after "
                                f"{timeout_s:.0f} s: {', '.join(p.metadata.name for p in left)}")
            return
        time.sleep(pods.POLL_S / 4)  # the module's: tests set it
