"""How the controller reaches the nodes of an allocation (ProviderInfo.connector).

    srun (default)  every node command is a job step: `srun --jobid J --overlap -N1 -n1
                    --nodelist NODE bash -c ...` on the login node, over shared SSH
                    connections to it (login.LoginSession). stdin (the bootstrap archive) is
                    forwarded by srun to the task; output streams back (a file copied off
                    a node is a `cat` through the same path). Processes live inside the
                    allocation: Slurm accounts for them and kills them when it ends.
    ssh             plain SSH to each node through the login node as a jump host, node host
                    keys pinned from what a job step read on the node (only where the site
                    allows SSH to allocated nodes; create checks it).

When a command fails and the allocation is no longer running, the failure is reported as the
lost allocation it is (AllocationLostError: cancelled, time limit, node failure), not as the
command's exit code.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from provision.cluster.providers.slurm.allocation import describe_end, state_of
from provision.cluster.providers.slurm.login import LoginSession, LoginTarget
from provision.cluster.providers.slurm.options import SlurmOptions
from provision.cluster.providers.slurm.slurmcmd import srun_line
from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, NodeRecord
from provision.nodes import CommandResult, Connector, NodeConnection, Writer, ssh_connector
from provision.nodes.unpack import CappedWriter

JOB_KIND = "slurm-job"
LOGIN_KIND = "slurm-login"
COMPLETING_POLLS = 10


class AllocationLostError(MgpuError):
    """The Slurm allocation the cluster lives in has ended."""


class Allocation:
    """The cluster's allocation as the inventory records it; thread-safe."""

    def __init__(self, job_id: str, target: LoginTarget, setup: str | None) -> None:
        self.job_id = job_id
        self.target = target
        self.setup = setup
        self.lost: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, inv: Inventory) -> Allocation:
        jobs, logins = inv.resources_of(JOB_KIND), inv.resources_of(LOGIN_KIND)
        if not jobs or not logins:
            raise MgpuError(f"cluster {inv.name!r} has no Slurm allocation recorded",
                            hint=f"remove it with `mgpu-cloud down {inv.name}`")
        opts = inv.spec.options_as(SlurmOptions) if inv.spec is not None else SlurmOptions()
        target = LoginTarget.model_validate_json(logins[0].extra["target"])
        return cls(jobs[0].id, target, opts.setup)

    def check(self, session: LoginSession) -> None:
        """Raise AllocationLostError when the allocation is no longer running."""
        if self.lost is None:
            state = state_of(session, self.job_id)
            for _ in range(COMPLETING_POLLS):  # ending: wait for the state it ends in
                if state is None or state.state != "COMPLETING":
                    break
                time.sleep(0.5)
                state = state_of(session, self.job_id)
            if state is not None and (state.running or state.waiting):
                return
            with self._lock:
                self.lost = describe_end(self.job_id, state.state if state else None,
                                         state.reason if state else None)
        raise AllocationLostError(self.lost, hint="`mgpu-cloud down` removes the cluster's "
                                  "record; `up` (or `run`) makes a new allocation")


class SrunConnection:
    """One node, reached with job steps through the login node (NodeConnection)."""

    def __init__(self, session: LoginSession, alloc: Allocation, node: NodeRecord) -> None:
        self._session = session
        self._alloc = alloc
        self._node = node
        self._closed = False
        session.acquire()

    def open(self) -> None:
        self._session.open()

    def _line(self, command: str) -> str:
        return srun_line(self._alloc.job_id, self._node.name, command, setup=self._alloc.setup)

    def run(self, command: str, *, stdin: bytes | None = None, out: Writer | None = None,
            timeout: float | None = None) -> CommandResult:
        if self._alloc.lost is not None:
            self._alloc.check(self._session)
        res = self._session.run(self._line(command), stdin=stdin, out=out, timeout=timeout)
        if res.exit_code != 0:
            self._alloc.check(self._session)
        return res

    def run_to_file(self, command: str, local: Path) -> CommandResult:
        with open(local, "wb") as fh:  # UnsafeArchive past unpack.MAX_DOWNLOAD bytes
            res = self._session.run(self._line(command), binary_out=CappedWriter(fh))
        if res.exit_code != 0:
            self._alloc.check(self._session)
        return res

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._session.release()


class SetupSshConnection:
    """SSH to the node (nodes.SshConnection), with the site's setup line before commands."""

    def __init__(self, inner: NodeConnection, setup: str | None) -> None:
        self._inner = inner
        self._setup = setup

    def open(self) -> None:
        self._inner.open()

    def run(self, command: str, *, stdin: bytes | None = None, out: Writer | None = None,
            timeout: float | None = None) -> CommandResult:
        return self._inner.run(self._after_setup(command), stdin=stdin, out=out,
                               timeout=timeout)

    def run_to_file(self, command: str, local: Path) -> CommandResult:
        return self._inner.run_to_file(self._after_setup(command), local)

    def _after_setup(self, command: str) -> str:
        """What the setup line prints goes to stderr: stdout is the command's (a file copied
        off the node, the JSON of `remote.pyz job status`)."""
        return f"{{ {self._setup}\n}} >&2 || exit 97\n{command}" if self._setup else command

    def close(self) -> None:
        self._inner.close()


def connector(inv: Inventory) -> Connector:
    """ProviderInfo.connector: the transport for this inventory's node access mode. The srun
    transport shares one LoginSession among the node connections it makes."""
    alloc = Allocation.of(inv)
    opts = inv.spec.options_as(SlurmOptions) if inv.spec is not None else SlurmOptions()
    if opts.node_access == "ssh":
        def make_ssh(inv: Inventory, node: NodeRecord) -> NodeConnection:
            return SetupSshConnection(ssh_connector(inv, node), alloc.setup)

        return make_ssh
    session = LoginSession(alloc.target)

    def make(inv: Inventory, node: NodeRecord) -> NodeConnection:
        return SrunConnection(session, alloc, node)

    return make
