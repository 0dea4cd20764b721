"""Copy what rank 0 wrote under the job's output folder back to this machine."""

from __future__ import annotations

from pathlib import Path

from provision.model.errors import MgpuError
from provision.model.inventory import Inventory
from provision.model.logsink import Log
from provision.nodes import NodeGroup, NodeStepError, borrowed, fetch_tree


def fetch_outputs(inv: Inventory, dest: Path, *, log: Log = print,
                  group: NodeGroup | None = None) -> Path:
    """Copy node 0's outputs folder into `dest` (merged over what is there). Returns dest.

    Failure here is reported but never stops teardown: the caller decides.
    """
    node = inv.master
    with borrowed(inv, group, [node]) as nodes:
        layout = nodes.layout
        try:
            count = fetch_tree(nodes.connection(node), layout.outputs, dest, node=node.name)
        except NodeStepError as exc:
            raise MgpuError(f"copying the outputs of {node.name} failed: {exc}") from exc
    log(f"copied {count} output file(s) from {node.name} to {dest}/")
    return dest
