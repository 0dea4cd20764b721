"""SSH keys made by the tool: the cluster's login key, node host keys, pinned known_hosts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str
    public_openssh: str  # "ssh-ed25519 AAAA..."


def generate_ed25519(comment: str = "") -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return KeyPair(private, f"{public} {comment}".strip())


def write_private_key(path: Path, pair: KeyPair) -> None:
    """Write the private key 0600 (created with that mode: never readable by others) + .pub."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(pair.private_openssh)
    os.chmod(path, 0o600)
    path.with_suffix(".pub").write_text(pair.public_openssh + "\n")


def host_key_only(public_openssh: str) -> str:
    """'ssh-ed25519 AAAA... comment' -> 'ssh-ed25519 AAAA...'."""
    return " ".join(public_openssh.split()[:2])


def known_hosts_line(hosts: list[str], port: int, public_key: str) -> str:
    names = [h if port == 22 else f"[{h}]:{port}" for h in hosts]
    return f"{','.join(names)} {host_key_only(public_key)}"


def write_known_hosts(path: Path, lines: list[str]) -> None:
    """Atomically: a connection opened meanwhile (a spare made in the background) reads the
    old file or the new one, never a half-written one."""
    from remote.files import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, "".join(line + "\n" for line in lines), fsync=False)


def ensure_cluster_key(key_dir: Path) -> tuple[Path, str]:
    """The cluster's login key at KEY_DIR/id_ed25519 (made once, 0600); returns (path, public)."""
    path = key_dir / "id_ed25519"
    if not path.exists():
        write_private_key(path, generate_ed25519("mgpu-cloud"))
    return path, path.with_suffix(".pub").read_text().strip()


def ensure_controller_key(key_dir: Path) -> tuple[Path, str]:
    """The controller's own login key at KEY_DIR/controller_ed25519 (made once, 0600); returns
    (path, public). Only the user's machine holds it: it is never uploaded to a node nor to the
    controller (the hand-off uploads `id_*` files only), and the controller authorizes it
    alone, so a node holding the cluster key cannot log in to the controller."""
    path = key_dir / "controller_ed25519"
    if not path.exists():
        write_private_key(path, generate_ed25519("mgpu-cloud-controller"))
    return path, path.with_suffix(".pub").read_text().strip()


def ensure_records_key(key_dir: Path) -> bytes:
    """The cluster's records key at KEY_DIR/records.key (32 random bytes, made once, 0600):
    the MAC key of what the controller writes to the store and the user's machine adopts
    (cluster.json, job records). Held by the user's machine and the controller; never by a
    node."""
    path = key_dir / "records.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(32))
    return path.read_bytes()
