"""What a docker provider container (node or controller) is given beyond its image.

    login files   its private host key and the public key it authorizes, copied into the
                  created, not yet started container (one `put_archive`: a tar of two 0600
                  files) before node-entrypoint.sh starts sshd. Not in the container's
                  environment: `docker inspect` shows that to anyone who can reach the
                  engine's API, and a node's environment to the processes it starts.
    boot          --simulate-boot (issue 44): the image's own start delayed, as a VM's boot
    store binds   a file:// store's folder, mounted at the same path: the controller gets the
                  whole folder (it writes the records and cluster.json); a node only
                  PREFIX/CLUSTER/data, the part nodes write (remote/storekeys.py: a node runs
                  the user's code, and must not be able to write what the user's machine
                  adopts).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from provision.model.inventory import Inventory
from remote.storekeys import data_prefix

if TYPE_CHECKING:
    from provision.model.keys import KeyPair

HOST_KEY_FILE = "etc/ssh/ssh_host_ed25519_key"  # relative to "/", where the tar is unpacked
AUTHORIZED_KEYS_FILE = "root/.ssh/authorized_keys"


def login_files(host: KeyPair, authorized_key: str) -> bytes:
    """The tar `copy_login_files` unpacks at "/": the host key and authorized_keys, root's,
    0600 (the image has /etc/ssh and /root/.ssh, 0700)."""
    import io
    import tarfile  # here: imported while the engine creates the containers, not before

    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, text in ((HOST_KEY_FILE, host.private_openssh.strip() + "\n"),
                           (AUTHORIZED_KEYS_FILE, authorized_key.strip() + "\n")):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o600, now
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def copy_login_files(api: Any, container: str, host: KeyPair, authorized_key: str) -> None:
    """Into `container`, created and not started (the engine unpacks into its filesystem;
    the entrypoint refuses to start sshd without a host key). SDK errors propagate."""
    api.put_archive(container, "/", login_files(host, authorized_key))


def store_folder(inv: Inventory) -> str | None:
    """The host folder of the cluster's file:// store; None for another store or none."""
    store = inv.spec.store if inv.spec is not None else None
    if not store or not store.startswith("file://"):
        return None
    return "/" + store[len("file://"):].strip("/")


def node_store_folder(inv: Inventory) -> str | None:
    """PREFIX/CLUSTER/data of a file:// store: what a node mounts (made here when missing,
    so the engine does not make it as root:root 0755 of its own accord)."""
    folder = store_folder(inv)
    if folder is None:
        return None
    path = os.path.join(folder, data_prefix(inv.name))
    os.makedirs(path, exist_ok=True)
    return path


def node_binds(inv: Inventory) -> dict[str, dict[str, str]]:
    """A node's bind of a file:// store: only its data/ folder, at the same path."""
    path = node_store_folder(inv)
    return {path: {"bind": path, "mode": "rw"}} if path else {}


def controller_binds(inv: Inventory) -> dict[str, dict[str, str]]:
    """The controller's bind of a file:// store: the whole folder, at the same path (the
    shared filesystem of a cloud cluster, rehearsed; issue 18)."""
    path = store_folder(inv)
    return {path: {"bind": path, "mode": "rw"}} if path else {}


def boot_entrypoint(api: Any, image: str, seconds: float) -> list[str] | None:
    """--simulate-boot (issue 44): the image's own entrypoint and command, started only after
    `seconds`: until then nothing answers on the node's SSH port, as on a cloud VM that boots
    (a new node and a replacement alike; a spare booted with the cluster). None: the image's
    own, at once. Setting the entrypoint clears the image's command (Docker's reference,
    "ENTRYPOINT (default command to execute at runtime)"), so both are given."""
    if not seconds:
        return None
    config = api.inspect_image(image)["Config"]
    return ["/bin/sh", "-c", 'sleep "$0" && exec "$@"', f"{seconds:g}",
            *(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]

