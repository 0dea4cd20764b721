"""Copy what rank 0 wrote under the job's output folder back to this machine."""

from __future__ import annotations

import shlex
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from provision.bootstrap import remote_path
from provision.errors import MgpuError
from provision.inventory import Inventory, InventoryStore
from provision.sshconn import connect

Log = Callable[[str], None]


def fetch_outputs(inv: Inventory, store: InventoryStore, dest: Path, *, log: Log = print) -> Path:
    """Copy node 0's .mgpu-cloud/outputs/ into `dest` (merged over what is there). Returns dest.

    Failure here is reported but never stops teardown: the caller decides.
    """
    node = inv.master
    outputs = remote_path(inv, "outputs")
    archive = remote_path(inv, "outputs.tgz")
    conn = connect(inv, node)
    try:
        res = conn.run(
            f"mkdir -p {shlex.quote(outputs)} && tar -czf {shlex.quote(archive)} -C {shlex.quote(outputs)} .",
            hide=True, warn=True, in_stream=False,
        )
        if res.exited != 0:
            raise MgpuError(f"packing outputs on {node.name} failed: {res.stderr.strip()}")
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "outputs.tgz"
            conn.get(archive, str(local))
            with tarfile.open(local) as tar:
                tar.extractall(dest, filter="data")  # "data": no absolute paths, no escapes
                count = sum(1 for m in tar.getmembers() if m.isfile())
        conn.run(f"rm -f {shlex.quote(archive)}", hide=True, warn=True, in_stream=False)
    finally:
        conn.close()
    log(f"copied {count} output file(s) from {node.name} to {dest}/")
    return dest
