"""The Kubernetes API as this provider uses it: the real `kubernetes` client, configured from
the user's kubeconfig ($KUBECONFIG, else ~/.kube/config) and context, or, in the cluster's
controller pod (which has no kubeconfig), from the pod's own service account (in_cluster), and
the ONE boundary
where its errors become MgpuErrors (by HTTP status and the Status object's `reason`, never by
message text).

    401          ProviderUnavailableError  the kubeconfig's credentials are refused
    403 Forbidden, by whom the API says it (admission's wording is fixed upstream):
         ResourceQuota "exceeded quota: Q, ..."  CapacityError   the namespace's quota is full
         ResourceQuota "failed quota: Q: must specify ..."  UserInputError
         Pod Security "violates PodSecurity ..."  UserInputError  the namespace's level
         otherwise (RBAC: 'cannot VERB resource') ProviderUnavailableError  the Role to ask for
    404 NotFound  ProvisionError            (callers that expect it catch ApiException first)
    409 AlreadyExists  ClusterExistsError
    422 Invalid   UserInputError            quoting the field the API refused
    0 / refused   ProviderUnavailableError  the API server is not reachable
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from provision.model.errors import (
    ClusterExistsError,
    MgpuError,
    ProviderUnavailableError,
    ProvisionError,
    UserInputError,
)

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
# the kinds made through CustomObjectsApi: inventory kind -> (group, version, plural)
CUSTOM = {"k8s-jobset": (JOBSET_GROUP, JOBSET_VERSION, JOBSETS),
          "k8s-resourceclaimtemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates")}
# Kueue: v1beta2 stored since 0.16 (v1beta1 deprecated since 0.15, its removal planned); a
# Kueue older than 0.15 serves v1beta1 only (kueue_version asks which)
KUEUE_GROUP, KUEUE_VERSIONS = "kueue.x-k8s.io", ("v1beta2", "v1beta1")
# admission's refusals, as upstream words them (plugin/pkg/admission/resourcequota/
# controller.go; k8s.io/pod-security-admission/admission/admission.go)
QUOTA_EXCEEDED, QUOTA_UNSPECIFIED, POD_SECURITY = (
    "exceeded quota:", "failed quota:", "violates PodSecurity")


@dataclass(frozen=True)
class Kube:
    """The API groups this provider calls, on one configured ApiClient."""

    api: Any  # kubernetes.client.ApiClient
    core: Any  # CoreV1Api
    custom: Any  # CustomObjectsApi
    namespace: str


@cache
def _api_client(kubeconfig: str, context: str | None) -> Any:
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    if in_cluster(kubeconfig):
        return _in_cluster_client()
    try:
        return config.new_client_from_config(config_file=kubeconfig or None, context=context,
                                             persist_config=False)
    except (ConfigException, OSError) as exc:
        where = kubeconfig or "~/.kube/config"
        raise ProviderUnavailableError(
            f"no usable kubeconfig context{f' {context!r}' if context else ''} in {where} "
            f"({exc})",
            hint="point KUBECONFIG at your cluster's kubeconfig (kubectl config view must show "
                 "it), or pass --context NAME") from None


def in_cluster(kubeconfig: str) -> bool:
    """No kubeconfig named or at ~/.kube/config, and the kubelet's service variables set: a
    process in a pod (the controller), as the client's own `config.load_config` and
    client-go's `BuildConfigFromFlags` decide (kubeconfig first, in-cluster otherwise)."""
    from pathlib import Path

    return (not kubeconfig and not (Path.home() / ".kube" / "config").exists()
            and bool(os.environ.get("KUBERNETES_SERVICE_HOST")))


def _in_cluster_client() -> Any:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT (set by the kubelet in every
    container, kubernetes pkg/kubelet/kubelet_pods.go getServiceEnvVarMap) and the token and
    CA the ServiceAccount admission plugin projects at
    /var/run/secrets/kubernetes.io/serviceaccount (kubernetes-client's incluster_config.py
    re-reads the token every minute: projected tokens are rotated by the kubelet)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except ConfigException as exc:
        raise ProviderUnavailableError(
            f"no kubeconfig here and no usable service account in this pod ({exc})",
            hint="the controller pod needs its service account token mounted "
                 "(automountServiceAccountToken: true)") from None
    return client.ApiClient(cfg)


def kube(namespace: str, context: str | None) -> Kube:
    """The client for `namespace` through the kubeconfig's `context` (None: its current)."""
    from kubernetes import client

    api = _api_client(os.environ.get("KUBECONFIG", ""), context)
    return Kube(api=api, core=client.CoreV1Api(api), custom=client.CustomObjectsApi(api),
                namespace=namespace)


def status_of(exc: Any) -> tuple[int, str, str]:
    """(HTTP status, Status reason, Status message) of an ApiException."""
    reason, message = str(getattr(exc, "reason", "") or ""), ""
    with contextlib.suppress(ValueError, TypeError):
        body = json.loads(getattr(exc, "body", None) or "{}")
        reason = body.get("reason") or reason
        message = body.get("message") or ""
    return int(getattr(exc, "status", 0) or 0), reason, message


def is_not_found(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException) and exc.status == 404


def translate(action: str, exc: Any, *, planning: bool = False) -> MgpuError:
    status, reason, message = status_of(exc)
    said = message or reason or str(exc)
    if status == 0:
        return ProviderUnavailableError(
            f"{action}: the Kubernetes API server is not reachable ({said})",
            hint="check KUBECONFIG / --context and that `kubectl get pods` answers")
    if status == 401:
        return ProviderUnavailableError(f"{action}: the API server refused the kubeconfig's "
                                        f"credentials ({said})",
                                        hint="log in again (your cloud's get-credentials)")
    if status == 403:
        return forbidden(action, said)
    if status == 409:
        return ClusterExistsError(f"{action}: {said}",
                                  hint="`mgpu-cloud gc --provider k8s` lists labelled leftovers")
    if status == 422 or (planning and status == 400):
        return UserInputError(f"{action}: the API server refused a manifest: {said}")
    return ProvisionError(f"{action} failed: HTTP {status} {reason}: {said}")


def forbidden(action: str, said: str) -> MgpuError:
    """A 403, named by who refused: the namespace's ResourceQuota or Pod Security level
    (admission), or the Role (RBAC)."""
    from provision.model.errors import CapacityError

    if QUOTA_EXCEEDED in said:
        return CapacityError(f"{action}: the namespace's ResourceQuota is full: {said}",
                             hint="wait for other pods of the namespace to end, ask for fewer "
                                  "nodes/GPUs, or ask its admin for more quota "
                                  "(kubectl describe resourcequota)")
    if QUOTA_UNSPECIFIED in said:
        return UserInputError(f"{action}: the namespace's ResourceQuota refuses the pods: "
                              f"{said}", hint="give k8s.node_type, or k8s.cpu and k8s.memory "
                                              "(requests and limits then)")
    if POD_SECURITY in said:
        return UserInputError(f"{action}: the namespace's Pod Security level refuses the "
                              f"pods: {said}",
                              hint="docs/kubernetes.md says the level each preset needs; run "
                                   "in a namespace labelled pod-security.kubernetes.io/"
                                   "enforce at that level")
    return ProviderUnavailableError(f"{action}: forbidden: {said}",
                                    hint="ask for the Role in docs/kubernetes.md in this "
                                         "namespace")


@contextlib.contextmanager
def map_errors(action: str, *, planning: bool = False) -> Iterator[None]:
    """The one boundary: kubernetes client and urllib3 errors inside become MgpuErrors."""
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException, ApiValueError

    try:
        yield
    except ApiException as exc:
        raise translate(action, exc, planning=planning) from exc
    except ApiValueError as exc:
        raise UserInputError(f"{action}: {exc}") from exc
    except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
        raise ProviderUnavailableError(
            f"{action}: the Kubernetes API server is not reachable ({exc})",
            hint="check KUBECONFIG / --context and that `kubectl get pods` answers") from exc


def served_versions(k: Kube) -> dict[str, list[str]]:
    """group -> the versions the server serves (discovery: GET /apis)."""
    from kubernetes import client

    groups = client.ApisApi(k.api).get_api_versions().groups or []
    return {g.name: [v.version for v in (g.versions or [])] for g in groups}


def served_groups(k: Kube) -> set[str]:
    """The API groups the server serves (discovery: GET /apis)."""
    return set(served_versions(k))


_KUEUE: dict[int, str] = {}


def kueue_version(k: Kube) -> str:
    """v1beta2 where Kueue serves it (0.15+), else v1beta1; asked once per API client."""
    if id(k.api) not in _KUEUE:
        served = served_versions(k).get(KUEUE_GROUP, [])
        _KUEUE[id(k.api)] = next((v for v in KUEUE_VERSIONS if v in served), KUEUE_VERSIONS[0])
    return _KUEUE[id(k.api)]


def jobsets(k: Kube) -> tuple[str, str, str, str]:
    """(group, version, namespace, plural) for CustomObjectsApi calls on JobSets."""
    return JOBSET_GROUP, JOBSET_VERSION, k.namespace, JOBSETS
