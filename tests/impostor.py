"""Make a node container present a host key that is not pinned (as an impostor answering on
its address would), and give it its own key back: for the tests of host-key pinning at the
transport (provision/sshconn.py PinnedHostKeys).

The node image's sshd reads its HostKey lines from CONF and is PID 1: SIGHUP makes it re-exec
with the new configuration (open sessions stay). An RSA key is what the impostor shows, so
the client meets a host whose pinned key (ed25519) is of another type: the case paramiko
hands to the missing-host-key policy.
"""

from __future__ import annotations

import socket
import subprocess
import time

import paramiko

CONF = "/etc/ssh/sshd_config.d/mgpu-cloud.conf"
OWN = "/etc/ssh/ssh_host_ed25519_key"
RSA = "/etc/ssh/ssh_host_rsa_key"


def _sh(container: str, command: str) -> None:
    subprocess.run(["docker", "exec", container, "sh", "-c", command], check=True,
                   capture_output=True, timeout=60)


def presented_key_type(port: int, address: str = "127.0.0.1") -> str | None:
    """The type of host key the sshd at address:port shows (key exchange only), or None
    while it does not answer."""
    try:
        sock = socket.create_connection((address, port), timeout=5)
    except OSError:
        return None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=5)
        return str(transport.get_remote_server_key().get_name())
    except (paramiko.SSHException, OSError, EOFError):
        return None
    finally:
        transport.close()


def _switch(container: str, port: int, key: str, shows: str) -> None:
    _sh(container, f"sed -i 's|^HostKey .*|HostKey {key}|' {CONF} && kill -HUP 1")
    deadline = time.monotonic() + 30
    while presented_key_type(port) != shows:
        assert time.monotonic() < deadline, f"{container} never showed its {shows} key"
        time.sleep(0.2)


def show_unpinned_key(container: str, port: int) -> None:
    """From now on the node at 127.0.0.1:`port` shows a new RSA host key."""
    _sh(container, f"test -s {RSA} || ssh-keygen -q -t rsa -b 2048 -N '' -f {RSA}")
    _switch(container, port, RSA, "ssh-rsa")


def show_own_key(container: str, port: int) -> None:
    """The node shows its own (pinned) ed25519 host key again."""
    _switch(container, port, OWN, "ssh-ed25519")
