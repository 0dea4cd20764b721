"""Options of the k8s provider (the `k8s:` section of a cluster YAML)."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator

from provision.model.base import StrictModel

IMAGE_ENV = "MGPU_CLOUD_K8S_IMAGE"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def default_image() -> str | None:
    return os.environ.get(IMAGE_ENV) or None


class K8sOptions(StrictModel):
    """Where and how the pods run. Credentials: the user's kubeconfig ($KUBECONFIG or
    ~/.kube/config) and its `context`; nothing else is read."""

    namespace: str = "default"
    context: str | None = None
    queue: str | None = Field(None, description="Kueue LocalQueue of the namespace")
    priority: str | None = Field(None, description="Kueue WorkloadPriorityClass of the "
                                 "workload (label kueue.x-k8s.io/priority-class)")
    image: str | None = Field(default_factory=default_image,
                              description="pod image with sshd and python3 >= 3.11")
    api: Literal["auto", "jobset", "pods"] = "auto"
    fabric: Literal["none", "efa", "tcpx", "tcpxo"] = "none"
    efa_devices: int = Field(4, ge=1, le=32, description="vpc.amazonaws.com/efa per pod (efa)")
    topology: str | None = Field(None, description="Kueue TAS: podset-required-topology level")
    placement: str | None = Field(None, description="KEY=VALUE node label all pods must "
                                  "share (a placement group, GKE compact placement)")
    cpu_slots: int = Field(2, ge=1, description="processes per pod when no GPUs are asked")
    ready_timeout_s: float = Field(600, gt=0, description="how long pods may take to run")
    queue_timeout_s: float = Field(3600, gt=0, description="how long Kueue may hold the pods")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if len(v) > 63 or not _DNS_LABEL.match(v):
            raise ValueError(f"namespace {v!r} is not a DNS label (a-z, 0-9, '-', at most 63)")
        return v

    @field_validator("priority")
    @classmethod
    def _priority(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 63 or not _DNS_LABEL.match(v)):
            raise ValueError(f"priority {v!r} is not a WorkloadPriorityClass name (a-z, 0-9, "
                             "'-', at most 63: a label value)")
        return v

    @field_validator("placement")
    @classmethod
    def _placement(cls, v: str | None) -> str | None:
        if v is not None and "=" not in v:
            raise ValueError(f"placement {v!r}: write it as KEY=VALUE (a node label)")
        return v
