"""What the dashboard holds while people look: one ClusterWatch per cluster page and one
JobWatch per job page, made on first use, closed after IDLE_S without a request (their SSH
channels with them), and replaced when the state under them changed (a cluster removed or
made again under its name, a job's logs copied here after its cluster went away)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from provision.model.inventory import Inventory
from provision.model.jobstore import JobRecord
from provision.operations.dashboard.joblogs import JobWatch
from provision.operations.dashboard.sampling import ClusterWatch

IDLE_S = 120.0


class Live:
    """Thread-safe registry of the live watches."""

    def __init__(self, home: Path | None = None, interval: float = 2.0,
                 idle_s: float = IDLE_S) -> None:
        self.home, self.interval, self.idle_s = home, interval, idle_s
        self._lock = threading.Lock()
        self._clusters: dict[str, ClusterWatch] = {}
        self._jobs: dict[tuple[str, str], JobWatch] = {}
        self._stop = threading.Event()

    def start(self) -> Live:
        """Start the reaper (closes watches nobody asked for in `idle_s`)."""
        def loop() -> None:
            while not self._stop.wait(max(1.0, self.idle_s / 4)):
                self.reap()

        threading.Thread(target=loop, daemon=True, name="dashboard-reaper").start()
        return self

    def cluster(self, inv: Inventory) -> ClusterWatch | None:
        """The watch sampling `inv`'s nodes (None while the cluster is not ready)."""
        if inv.status != "ready" or not inv.nodes:
            return None
        with self._lock:
            watch = self._clusters.get(inv.name)
            if watch is not None and watch.inv.created_at != inv.created_at:
                watch.close()
                watch = None
            if watch is None:
                watch = self._clusters[inv.name] = ClusterWatch(inv, self.interval).start()
            watch.touch()
            return watch

    def job(self, rec: JobRecord, inv: Inventory | None) -> JobWatch:
        """The watch of job `rec` (`inv`: the cluster it runs on, None when gone)."""
        key = (rec.cluster, rec.id)
        with self._lock:
            watch = self._jobs.get(key)
            stale = watch is not None and watch.source == "live" and (
                inv is None or (rec.logs_saved and not all(lg.done for lg in
                                                           watch.logs.values())))
            if watch is not None and stale:
                watch.close()
                watch = None
            if watch is None:
                watch = self._jobs[key] = JobWatch(rec, inv, self.home)
            watch.touch()
            return watch

    def drop_cluster(self, name: str) -> None:
        """Close everything live on cluster `name` (before it is removed)."""
        with self._lock:
            doomed: list[ClusterWatch | JobWatch] = [
                w for k, w in self._jobs.items() if k[0] == name]
            self._jobs = {k: w for k, w in self._jobs.items() if k[0] != name}
            cluster = self._clusters.pop(name, None)
            if cluster is not None:
                doomed.append(cluster)
        for w in doomed:
            w.close()

    def reap(self) -> int:
        """Close the watches idle for `idle_s`; returns how many."""
        cutoff = time.monotonic() - self.idle_s
        with self._lock:
            idle_c = {k: w for k, w in self._clusters.items() if w.last_used < cutoff}
            idle_j = {k: w for k, w in self._jobs.items() if w.last_used < cutoff}
            for k in idle_c:
                del self._clusters[k]
            for kj in idle_j:
                del self._jobs[kj]
        doomed: list[ClusterWatch | JobWatch] = [*idle_c.values(), *idle_j.values()]
        for w in doomed:
            w.close()
        return len(idle_c) + len(idle_j)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            watches: list[ClusterWatch | JobWatch] = [*self._clusters.values(),
                                                      *self._jobs.values()]
            self._clusters, self._jobs = {}, {}
        for w in watches:
            w.close()
