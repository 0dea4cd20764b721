"""Copy what rank 0 wrote under the job's output folder back to this machine."""

from __future__ import annotations

import shlex
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from provision.errors import MgpuError
from provision.inventory import Inventory
from provision.nodes import NodeGroup

Log = Callable[[str], None]


def fetch_outputs(inv: Inventory, dest: Path, *, log: Log = print,
                  group: NodeGroup | None = None) -> Path:
    """Copy node 0's outputs folder into `dest` (merged over what is there). Returns dest.

    Failure here is reported but never stops teardown: the caller decides.
    """
    node = inv.master
    own = group is None
    group = group or NodeGroup(inv, [node])
    layout = group.layout
    q = shlex.quote
    archive = layout.path("outputs.tgz")
    conn = group.connection(node)
    try:
        res = conn.run(f"mkdir -p {q(layout.outputs)} && "
                       f"tar -czf {q(archive)} -C {q(layout.outputs)} .")
        if not res.ok:
            raise MgpuError(f"packing outputs on {node.name} failed: {res.tail()}")
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "outputs.tgz"
            conn.get(archive, local)
            with tarfile.open(local) as tar:
                tar.extractall(dest, filter="data")  # "data": no absolute paths, no escapes
                count = sum(1 for m in tar.getmembers() if m.isfile())
        conn.run(f"rm -f {q(archive)}")
    finally:
        if own:
            group.close()
    log(f"copied {count} output file(s) from {node.name} to {dest}/")
    return dest
