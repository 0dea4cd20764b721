"""Job records on the controller: ids, states, and where copied logs are kept.

Every launch is a job with an id (1, 2, 3, ... per cluster name, like `sky queue`). Its record
lives next to the inventories, and outlives the cluster:

    $MGPU_CLOUD_HOME/jobs/CLUSTER/ID/job.json       JobRecord (atomic writes)
    $MGPU_CLOUD_HOME/jobs/CLUSTER/ID/node-R.log     node R's log, copied when the job has ended

A record's state is what the nodes last said (provision.job.jobs asks them). A supervised run
that restarts is several jobs, one per attempt: each restart's record names the attempt
before it (`parent`), so `history` gives one run's attempts in order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, checked_name, state_home
from remote.files import write_atomic

# "removed": the cluster was removed (`down`) while the job still ran.
FINAL = ("succeeded", "failed", "cancelled", "lost", "removed")


LOST_CODE = 255  # remote/jobs.py LOST


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# --- records ----------------------------------------------------------------------------------
class NodeJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = 0
    state: str = "running"  # running | exited | cancelled | lost | unreachable
    exit_code: int | None = None
    ended: float | None = Field(None, description="when its part ended, by the node's clock")

    def set(self, state: str, exit_code: int | None = None, ended: float | None = None) -> None:
        self.state, self.exit_code, self.ended = state, exit_code, ended


class JobRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    cluster: str
    cluster_created_at: str = Field(description="which cluster of that name ran it")
    command: str
    launcher: str
    nodes: dict[str, NodeJob] = Field(default_factory=dict, description="where it started")
    detached: bool = False
    self_stop: str | None = Field(None, description="what the nodes do after the job")
    started_at: str = Field(default_factory=now_iso)
    ended_at: str | None = None
    state: str = "running"  # running | succeeded | failed | cancelled | lost | removed | unknown
    logs_saved: bool = False
    attempt: int = Field(1, description="1, then 2 for the first restart of the same run, ...")
    parent: str | None = Field(None, description="the id of the attempt this one restarted")
    failure: str | None = Field(None, description="why the attempt ended, as the run said")
    streamed: list[str] = Field(default_factory=list,
                                description="nodes whose log copy is what the run saw streamed")
    ledger: dict[str, Any] | None = Field(
        None, description="where the run's node-seconds went (job/ledger.py): its last attempt")
    resident_restarts: list[str] = Field(
        default_factory=list, description="lost nodes replaced during this attempt while the "
        "other nodes' ranks kept their processes (job/resident.py), one line each")

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def exit_code(self) -> int | None:
        """The exit code of the node that failed first, else 0; None while running. First by
        the nodes' clocks (a node lost without an end time counts as first; rank breaks ties):
        the others were usually stopped because of it (143), as `launch` says."""
        if not self.final:
            return None
        codes = [n.exit_code for n in self.nodes.values()]
        if None in codes:
            return LOST_CODE
        failed = [(-math.inf if n.ended is None else n.ended, n.rank, n.exit_code)
                  for n in self.nodes.values() if n.exit_code]
        return min(failed)[2] if failed else 0

    def duration_s(self) -> float | None:
        start = dt.datetime.fromisoformat(self.started_at)
        end = dt.datetime.fromisoformat(self.ended_at) if self.ended_at else None
        if end is None and self.final:
            return None
        return ((end or dt.datetime.now(dt.UTC)) - start).total_seconds()


class JobStore:
    """Job records and copied logs on the controller. Safe for several processes: ids are
    taken with an exclusive mkdir, records are replaced atomically."""

    def __init__(self, home: Path | None = None) -> None:
        self.root = (home or state_home()) / "jobs"

    def cluster_dir(self, cluster: str) -> Path:
        return self.root / checked_name(cluster)

    def job_dir(self, cluster: str, job_id: str) -> Path:
        return self.cluster_dir(cluster) / job_id

    def log_path(self, rec: JobRecord, node: str) -> Path:
        return self.job_dir(rec.cluster, rec.id) / f"{node}.log"

    def ids(self, cluster: str) -> list[str]:
        d = self.cluster_dir(cluster)
        if not d.is_dir():
            return []
        return sorted((p.name for p in d.iterdir() if p.name.isdigit()), key=int)

    def new(self, rec_fields: dict[str, Any]) -> JobRecord:
        """A new record with the next id of its cluster (ids continue across clusters of the
        same name, so the logs of a removed cluster are never overwritten)."""
        cluster = rec_fields["cluster"]
        d = self.cluster_dir(cluster)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        n = int((self.ids(cluster) or ["0"])[-1]) + 1
        while True:
            try:
                (d / str(n)).mkdir(mode=0o700)
                break
            except FileExistsError:
                n += 1
        rec = JobRecord(id=str(n), **rec_fields)
        self.save(rec)
        return rec

    def save(self, rec: JobRecord) -> None:
        d = self.job_dir(rec.cluster, rec.id)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(d / "job.json", rec.model_dump_json(indent=2))

    def load(self, cluster: str, job_id: str) -> JobRecord:
        path = self.job_dir(cluster, job_id) / "job.json"
        try:
            return JobRecord.model_validate_json(path.read_text())
        except FileNotFoundError:
            known = ", ".join(self.ids(cluster)) or "none"
            raise UserInputError(
                f"cluster {cluster!r} has no job {job_id!r} (jobs: {known})",
                hint=f"`mgpu-cloud jobs {cluster}` lists them",
            ) from None

    def all(self, cluster: str) -> list[JobRecord]:
        out = []
        for job_id in self.ids(cluster):
            with contextlib.suppress(UserInputError, ValueError):
                out.append(self.load(cluster, job_id))
        return out

    def history(self, rec: JobRecord) -> list[JobRecord]:
        """Every attempt of the run `rec` belongs to, the first one first (just [rec] for a
        run that never restarted)."""
        chain = [rec]
        while chain[0].parent is not None:
            try:
                chain.insert(0, self.load(rec.cluster, chain[0].parent))
            except UserInputError:
                break
        later = {r.parent: r for r in self.all(rec.cluster) if r.parent is not None
                 and r.cluster_created_at == rec.cluster_created_at}
        while chain[-1].id in later:
            chain.append(later[chain[-1].id])
        return chain

    def latest(self, cluster: str) -> JobRecord:
        ids = self.ids(cluster)
        if not ids:
            raise UserInputError(f"no job has run on a cluster named {cluster!r}",
                                 hint=f"start one: mgpu-cloud launch {cluster} -- train.py")
        return self.load(cluster, ids[-1])


def is_current(rec: JobRecord, inv: Inventory | None) -> bool:
    """Whether `rec` ran on `inv` (and not on an earlier cluster of the same name)."""
    return inv is not None and inv.created_at == rec.cluster_created_at
