"""`mgpu-cloud exec`: one command on every node in parallel, a result for every node."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from provision.inventory import Inventory, InventoryStore, NodeRecord
from provision.sshconn import connect


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


def exec_on_nodes(
    inv: Inventory,
    store: InventoryStore,
    command: str,
    *,
    nodes: list[NodeRecord] | None = None,
    timeout: float = 10.0,
) -> dict[str, ExecResult]:
    """Run `command` (a shell line) on `nodes` (default: all) in parallel; never stops early:
    a node that cannot be reached is a result (exit 255) too."""

    def one(node: NodeRecord) -> ExecResult:
        conn = connect(inv, node, timeout=timeout)
        try:
            res = conn.run(command, hide=True, warn=True, in_stream=False)
            return ExecResult(int(res.exited), str(res.stdout), str(res.stderr))
        except Exception as exc:  # noqa: BLE001 - a node that cannot be reached is a result too
            return ExecResult(255, "", f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    nodes = sorted(inv.nodes if nodes is None else nodes, key=lambda n: n.rank)
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))
