"""A cluster's job records, whoever keeps them: ONE interface for `jobs`, `logs`, `cancel`,
`attach` and the dashboard, which never ask which kind they read.

    JobRecords                      the interface
      list(fresh=)                  every job, oldest first (JobSummary each); fresh: brought
                                    up to date first (False: as recorded, nothing touched)
      resolve(job_id)               the id meant (None: the latest); UserInputError if none
      get(job_id)                   one job's JobSummary
      logs(job_id, out, ...)        its output `[node-R] `-prefixed, from its start (follow:
                                    until it ends) -> Shown (its end, whether all was read)
      after_interrupt(job_id)       what a Ctrl-C while following leaves behind, in words
      cancel(job_id, grace=)        stop it (None: the latest), or ask its supervisor to ->
                                    (JobSummary, what happened in words)

    localrecords.LocalRecords       this machine's records (provision/model/jobstore.py), asked
                                    of the nodes over SSH (provision/job/jobs.py): attached
                                    jobs and those the nodes run alone (`--detach`)
    managed.storerecords.StoreRecords   a managed run's records in its store, from any machine

`provision/job/managed/storerecords.records_for(name)` says which a cluster has (the only
module that knows both).
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from provision.model.logsink import Log

if TYPE_CHECKING:
    from provision.model.inventory import Inventory
    from provision.model.jobstore import JobRecord


@dataclass(frozen=True)
class NodeState:
    name: str
    rank: int
    state: str
    exit_code: int | None


@dataclass
class JobSummary:
    """One job as every reader shows it, whatever kind of record it came from."""

    id: str
    state: str
    command: str
    started_at: str | None
    ended_at: str | None = None
    exit_code: int | None = None
    final: bool = False
    note: str = ""  # said beside the state: "detached", "torn down"
    restarts: int | None = None  # how often recovery started it again (None: not known)
    launcher: str | None = None
    nodes: list[NodeState] = field(default_factory=list)  # per node, rank order (if known)
    events: list[str] = field(default_factory=list)  # its state changes, in order (if kept)
    logs_here: bool = False  # its logs are copied to this machine
    current: bool = True  # it ran on the cluster of that name that exists now
    data: dict[str, Any] = field(default_factory=dict)  # the record itself (`jobs --json`)
    goodput: float | None = None  # its run's training share of node-seconds (job/ledger.py)

    def duration_s(self, now: dt.datetime | None = None) -> float | None:
        """From its start to its end (to now while it runs; None: not known)."""
        if not self.started_at:
            return None
        end = dt.datetime.fromisoformat(self.ended_at) if self.ended_at else None
        if end is None and self.final:
            return None
        start = dt.datetime.fromisoformat(self.started_at)
        return ((end or now or dt.datetime.now(dt.UTC)) - start).total_seconds()

    def exit_text(self) -> str:
        """Each node's exit code in rank order ("0,1"), or the job's; "-" for none yet."""
        codes = [n.exit_code for n in self.nodes] if self.nodes else [self.exit_code]
        if all(c is None for c in codes):
            return "-"
        return ",".join("-" if c is None else str(c) for c in codes)


class Shown(NamedTuple):
    """What `logs` showed: the job as it ended (None: not known) and whether every node's
    output could be read."""

    job: JobSummary | None
    complete: bool = True


class JobRecords(ABC):
    """A cluster's jobs (the module doc). `note`: where warnings go (unreadable state,
    cleanup done on the way)."""

    def __init__(self, cluster: str, note: Log | None = None) -> None:
        self.cluster = cluster
        self.note: Log = note or (lambda line: None)

    @property
    @abstractmethod
    def empty_text(self) -> str:
        """What `jobs` says when there is none."""

    @abstractmethod
    def list(self, *, fresh: bool = True) -> list[JobSummary]:
        """Every job of the cluster, oldest first; `fresh`: their states brought up to date
        and acted on first (False: as recorded, for a view that must touch nothing)."""

    @abstractmethod
    def resolve(self, job_id: str | None) -> str:
        """The id of job `job_id` (None: the latest); UserInputError naming the jobs."""

    @abstractmethod
    def get(self, job_id: str | None) -> JobSummary:
        """One job (None: the latest)."""

    @abstractmethod
    def logs(self, job_id: str, out: TextIO, *, follow: bool = False,
             node: int | None = None) -> Shown:
        """Print job `job_id`'s output from its start (`node`: only that rank's); with
        `follow`, until it has ended."""

    @abstractmethod
    def after_interrupt(self, job_id: str) -> str:
        """What a Ctrl-C while following job `job_id` leaves behind."""

    @abstractmethod
    def cancel(self, job_id: str | None, *, grace: float = 10.0) -> tuple[JobSummary, str]:
        """Stop job `job_id` (None: the latest; TERM, KILL after `grace`), or ask its
        supervisor to; returns the job as it is then and what happened, in words."""


def summary_of(rec: JobRecord, inv: Inventory | None = None) -> JobSummary:
    """A record of this machine's as every reader shows it (`inv`: the cluster of its name
    that exists now; None: none does)."""
    from provision.model.jobstore import is_current

    nodes = sorted(rec.nodes.items(), key=lambda kv: kv[1].rank)
    return JobSummary(
        id=rec.id, state=rec.state, command=rec.command, started_at=rec.started_at,
        ended_at=rec.ended_at, exit_code=rec.exit_code, final=rec.final,
        note="detached" if rec.detached else "", restarts=rec.attempt - 1,
        launcher=rec.launcher, logs_here=rec.logs_saved,
        current=is_current(rec, inv),
        nodes=[NodeState(name, nj.rank, nj.state, nj.exit_code) for name, nj in nodes],
        data={**rec.model_dump(mode="json"), "exit_code": rec.exit_code,
              "duration_s": rec.duration_s()},
        goodput=(rec.ledger or {}).get("goodput"))
