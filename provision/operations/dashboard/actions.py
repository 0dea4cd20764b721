"""The only changes the dashboard makes: `cancel` a job and `down` a cluster, through the code
the CLI runs for them (provision/job/localrecords.py cancel; provision/job/managed/stopping.py
down: the jobs' logs kept, a managed job ended through its store, then the cluster destroyed). The pages ask for confirmation before calling
these; the web layer checks the request's token.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provision.job.localrecords import LocalRecords
from provision.model.errors import MgpuError
from provision.model.inventory import InventoryStore

CANCEL_GRACE_S = 10.0  # as `mgpu-cloud cancel`'s --grace default


def cancel_job(name: str, job_id: str, grace: float = CANCEL_GRACE_S,
               home: Path | None = None) -> dict[str, Any]:
    """`mgpu-cloud cancel NAME ID` (the same records and code: LocalRecords.cancel): TERM to
    every rank's process group, KILL after `grace`; then the record is refreshed. Returns
    {"ok", "state", "message"}; MgpuError when the cluster or job is unknown or the job ran
    on an earlier cluster of that name."""
    job, said = LocalRecords(name, home=home).cancel(job_id, grace=grace)
    return {"ok": job.state == "cancelled" or job.final, "state": job.state, "message": said}


class Removals:
    """`mgpu-cloud down NAME` on a thread of its own (a cloud takes minutes); its log lines
    and outcome are kept for the cluster page. One removal per cluster at a time."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self._lock = threading.Lock()
        self._state: dict[str, dict[str, Any]] = {}

    def start(self, name: str, before: Callable[[], None] | None = None) -> dict[str, Any]:
        """Begin removing `name` (idempotent while one runs); `before` runs first on the
        removal's thread (e.g. closing the dashboard's own connections to the nodes)."""
        InventoryStore(self.home).load(name)  # ClusterNotFoundError before any thread
        with self._lock:
            cur = self._state.get(name)
            if cur is not None and cur["state"] == "running":
                return dict(cur)
            entry: dict[str, Any] = {"state": "running", "lines": [], "error": None,
                                     "started_at": _now()}
            self._state[name] = entry
        threading.Thread(target=self._run, args=(name, entry, before), daemon=True,
                         name=f"dashboard-down-{name}").start()
        return dict(entry)

    def _run(self, name: str, entry: dict[str, Any], before: Callable[[], None] | None) -> None:
        from provision.job.managed import stopping

        def log(line: str) -> None:
            with self._lock:
                entry["lines"].append(line)

        try:
            if before is not None:
                before()
            stopping.down(name, store=InventoryStore(self.home), log=log)
            state, error = "done", None
        except MgpuError as exc:
            state, error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - shown on the page
            state, error = "failed", f"{type(exc).__name__}: {exc}"
        with self._lock:
            entry.update(state=state, error=error, ended_at=_now())

    def state(self, name: str) -> dict[str, Any] | None:
        """{"state": running | done | failed, "lines", "error", ...} of the last removal."""
        with self._lock:
            cur = self._state.get(name)
            return None if cur is None else {**cur, "lines": list(cur["lines"])}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
