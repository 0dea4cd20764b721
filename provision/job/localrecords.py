"""This machine's job records as provision/job/jobrecords.JobRecords: the records of
provision/model/jobstore.py, brought up to date by asking the nodes over SSH
(provision/job/jobs.py), their logs read live from the nodes or from the copies kept here.

A run that restarted is one record per attempt: `logs` prints the earlier attempts' kept
copies first, each under a header, then the last one's as any job's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from provision.job import jobs
from provision.job.jobrecords import JobRecords, JobSummary, Shown, summary_of
from provision.model.errors import InventoryUnreadableError, MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.jobstore import JobRecord, JobStore, is_current
from provision.model.logsink import Log
from provision.nodes import NodeGroup


class LocalRecords(JobRecords):
    """The records of cluster `cluster` on this machine (also of one that was removed)."""

    def __init__(self, cluster: str, note: Log | None = None, home: Path | None = None) -> None:
        super().__init__(cluster, note)
        self.store = JobStore(home)
        self.inventories = InventoryStore(home)

    @property
    def empty_text(self) -> str:
        return f"no jobs on {self.cluster!r} yet"

    def inventory(self) -> Inventory | None:
        """The cluster of that name that exists now (None: none, or its file is unreadable,
        which is said: its jobs are shown as last recorded)."""
        try:
            if self.inventories.exists(self.cluster):
                return self.inventories.load(self.cluster)
        except InventoryUnreadableError as exc:  # the job records are kept apart: still shown
            self.note(f"warning: {exc.message}; cluster {exc.cluster!r} unchecked: its jobs "
                      "are shown as last recorded, not asked of its nodes")
            if exc.hint:
                self.note(f"  hint: {exc.hint}")
        return None

    def list(self, *, fresh: bool = True) -> list[JobSummary]:
        """Every job, oldest first; a ready cluster's nodes are asked how its jobs are, and
        a name nothing knows is an error naming the clusters. `fresh` False: as recorded,
        no node asked (an unknown name has none)."""
        recs = self.store.all(self.cluster)
        inv = self.inventory()
        if fresh and inv is None and not recs:  # neither a cluster nor one that ran jobs here
            self.inventories.load(self.cluster)  # raises "no cluster named ... (known: ...)"
        if fresh and inv is not None and inv.status == "ready":
            with NodeGroup(inv) as group:
                recs = jobs.refresh(inv, recs, group, store=self.store)
        return [summary_of(r, inv) for r in recs]

    def record(self, job_id: str | None) -> JobRecord:
        return (self.store.load(self.cluster, job_id) if job_id
                else self.store.latest(self.cluster))

    def resolve(self, job_id: str | None) -> str:
        return self.record(job_id).id

    def get(self, job_id: str | None) -> JobSummary:
        return summary_of(self.record(job_id), self.inventory())

    # --- logs ---------------------------------------------------------------------------------
    def logs(self, job_id: str, out: TextIO, *, follow: bool = False,
             node: int | None = None) -> Shown:
        rec = self._earlier_attempts(self.record(job_id), node, out)  # one run's history
        names = list(rec.nodes)
        if node is not None:
            names = [n for n, nj in rec.nodes.items() if nj.rank == node]
            if not names:
                raise UserInputError(f"job {rec.id} did not run on node {node}; it ran on "
                                     + ", ".join(rec.nodes))
        inv = self.inventory()
        if rec.logs_saved or inv is None or not is_current(rec, inv) or inv.status != "ready":
            missing = jobs.print_saved_logs(rec, out, names, store=self.store)
            if missing:
                raise MgpuError(f"the log of job {rec.id} on {', '.join(missing)} was not "
                                "copied before the cluster was removed")
            return Shown(summary_of(rec, inv))
        complete = True
        with NodeGroup(inv) as group:
            jobs.refresh(inv, [rec], group, store=self.store)
            if rec.logs_saved:
                jobs.print_saved_logs(rec, out, names, store=self.store)
            else:
                nodes = [n for n in group.nodes if n.name in names]
                followed = jobs.follow(rec, group, out, nodes, wait=follow)
                for r in followed.values():
                    if r.error is not None:
                        self.note(f"{r.node.name}: could not read the log: {r.error}")
                complete = follow or not followed.failed
                if follow:
                    jobs.refresh(inv, [rec], group, store=self.store)
        return Shown(summary_of(rec, inv), complete)

    def _earlier_attempts(self, rec: JobRecord, node: int | None, out: TextIO) -> JobRecord:
        """For a run that restarted: print the attempts before its last one (kept copies),
        each under a header, and return the last attempt (printed as any job is)."""
        chain = self.store.history(rec)
        for attempt in chain[:-1] if len(chain) > 1 else []:
            ended = f": {attempt.failure}" if attempt.failure else f": {attempt.state}"
            out.write(f"=== job {attempt.id}, attempt {attempt.attempt} of {len(chain)}"
                      f"{ended} ===\n")
            names = [n for n, nj in attempt.nodes.items() if node is None or nj.rank == node]
            for missing in jobs.print_saved_logs(attempt, out, names, store=self.store):
                self.note(f"job {attempt.id}: no copy of {missing}'s log was kept")
        if len(chain) > 1:
            last = chain[-1]
            out.write(f"=== job {last.id}, attempt {last.attempt} of {len(chain)} ===\n")
            out.flush()
        return chain[-1]

    def after_interrupt(self, job_id: str) -> str:
        """What a Ctrl-C on `logs` leaves behind, as the nodes tell it now (one short query; a
        second Ctrl-C stops that too)."""
        rec = self.record(job_id)
        inv = self.inventory()
        try:
            if inv is not None:
                with NodeGroup(inv) as group:
                    jobs.refresh(inv, [rec], group, store=self.store)
        except Exception as exc:  # noqa: BLE001 - the user asked to stop: say what is known
            return f"stopped following job {rec.id}; its state is unknown ({exc})"
        if rec.final:
            code = "" if rec.exit_code is None else f", exit code {rec.exit_code}"
            return f"stopped following job {rec.id}; it had already finished: {rec.state}{code}"
        return (f"stopped following job {rec.id}; it goes on "
                f"(cancel it: mgpu-cloud cancel {self.cluster} {rec.id})")

    # --- cancel -------------------------------------------------------------------------------
    def cancel(self, job_id: str | None, *, grace: float = 10.0) -> tuple[JobSummary, str]:
        """TERM to every rank's process group, KILL after `grace`; then the record is
        refreshed. MgpuError when the cluster is gone or the job ran on an earlier one."""
        inv = self.inventories.load(self.cluster)
        rec = self.record(job_id)
        if not is_current(rec, inv):
            raise MgpuError(f"job {rec.id} ran on an earlier cluster named {self.cluster!r}")
        with NodeGroup(inv) as group:
            jobs.refresh(inv, [rec], group, store=self.store)
            if rec.final:
                return summary_of(rec, inv), f"job {rec.id} has already ended: {rec.state}"
            jobs.cancel(rec, group, grace=grace)
            jobs.refresh(inv, [rec], group, store=self.store)
        return summary_of(rec, inv), f"job {rec.id}: {rec.state}"
