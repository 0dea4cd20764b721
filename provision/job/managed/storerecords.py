"""A managed run's records in its store as provision/job/jobrecords.JobRecords, from any
machine with the store's URL and credentials (client.py reads them: records with a MAC that
does not verify are left out), and the choice between them and this machine's.

    records_for(name, store_url)   StoreRecords when the cluster has a store (`--store`, its
                                   inventory's, or the one `attach` saved), else LocalRecords
    store_records(name)            its store's only (None: no store)
"""

from __future__ import annotations

from typing import Any, TextIO

from provision.job.jobrecords import JobRecords, JobSummary, Shown
from provision.job.localrecords import LocalRecords
from provision.job.managed import client
from provision.model.logsink import Log
from remote.store import open_store


def records_for(name: str, store_url: str | None = None,
                note: Log | None = None) -> JobRecords:
    """The records of cluster `name`: its store's when it has one, else this machine's."""
    return store_records(name, store_url, note) or LocalRecords(name, note)


def store_records(name: str, store_url: str | None = None,
                  note: Log | None = None) -> StoreRecords | None:
    """The records of cluster `name` in its store (None: it has none)."""
    url = client.store_url_for(name, store_url)
    return StoreRecords(url, name, note) if url else None


def summary_of(job: dict[str, Any]) -> JobSummary:
    """A store job (client.summary's dict) as every reader shows it."""
    return JobSummary(
        id=job["id"], state=job["state"], command=job["command"],
        started_at=job["started_at"], ended_at=job["ended_at"], exit_code=job["exit_code"],
        final=job["ended_at"] is not None, note="torn down" if job["torn_down"] else "",
        restarts=job["restarts"], events=list(job["events"]), data=job,
        goodput=job.get("goodput"))


class StoreRecords(JobRecords):
    """The jobs of cluster `cluster` in the store at `url`."""

    def __init__(self, url: str, cluster: str, note: Log | None = None) -> None:
        super().__init__(cluster, note)
        self.url = url

    @property
    def empty_text(self) -> str:
        return f"no managed jobs of {self.cluster!r} in {self.url}"

    def list(self, *, fresh: bool = True) -> list[JobSummary]:
        """Every job; `fresh`: a cluster its controller removed is finished here (`down` of
        what only this machine's credentials can remove) and its inventory dropped."""
        if fresh:
            self.take_back()
        jobs = client.all_jobs(self.url, self.cluster)
        if fresh and client.forget_if_torn_down(self.cluster, jobs):
            self.note(f"cluster {self.cluster!r} was removed by its controller; its inventory "
                      "here is dropped")
        return [summary_of(j) for j in jobs]

    def resolve(self, job_id: str | None) -> str:
        return client.latest_id(self.url, self.cluster, job_id)

    def get(self, job_id: str | None) -> JobSummary:
        return summary_of(client.summary(open_store(self.url), self.cluster,
                                         self.resolve(job_id)))

    def take_back(self) -> None:
        """A job whose controller is lost is taken back by a new one first (issue 36,
        takeback.py: only where this machine holds the cluster's inventory)."""
        from provision.job.managed.takeback import take_back_if_lost
        from provision.model.errors import MgpuError

        try:
            take_back_if_lost(self.cluster, self.note)
        except MgpuError as exc:
            self.note(f"could not take the job of {self.cluster!r} back: {exc.message}"
                      + (f" ({exc.hint})" if exc.hint else ""))

    def logs(self, job_id: str, out: TextIO, *, follow: bool = False,
             node: int | None = None) -> Shown:
        self.take_back()
        final = client.print_logs(self.url, self.cluster, job_id, out, follow=follow,
                                  node=node)
        if final is None:
            return Shown(None)
        return Shown(JobSummary(id=job_id, state=final.state, command="", started_at=None,
                                ended_at=final.at, exit_code=final.exit_code, final=True,
                                restarts=final.restarts))

    def after_interrupt(self, job_id: str) -> str:
        return (f"stopped following; job {job_id} goes on (cancel it: mgpu-cloud cancel "
                f"{self.cluster} {job_id})")

    def cancel(self, job_id: str | None, *, grace: float = 10.0) -> tuple[JobSummary, str]:
        """A cancel written to the store: the job's controller stops it within seconds
        (`grace` is the controller's own)."""
        job_id = self.resolve(job_id)
        client.cancel(self.url, self.cluster, job_id)
        return self.get(job_id), (
            f"job {job_id}: cancel requested; its controller stops it within seconds "
            f"(mgpu-cloud logs {self.cluster} {job_id} --follow)")
