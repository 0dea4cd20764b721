"""Options of the k8s provider (the `k8s:` section of a cluster YAML)."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator

from provision.model.base import StrictModel

IMAGE_ENV = "MGPU_CLOUD_K8S_IMAGE"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# a label key ([prefix/]name) and value, as the API validates them (apimachinery
# pkg/util/validation IsQualifiedName / IsValidLabelValue)
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
# a resource.Quantity (apimachinery pkg/api/resource): what cpu/memory accept
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")
FABRICS = ("none", "efa", "tcpx", "tcpxo", "rdma")


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
    fabric: Literal["none", "efa", "tcpx", "tcpxo", "rdma"] = "none"
    efa_devices: int = Field(4, ge=1, le=32, description="EFA interfaces per pod (efa)")
    efa_dra: bool = Field(False, description="EFA through the DRA driver (DeviceClass "
                          "efa.networking.k8s.aws, EKS 1.34+) instead of the device plugin")
    topology: str | None = Field(None, description="Kueue TAS: podset-required-topology level")
    placement: list[str] = Field(default_factory=list, description="KEY=VALUE node labels "
                                 "every pod must have (a placement group, a GPU type, ...)")
    node_type: str | None = Field(None, description="machine type of the GPU nodes (p5.48xlarge, "
                                  "a3-megagpu-8g, ...): the pods' CPU/memory requests")
    cpu: str | None = Field(None, description="CPU per pod (a Kubernetes quantity); "
                            "default: from node_type, else one per slot")
    memory: str | None = Field(None, description="memory per pod (e.g. 1600Gi); default: "
                               "from node_type, else 2Gi per slot")
    cpu_slots: int = Field(2, ge=1, description="processes per pod when no GPUs are asked")
    ready_timeout_s: float = Field(
        1800, gt=0, description="how long pods may take to run: GPU node autoscaling and "
        "multi-GB image pulls take minutes (the reason is said as it changes)")
    pull_attempts: int = Field(5, ge=1, description="failed pulls of the image (the "
                               "kubelet retries with back-off) before it is given up")
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

    @field_validator("placement", mode="before")
    @classmethod
    def _placement(cls, v: object) -> object:
        """KEY=VALUE pairs: a list, or one string (the CLI's), comma-separated."""
        pairs = [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v
        for pair in pairs if isinstance(pairs, list) else []:
            key, eq, value = str(pair).partition("=")
            if not eq or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise ValueError(f"placement {pair!r}: write it as KEY=VALUE, a node label "
                                 "(e.g. cloud.google.com/gke-accelerator=nvidia-h100-mega-80gb)")
        return pairs

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None and not _QUANTITY.match(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity (e.g. 96, 500m, 1600Gi)")
        return v
