"""A job's log per node for the job page: live while it runs, the saved copies after.

Live: `jobs.follow` (the code behind `mgpu-cloud logs --follow`) per node, on a thread of its
own, from the log's start until the job has ended on that node; a broken channel is followed
again after RETRY_S, skipping the lines already held. Rank 0's log is followed from the start
(it prints the metrics); another node's once somebody asks for it. When a node's part has
ended, the record is refreshed (`jobs.refresh`, as `mgpu-cloud jobs` does: it saves the state
and copies the logs here).
Saved: the copies in the job folder ($MGPU_CLOUD_HOME/jobs/NAME/ID/node-R.log).

Lines are split on `\n` only and served with their control characters escaped
(model/nodetext.py); the metrics are parsed from the lines as the node sent them.
Lines are numbered from the log's start; the last MAX_LINES per node are held (older ones are
dropped, a reader asking for them gets the oldest held and learns how many it missed).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO, cast

from provision.job.jobs import follow, refresh
from provision.model.inventory import Inventory, NodeRecord
from provision.model.jobstore import JobRecord, JobStore
from provision.model.nodetext import read_lines, shown, split_lines
from provision.nodes import NodeGroup, describe_exception
from provision.operations.dashboard.metrics import LogParser, Series, merged_metrics

MAX_LINES = 20000
RETRY_S = 5.0
REFRESH_S = 10.0  # a running job's record is asked for at most this often


class NodeLog:
    """One node's lines (thread-safe). Also a Writer for `jobs.follow` output, whose lines
    carry a `[node] ` prefix that is removed; the first `skip` lines written are dropped (a
    re-follow after a broken channel starts again from the log's start)."""

    def __init__(self, node: str, rank: int, live: bool, done: bool | None = None) -> None:
        self.node, self.rank = node, rank
        self.lines: deque[str] = deque(maxlen=MAX_LINES)
        self.total = 0  # lines ever added; line k (0-based) is held when k >= total - len
        self.done = not live if done is None else done  # no more lines will come
        self.error: str | None = None
        self.following = False
        self.parser = LogParser(node, live=live)
        self._lock = threading.Lock()
        self._buf = ""
        self._skip = 0
        self._prefix = f"[{node}] "

    def restart(self) -> None:
        with self._lock:
            self._buf, self._skip = "", self.total

    def add(self, line: str) -> None:
        with self._lock:
            if line.startswith(self._prefix):
                line = line[len(self._prefix):]
            if self._skip > 0:
                self._skip -= 1
                return
            self.lines.append(line)
            self.total += 1
            self.parser.feed(line)

    def write(self, data: str) -> int:
        with self._lock:
            lines, self._buf = split_lines(self._buf + data)
        for line in lines:
            self.add(line)
        return len(data)

    def flush(self) -> None:
        pass

    def parsed(self) -> tuple[LogParser, list[dict[str, Any]]]:
        """A snapshot of the metrics parsed so far (its series copied) and the events."""
        with self._lock:
            out = LogParser(self.parser.node, self.parser.live)
            for key, s in self.parser.series.items():
                copy = out.series[key] = Series()
                copy.x, copy.y = list(s.x), list(s.y)
            return out, list(self.parser.events)

    def read(self, start: int, limit: int = 2000) -> dict[str, Any]:
        """Lines from number `start` on (at most `limit`): {"node", "from", "lines", "next",
        "missed" (lines dropped before the oldest held), "done", "error"}."""
        with self._lock:
            first = self.total - len(self.lines)
            begin = max(start, first)
            held = list(self.lines)[begin - first: begin - first + limit]
            return {"node": self.node, "from": begin, "lines": [shown(line) for line in held],
                    "next": begin + len(held),
                    "missed": max(0, first - start), "done": self.done and
                    begin + len(held) >= self.total, "error": self.error,
                    "following": self.following}


class JobWatch:
    """The logs of one job. `source`: "live" (followed on the nodes), "saved" (copies here)
    or "missing" (the cluster went away before they were copied)."""

    def __init__(self, rec: JobRecord, inv: Inventory | None, home: Path | None = None) -> None:
        self.rec, self.inv, self.home = rec, inv, home
        self.store = JobStore(home)
        self.last_used = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._groups: list[NodeGroup] = []
        self._last_refresh = 0.0
        self._refreshing = False
        live = (not rec.logs_saved and inv is not None and inv.status == "ready")
        self.source = "live" if live else ("saved" if rec.logs_saved else "missing")
        ranks = sorted(rec.nodes.items(), key=lambda kv: kv[1].rank)
        self.logs = {name: NodeLog(name, nj.rank, live, done=self.source == "missing")
                     for name, nj in ranks}
        if self.source == "saved":
            # on a thread, in rank order (rank 0 prints the metrics): 64 big files must not
            # hold up an answer
            threading.Thread(target=self._load_all_saved, daemon=True,
                             name="dashboard-saved-logs").start()
        elif self.source == "missing":
            why = ("this log was not copied here before the cluster was removed"
                   if inv is None else f"the cluster is {inv.status}: its nodes are not read now")
            for log in self.logs.values():
                log.error = why
        elif ranks:
            self.want(ranks[0][0])

    def _load_all_saved(self) -> None:
        for log in list(self.logs.values()):
            self._load_saved(log)

    def _load_saved(self, log: NodeLog) -> None:
        path = self.store.log_path(self.rec, log.node)
        try:
            for line in read_lines(path):
                if self._stop.is_set():
                    return
                log.add(line)
        except FileNotFoundError:
            log.error = "no copy of this node's log was kept"
        log.done = True

    # --- live ---------------------------------------------------------------------------------
    def want(self, node: str) -> None:
        """Follow `node`'s log if it is live and not followed yet."""
        log = self.logs.get(node)
        if self.source != "live" or log is None or self.inv is None:
            return
        with self._lock:
            if log.following or log.done or self._stop.is_set():
                return
            log.following = True
        record = next(n for n in self.inv.nodes if n.name == node)
        threading.Thread(target=self._follow, args=(record, log), daemon=True,
                         name=f"dashboard-log-{node}").start()

    def _follow(self, node: NodeRecord, log: NodeLog) -> None:
        assert self.inv is not None
        group = NodeGroup(self.inv, nodes=[node])
        with self._lock:
            self._groups.append(group)
        try:
            while not self._stop.is_set():
                log.restart()
                try:
                    # follow() writes and flushes only: a NodeLog is enough of a TextIO for it
                    out = cast(TextIO, log)
                    result = follow(self.rec, group, out, nodes=[node])[node.name]
                    why = result.error
                except Exception as exc:  # noqa: BLE001 - shown, then retried
                    why = describe_exception(exc)
                if self._stop.is_set():
                    return
                if why is None:
                    log.done, log.error = True, None
                    break
                log.error = f"not answering: {why}"
                self._stop.wait(RETRY_S)
        finally:
            log.following = False
            group.close()
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Ask the nodes how the job is (in the background; at most every REFRESH_S unless
        `force`); the record on disk is what the page shows."""
        if self.source != "live" or self.inv is None:
            return
        with self._lock:
            due = force or time.monotonic() - self._last_refresh >= REFRESH_S
            if self._refreshing or not due or self._stop.is_set():
                return
            self._refreshing, self._last_refresh = True, time.monotonic()
        threading.Thread(target=self._refresh, daemon=True, name="dashboard-refresh").start()

    def _refresh(self) -> None:
        assert self.inv is not None
        try:
            rec = self.store.load(self.rec.cluster, self.rec.id)  # what other commands wrote
            if not (rec.final and rec.logs_saved):
                with NodeGroup(self.inv) as group:
                    refresh(self.inv, [rec], group, store=self.store)
            self.rec = rec
        except Exception:  # noqa: BLE001, S110 - the next refresh tries again
            pass
        finally:
            with self._lock:
                self._refreshing = False

    # --- reading ------------------------------------------------------------------------------
    def touch(self) -> None:
        self.last_used = time.monotonic()

    def read(self, node: str, start: int, limit: int = 2000) -> dict[str, Any] | None:
        log = self.logs.get(node)
        if log is None:
            return None
        self.want(node)
        return {**log.read(start, limit), "source": self.source}

    def metrics(self) -> dict[str, dict[str, Any]]:
        return merged_metrics([(log.rank, log.parsed()[0]) for log in self.logs.values()])

    def log_events(self) -> list[dict[str, Any]]:
        return [ev for log in self.logs.values() for ev in log.parsed()[1]]

    def status(self) -> dict[str, Any]:
        """Per node: {"node", "rank", "lines", "done", "error", "following"}."""
        return {"source": self.source, "nodes": [
            {"node": log.node, "rank": log.rank, "lines": log.total, "done": log.done,
             "error": log.error, "following": log.following} for log in self.logs.values()]}

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            groups, self._groups = list(self._groups), []
        for group in groups:
            group.close()

