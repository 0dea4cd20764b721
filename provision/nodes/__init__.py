"""The node layer: how the controller reaches and prepares nodes.

    layout.py     RemoteLayout: every path of the tool's folder on a node
    shell.py      quoting for command lines run on nodes
    transport.py  NodeConnection / Connector (SSH by default), opening with retries
    unpack.py     the one extractor of an archive a node sent (files and folders only)
    group.py      NodeGroup: parallel operations with one result per node
    pool.py       the one thread pool (fan_out), background calls, polling
    sshconn.py    SSH with pinned host keys (Fabric/paramiko); hostkeys.py, sshconfig.py
    bootstrap.py  per node: reachable -> GPU driver -> one upload + one command -> image pull
    container.py  container mode (the training image's `docker run` words)
    preflight.py, checks.py   what a node is like (remote.pyz preflight) and the rules it must meet

The names most callers need are re-exported here (`from provision.nodes import NodeGroup`).
"""

from provision.nodes.group import GroupResult, NodeGroup, NodeResult, borrowed
from provision.nodes.layout import CONTAINER_ROOT, Files, HomePath, RemoteLayout, join, layout_of
from provision.nodes.pool import background, fan_out, poll
from provision.nodes.transport import (
    CommandResult,
    Connector,
    FirstConnectionError,
    NodeConnection,
    NodeStepError,
    SshConnection,
    Writer,
    default_connector,
    describe_exception,
    fetch_tree,
    get_file,
    retry_open,
    ssh_connector,
)

__all__ = [
    "CONTAINER_ROOT", "CommandResult", "Connector", "Files", "FirstConnectionError",
    "GroupResult", "HomePath",
    "NodeConnection", "NodeGroup", "NodeResult", "NodeStepError", "RemoteLayout",
    "SshConnection", "Writer", "background", "borrowed", "default_connector",
    "describe_exception", "fan_out", "fetch_tree", "get_file", "join", "layout_of", "poll",
    "retry_open", "ssh_connector",
]
