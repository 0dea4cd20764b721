"""Who supervises a job once it runs: the one thing `run` and `launch`'s three modes differ in.

    Supervision                    the interface provision/job/lifecycle.start calls:
      check(job, target, log)      before anything is created or touched: the flags that
                                   contradict this mode (supervision flags nothing would act
                                   on), the store; a note for what is ignored. Raises
                                   UserInputError (what is wrong, what works). (--keep with a
                                   mode that hands the cluster over: lifecycle.start refuses)
      follows_output               True: this process follows the job's output, so the fabric
                                   gate runs in the job's own processes (gate/step.py); False:
                                   the separate gate runs before the job starts
      start(ready) -> Started      start the job on the ready cluster (lock held, workdir in
                                   place, gate step done) and supervise it as the mode does
      hands_over                   who removes a cluster made for the job once it started
                                   (None: this process, when the job has ended)

    attached.Attached              this process follows, recovers and records the job, then
                                   copies rank 0's outputs back (`run`, `launch`)
    detached.SelfStopping          the nodes run it alone and stop themselves after it
                                   (`--detach` without a store)
    managed.handoff.Controller     the cluster's controller supervises it with its state in
                                   the store (`--detach` on a cluster with a store)

Which one a command gets is provision/job/managed/modes.py's choice (the only module that
knows all three: job/ outside managed/ never imports managed/).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from provision.model.logsink import Log

if TYPE_CHECKING:
    from provision.cluster.providers.contract import AnyProvider
    from provision.job.gate.step import GateFactory
    from provision.model.inventory import Inventory, InventoryStore
    from provision.model.spec import JobSpec
    from provision.nodes import NodeGroup


@dataclass(frozen=True)
class Target:
    """The cluster a job is about to get, as the checks see it before anything is made: a new
    one (its spec and planned provider; `inv` None) or an existing one (its inventory)."""

    name: str
    provider: AnyProvider
    provider_name: str
    store: str | None  # the cluster's store URL, if it has one
    new: bool  # made for this job (`run`), not an existing one (`launch`)
    inv: Inventory | None = None
    spares: int = 0  # warm spares a new cluster gets (issue 44)


@dataclass
class Ready:
    """A cluster ready for the job: its lock held, the workdir in place, the gate step done."""

    inv: Inventory
    provider: AnyProvider
    store: InventoryStore
    job: JobSpec
    group: NodeGroup  # connections to every node, open
    log: Log
    gate: GateFactory | None  # each attempt's in-job gate (only where follows_output)
    new: bool  # the cluster was made for this job (`run`); False: an existing one


@dataclass(frozen=True)
class Started:
    """What `run`/`launch` report: an attached job's exit code, a detached job's id, or that
    the plan was declined (nothing was made)."""

    code: int = 0
    job_id: str | None = None
    declined: bool = False


class Supervision(ABC):
    """One way of supervising a job (the module doc)."""

    follows_output: ClassVar[bool] = False
    hands_over: ClassVar[str | None] = None

    def check(self, job: JobSpec, target: Target, log: Log) -> None:  # noqa: B027 - a hook
        """Refuse what this mode cannot do with `job` on `target`, before anything is made."""

    @abstractmethod
    def start(self, ready: Ready) -> Started:
        """Start the job and supervise it as this mode does."""
