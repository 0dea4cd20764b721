"""What each node says when its part of a job ends: the last line of `remote.pyz job start
--attach` (remote/jobs.py END), `MGPU-JOB-END {"job": ID, "state": ..., "checkpoints": ...}`.

run_job takes these lines off the node's stream (they are not the job's output). The job's
record then gets each node's exit code and end time (jobs.refresh), and the last checkpoint
copy gets each node's manifest (CheckpointKeeper.stop), without starting `remote.pyz` on every
node twice more. A node that said nothing (its session dropped, or a remote.pyz from before
this line) is asked as before.
"""

from __future__ import annotations

import threading
from typing import Any

from provision.job.checkpoints import Manifest, parse_manifest
from provision.model.nodejson import MAX_MANIFEST, JobEnd, Unreadable, read
from remote.jobs import END


class JobEnds:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._reports: dict[str, JobEnd] = {}
        self._lock = threading.Lock()  # each node's writer calls from its own thread

    def take(self, node: str, line: str) -> bool:
        """Whether `line` is `node`'s end line of this job (then kept, not shown)."""
        if not line.startswith(END):
            return False
        try:  # nodejson's model: an unreadable end line is shown as the job's output
            report = read(JobEnd, line[len(END):], limit=MAX_MANIFEST)
        except Unreadable:
            return False
        if report.job != self.job_id:
            return False
        with self._lock:
            self._reports[node] = report
        return True

    def states(self) -> dict[str, dict[str, Any]]:
        """node -> {job id: the job's state there}, as `remote.pyz job status` answers."""
        with self._lock:
            return {node: {self.job_id: r.state.model_dump()}
                    for node, r in self._reports.items() if r.state is not None}

    def manifests(self) -> dict[str, tuple[Manifest, float]]:
        """node -> (its checkpoint folder's manifest, the node's clock), as
        `remote.pyz ckpt-manifest` answers."""
        with self._lock:
            return {node: parse_manifest(r.checkpoints) for node, r in self._reports.items()
                    if r.checkpoints is not None}
