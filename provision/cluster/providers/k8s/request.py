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
    image: str
    queue: str | None = None
    priority: str | None = None  # Kueue WorkloadPriorityClass (the JobSet's label)
    deadline_s: int | None = None  # activeDeadlineSeconds (from max_hours)
    fabric: Literal["none", "efa", "tcpx", "tcpxo"] = "none"
    efa_devices: int = 4
    topology: str | None = None
    placement: str | None = None


__all__ = ["K8sRequest"]
