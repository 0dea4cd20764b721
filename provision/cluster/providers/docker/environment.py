"""What a docker provider container (node or controller) is started with, beyond the image."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provision.model.inventory import Inventory

if TYPE_CHECKING:
    from provision.model.keys import KeyPair


def node_environment(host: KeyPair, authorized_key: str) -> dict[str, str]:
    """What node-entrypoint.sh writes before sshd starts: the node's host key (made by the
    tool, so it is pinned before the first connection) and the cluster's public key."""
    return {"MGPU_HOST_KEY": host.private_openssh.strip(), "MGPU_AUTHORIZED_KEY": authorized_key}


def store_binds(inv: Inventory) -> dict[str, dict[str, str]]:
    """A file:// store's folder, mounted at the same path in every node and the controller
    (the shared filesystem of a cloud cluster, rehearsed; issue 18)."""
    store = inv.spec.store if inv.spec is not None else None
    if not store or not store.startswith("file://"):
        return {}
    path = store[len("file://"):]
    return {path: {"bind": path, "mode": "rw"}}
