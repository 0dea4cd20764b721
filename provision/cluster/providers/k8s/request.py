"""K8sRequest: what `create` makes, resolved by `plan` once (the typed request of K8sPlan)."""

from __future__ import annotations

from typing import Literal

from provision.model.base import StrictModel


class K8sRequest(StrictModel):
    """What `create` makes, resolved by `plan` once."""

    cluster: str
    namespace: str
    context: str | None
    mode: Literal["jobset", "pods"]
    nodes: int
    gpus: int  # nvidia.com/gpu per pod (0: none asked)
    slots: int
    image: str | None  # None: unresolved (a dry run shows the plan; up refuses it)
    cpu: str  # requests (and limits when `guaranteed`)
    memory: str
    guaranteed: bool = False  # limits = requests: QoS Guaranteed (a node type or both given)
    queue: str | None = None
    priority: str | None = None  # Kueue WorkloadPriorityClass (the JobSet's label)
    deadline_s: int | None = None  # activeDeadlineSeconds (from max_hours)
    end_unix: int | None = None  # the cluster's absolute end (created + max_hours): set by up
    fabric: Literal["none", "efa", "tcpx", "tcpxo", "rdma"] = "none"
    efa_devices: int = 4
    efa_dra: bool = False
    node_type: str | None = None
    topology: str | None = None
    placement: list[str] = []


__all__ = ["K8sRequest"]
