"""Launchers: how a job's processes start on the nodes. One module per launcher.

    torchrun.py    torchrun on every node (static ranks, or c10d rendezvous)
    deepspeed.py   the DeepSpeed runner: pdsh from node 0, or no_ssh on every node
    accelerate.py  accelerate launch on every node

A launcher builds the argv on one node (`argv`), says which nodes it starts from
(`starting_nodes`), what files it needs beside the workdir (`files`), and how its environment
reaches every rank (`prepare`). provision/job/launch.py wraps that into the node's command line;
nothing outside this package branches on a launcher's name. A new launcher is one module
here plus one line in provision.model.registry.LAUNCHERS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar

from provision.model.errors import UserInputError
from provision.model.registry import LAUNCHERS, load_class
from provision.nodes.layout import Files

if TYPE_CHECKING:
    from provision.model.inventory import Inventory, NodeRecord
    from provision.model.spec import JobSpec
    from provision.nodes import RemoteLayout


@dataclass(frozen=True)
class LaunchContext:
    """What a launcher needs to build one node's command. `layout` is the tool's remote
    folder as the job sees it (home-relative on the host, or the mount in a container)."""

    inv: Inventory
    job: JobSpec
    layout: RemoteLayout
    in_container: bool
    entry: tuple[str, ...] = ()  # words run before the job's script (the in-job fabric gate)

    @property
    def master_address(self) -> str:
        return self.inv.master.private_address

    @property
    def nnodes(self) -> int:
        return len(self.inv.nodes)

    def script(self, program: list[str] | None) -> list[str]:
        """The program: `program` when given (e.g. remote.pyz allreduce), else the job's
        script and arguments, after `entry` (e.g. `remote.pyz injob ... --`)."""
        if program is not None:
            return program
        return [*self.entry, self.job.script_in_workdir, *self.job.args]

    def nproc(self, node: NodeRecord) -> str:
        """Processes on `node`: --nproc-per-node, else the node's slots."""
        if self.job.nproc_per_node is None:
            return str(node.slots)
        return str(self.job.nproc_per_node)


class Launcher(ABC):
    """The contract every launcher names in its class line (`class Torchrun(Launcher)`): the
    argv is its own; the rest has defaults (start on every node, no extra files, the env on
    the command line). provision.model.registry loads a LAUNCHERS entry only as a subclass."""

    name: ClassVar[str] = ""

    @abstractmethod
    def argv(self, ctx: LaunchContext, node: NodeRecord, program: list[str] | None) -> list[str]:
        """The launcher's command on `node`. `program` replaces the job's script and args."""

    def starting_nodes(self, ctx: LaunchContext) -> list[NodeRecord]:
        """Where the launcher is started (every node, or node 0 for a runner that fans out)."""
        return sorted(ctx.inv.nodes, key=lambda n: n.rank)

    def files(self, job: JobSpec, layout: RemoteLayout, gpus: bool) -> Files:
        """Extra files placed on every node with the workdir (`layout`: home-relative)."""
        return {}

    def prepare(self, ctx: LaunchContext, env: dict[str, str]) -> tuple[str, list[str]]:
        """(shell prefix run before the launcher, extra `docker run` arguments): how `env`
        reaches every rank when the launcher starts processes itself on other nodes."""
        return "", []

    def forks(self, job: JobSpec) -> bool:
        """Whether the launcher forks the job's workers from its own process (torch imported
        once per node, not once per rank) when each starts the script through `remote.pyz
        script --` (provision/job/launch.py's SCRIPT_ENTRY, remote/script.py)."""
        return False

    def resident(self, job: JobSpec) -> bool:
        """Whether a lost node's newcomer can join the other nodes' resident ranks (issue 44:
        remote/resident.py) with `rejoin_argv`; False: a lost node relaunches every rank."""
        return False

    def rejoin_argv(self, ctx: LaunchContext, node: NodeRecord, alone: bool) -> list[str]:
        """A newcomer's command on `node` (when `resident`): it joins the launchers still
        running, or starts `alone` when the one whose rendezvous it would join is gone."""
        raise NotImplementedError(f"{self.name} has no resident restarts")


@cache
def get_launcher(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise UserInputError(f"unknown launcher {name!r}; choose one of: {', '.join(LAUNCHERS)}")
    # TypeError: not a Launcher (an ABC may stand for type[T]: python/mypy#4717)
    return load_class(LAUNCHERS[name], Launcher)()  # type: ignore[type-abstract]
