"""Where the tool's files live on a node: the only module that spells a remote path.

`RemoteLayout(root)` names every path of the tool's folder (remote.pyz, hostfile, work/,
outputs/, checkpoints/, jobs/ID/node.log, ...). `root` is home-relative on the node, a
HomePath for command lines that need $HOME, or CONTAINER_ROOT as a training container sees it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from provision.model.inventory import Inventory

CONTAINER_ROOT = "/mgpu"  # where the remote folder is mounted inside a training container
# home-relative file -> (content, mode); uploaded with the workdir
Files = dict[str, tuple[bytes, int]]


class HomePath(str):
    """A path relative to the node user's home. Shell-quoted as "$HOME"/'rel' (launch.word),
    so $HOME expands on the node and nothing else does."""


def join(root: str, *parts: str) -> str:
    """`root/parts...`, keeping the HomePath marker."""
    joined = "/".join([root, *parts])
    return HomePath(joined) if isinstance(root, HomePath) else joined


@dataclass(frozen=True)
class RemoteLayout:
    """Paths of the tool's folder on a node. `root` is home-relative on the node (e.g.
    ".mgpu-cloud", or ".mgpu-cloud/ssh/NAME" on the user's own machines), a HomePath for
    command lines that need $HOME, or CONTAINER_ROOT as a training container sees it."""

    root: str

    def path(self, *parts: str) -> str:
        return join(self.root, *parts)

    @property
    def pyz(self) -> str:
        return self.path("remote.pyz")

    @property
    def hostfile(self) -> str:
        return self.path("hostfile")

    @property
    def work(self) -> str:
        return self.path("work")

    @property
    def outputs(self) -> str:
        return self.path("outputs")

    @property
    def pidfile(self) -> str:
        return self.path("job.pid")

    @property
    def checkpoints(self) -> str:
        """$MGPU_CHECKPOINT_DIR: kept safe off the nodes, restored before a restart."""
        return self.path("checkpoints")

    @property
    def python_path(self) -> str:
        """Put first on the job's PYTHONPATH: the tool's sitecustomize.py lives here."""
        return self.path("py")

    @property
    def jobs(self) -> str:
        """Where every job's folder lives (remote/jobs.py)."""
        return self.path("jobs")

    def job_dir(self, job_id: str) -> str:
        return self.path("jobs", job_id)

    def job_log(self, job_id: str) -> str:
        """The job's merged stdout/stderr on this node (remote/jobs.py LOG)."""
        return self.path("jobs", job_id, "node.log")

    def remote_command(self, *args: str) -> str:
        """`python3 ROOT/remote.pyz ARGS...` as one shell line (every word quoted)."""
        return " ".join(shlex.quote(w) for w in ["python3", self.pyz, *args])


def layout_of(inv: Inventory) -> RemoteLayout:
    return RemoteLayout(inv.remote_root)
