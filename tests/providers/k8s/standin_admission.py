"""Admission as the stand-in API server runs it on every create, after the schema check: what
a real API server (and Kueue's webhook) adds to, or refuses of, what the provider sends.

    pods     limits without requests default the requests; DefaultTolerationSeconds:
             not-ready / unreachable NoExecute for 300 s; Pod Security (the namespace's
             enforce label): 403 "violates PodSecurity ..."; ResourceQuota: 403 Forbidden,
             "failed quota: Q: must specify ..." or "exceeded quota: Q, requested: ...,
             used: ..., limited: ..."
    jobsets  Kueue's JobSet webhook: the LocalQueue `default` of the namespace when the JobSet
             names none; suspended when it names a queue (or manageJobsWithoutQueueName)

Each rule names its upstream source beside it.
"""

from __future__ import annotations

import re
from typing import Any

from standin_store import ApiError, Store

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
LOCALQUEUES = "kueue.x-k8s.io/v1beta2/localqueues"
# DefaultTolerationSeconds (plugin/pkg/admission/defaulttolerationseconds/admission.go):
# --default-not-ready-toleration-seconds and --default-unreachable-toleration-seconds, 300.
DEFAULT_TOLERATION_S = 300
NOT_READY, UNREACHABLE = "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"
# pkg/quota/v1/evaluator/core/pods.go: quota of these makes every container state them
# ("this was a mistake ... we did this before QoS was even defined")
MUST_SPECIFY = ("cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu",
                "limits.memory")


def default_requests(pod: dict[str, Any]) -> None:
    """A container's limits without requests get requests equal to them (pkg/apis/core/v1/
    defaults.go SetDefaults_Pod): what admission and the scheduler then count."""
    for c in pod["spec"].get("containers", []):
        limits = (c.get("resources") or {}).get("limits")
        if limits:
            requests = c["resources"].setdefault("requests", {})
            for k, v in limits.items():
                requests.setdefault(k, v)


def default_tolerations(pod: dict[str, Any]) -> None:
    """Every pod tolerates a NotReady/unreachable node for 300 s unless it says otherwise:
    the taint manager evicts it only then (pkg/controller/tainteviction)."""
    tolerations = pod["spec"].setdefault("tolerations", [])
    for key in (NOT_READY, UNREACHABLE):
        if not any(t.get("key") in (key, None) and t.get("effect") in ("NoExecute", None)
                   for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": DEFAULT_TOLERATION_S})


_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1024,
          "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}


def quantity(text: str | int | float) -> float:
    """A resource.Quantity as a number (apimachinery pkg/api/resource/quantity.go suffixes)."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    if not m or m.group(2) not in _UNITS:
        raise ApiError(422, "Invalid", f"quantities must match the regular expression: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def pod_usage(pod: dict[str, Any]) -> dict[str, float]:
    """What a pod counts against a quota (pkg/quota/v1/evaluator/core/pods.go PodUsageFunc):
    requests.X and limits.X summed over its containers; `cpu`/`memory` are requests."""
    use: dict[str, float] = {"pods": 1}
    for c in pod["spec"].get("containers", []):
        for kind in ("requests", "limits"):
            for name, value in (c.get("resources", {}).get(kind) or {}).items():
                key = f"{kind}.{name}"
                use[key] = use.get(key, 0) + quantity(value)
    for short in ("cpu", "memory"):
        if f"requests.{short}" in use:
            use[short] = use[f"requests.{short}"]
    return use


def _missing(pod: dict[str, Any], hard: dict[str, Any]) -> str:
    """'must specify ...' for the quota-tracked compute resources a container leaves out."""
    missing: dict[str, list[str]] = {}
    for c in pod["spec"].get("containers", []):
        res = c.get("resources", {})
        for name in MUST_SPECIFY:
            if name not in hard:
                continue
            kind, _, short = name.rpartition(".")
            if short not in (res.get(kind or "requests") or {}):
                missing.setdefault(name, []).append(c["name"])
    return "; ".join(f"{r} for: {','.join(sorted(cs))}" for r, cs in sorted(missing.items()))


def _pretty(values: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in sorted(values.items()))


def resource_quota(store: Store, ns: str, pod: dict[str, Any]) -> None:
    """ResourceQuota admission (plugin/pkg/admission/resourcequota/controller.go): 403 with
    the quota's name, before anything is stored. Usage is every pod of the namespace not yet
    terminal (the quota controller frees a Succeeded/Failed pod's share)."""
    name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
    for quota in store.list("resourcequotas", ns):
        hard = quota["spec"].get("hard", {})
        missing = _missing(pod, hard)
        if missing:
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: failed quota: '
                                             f"{quota['metadata']['name']}: must specify {missing}")
        want = pod_usage(pod)
        used: dict[str, float] = {}
        for other in store.list("pods", ns):
            if other.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for k, v in pod_usage(other).items():
                used[k] = used.get(k, 0) + v
        over = {k: quantity(v) for k, v in hard.items()
                if want.get(k, 0) and used.get(k, 0) + want[k] > quantity(v)}
        if over:
            raise ApiError(403, "Forbidden", (
                f'pods "{name}" is forbidden: exceeded quota: {quota["metadata"]["name"]}, '
                f"requested: {_pretty({k: want[k] for k in over})}, "
                f"used: {_pretty({k: used.get(k, 0) for k in over})}, limited: {_pretty(over)}"))


def kueue_jobset_webhook(store: Store, ns: str, jobset: dict[str, Any],
                         manage_without_queue_name: bool) -> None:
    """Kueue's JobSet defaulting webhook (kueue v0.19 pkg/controller/jobs/jobset/
    jobset_webhook.go Default): ApplyDefaultLocalQueue... labels a JobSet without a queue
    with `default` when the namespace has that LocalQueue (jobframework/defaults.go,
    LocalQueueDefaulting, on by default since 0.12); ApplyDefaultForSuspend suspends it when
    it has a queue name, or when manageJobsWithoutQueueName (jobframework/utils.go
    WorkloadShouldBeSuspended)."""
    labels = jobset["metadata"].setdefault("labels", {})
    if not labels.get(QUEUE_LABEL) and store.list(LOCALQUEUES, ns) and any(
            q["metadata"]["name"] == "default" for q in store.list(LOCALQUEUES, ns)):
        labels[QUEUE_LABEL] = "default"
    if labels.get(QUEUE_LABEL) or manage_without_queue_name:
        jobset["spec"]["suspend"] = True


# Pod Security admission (k8s.io/pod-security-admission policy/check_*.go), the checks a pod
# of this provider can meet; `pod-security.kubernetes.io/enforce` on the namespace
_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                  "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret"}
ENFORCE = "pod-security.kubernetes.io/enforce"


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def pod_security(spec: dict[str, Any], level: str) -> list[str]:
    """What a pod spec breaks of a Pod Security level (baseline, restricted), in the API's
    words; [] for privileged."""
    found: list[str] = []
    if level == "privileged":
        return found
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        found.append(f"host namespaces ({', '.join(hosts)})")
    for c in _containers(spec):
        if (c.get("securityContext") or {}).get("privileged"):
            found.append(f'privileged (container "{c["name"]}" must not set '
                         "securityContext.privileged=true)")
    paths = [v["name"] for v in spec.get("volumes", []) if "hostPath" in v]
    if paths:
        found.append("hostPath volumes (volumes " + ", ".join(f'"{p}"' for p in paths) + ")")
    for c in _containers(spec):
        extra = [a for a in ((c.get("securityContext") or {}).get("capabilities") or {}).get(
            "add", []) if a not in _BASELINE_CAPS]
        if extra:
            found.append(f'non-default capabilities (container "{c["name"]}" must not include '
                         + ", ".join(f'"{a}"' for a in extra)
                         + " in securityContext.capabilities.add)")
    if level == "restricted":
        found += _restricted(spec)
    return found


def _restricted(spec: dict[str, Any]) -> list[str]:
    found = []
    pod_sc = spec.get("securityContext") or {}
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f'allowPrivilegeEscalation != false (container "{c["name"]}" must '
                         "set securityContext.allowPrivilegeEscalation=false)")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            found.append(f'unrestricted capabilities (container "{c["name"]}" must set '
                         'securityContext.capabilities.drop=["ALL"])')
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            found.append(f'runAsNonRoot != true (pod or container "{c["name"]}" must set '
                         "securityContext.runAsNonRoot=true)")
        if not (sc.get("seccompProfile") or pod_sc.get("seccompProfile")):
            found.append(f'seccompProfile (pod or container "{c["name"]}" must set '
                         'securityContext.seccompProfile.type to "RuntimeDefault" or '
                         '"Localhost")')
    kinds = [(v["name"], k) for v in spec.get("volumes", []) for k in v
             if k != "name" and k not in _RESTRICTED_VOLUMES]
    found += [f'restricted volume types (volume "{n}" uses restricted volume type "{k}")'
              for n, k in kinds]
    return found


def level_of(spec: dict[str, Any]) -> str:
    """The strictest Pod Security level that admits the pod spec."""
    return next(lv for lv in ("restricted", "baseline", "privileged")
                if not pod_security(spec, lv))


def enforce_pod_security(store: Store, ns: str, pod: dict[str, Any]) -> None:
    """403 as the admission plugin words it, when the namespace enforces a level."""
    level = ((store.get("namespaces", "", ns)["metadata"].get("labels") or {})
             .get(ENFORCE, "privileged"))
    found = pod_security(pod["spec"], level)
    if found:
        name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
        raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity '
                                         f'"{level}:latest": ' + ", ".join(found))
