"""Detection: a Watcher is the launch.JobMonitor of one launch of a supervised job
(job/recovery.py acts on what it finds; the loop is job/attached.supervise).

    node lost    a node's session dropped or the job could not start there, and the node is
                 gone: the provider says so (contract.Recoverable.node_alive), or, for a
                 provider that cannot tell, a fresh SSH login fails (recovery.classify)
    rank crash   a launcher exited non-zero (launch has run the diagnosis on its output)
    hang         no output line from any node and no checkpoint change for --stall-timeout s;
                 from the launch to its first line or checkpoint (imports, rendezvous, data
                 loading) --start-timeout s instead, by default the larger of --stall-timeout
                 and START_TIMEOUT_S (nvidia-resiliency-ext's fault tolerance has the same two:
                 initial_rank_heartbeat_timeout and rank_heartbeat_timeout); every rank's
                 Python stack is dumped into the run's output first
    preemption   a node's supervisor saw a notice (remote/preempt.py) and signalled its ranks;
                 the other nodes' ranks get the same signal, the save is copied, then stop
    slow node    (issue 36) a node whose ranks compute slower than the others' for a while
                 (job/stragglers.py, from the job's `compute=` markers) is named; with
                 --replace-slow it is handled like a preemption notice: every rank saves,
                 the save is copied, the node is replaced and the job resumes"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from provision.job.checkpoints import CheckpointKeeper
from provision.job.launch import job_container
from provision.job.notices import maintenance_message
from provision.job.stragglers import Slow, StragglerWatch
from provision.model.inventory import Inventory, NodeRecord
from provision.model.logsink import Log
from provision.model.nodejson import NodeEvent, Unreadable, read, unreadable
from provision.model.nodetext import lines, shown
from provision.model.spec import JobSpec
from provision.nodes import NodeGroup

# A managed run's record sink (provision/job/managed/): (event, message, node names).
OnEvent = Callable[[str, str, list[str]], None]
EVENT_PREFIX = "MGPU-EVENT "  # remote/supervise.py's prefix
PREEMPT_SAVE_DEADLINE_S = 90.0  # AWS gives ~120 s, GCP ~30 s: what a save may take at most
START_TIMEOUT_S = 300.0  # a launch's start (torch's import on a busy CI node took 27 s, stop 53)


@dataclass
class Watcher:
    """launch.JobMonitor: hang and preemption detection, per-node exit codes."""

    inv: Inventory
    job: JobSpec
    keeper: CheckpointKeeper
    log: Log
    codes: dict[str, int] = field(default_factory=dict)
    first_failed: list[str] = field(default_factory=list)  # the node that failed first
    preempted: dict[str, dict[str, str]] = field(default_factory=dict)
    reason: str | None = None
    last_output: float = field(default_factory=time.monotonic)
    launched: float = field(default_factory=time.monotonic)  # the hang rule's start (poll)
    heard: bool = False  # a line came from a node since the launch
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: Callable[[], bool] | None = None  # True: stop the job for good (a managed cancel)
    # every node's lines, `[node-R] `-prefixed, in the order they arrived (for the diagnosis)
    output: deque[str] = field(default_factory=lambda: deque(maxlen=20000))
    on_line: Callable[[NodeRecord, str], None] | None = None  # resume check, ledger ...
    stragglers: StragglerWatch | None = None
    on_event: OnEvent | None = None
    grow: Callable[[], bool] | None = None  # True: a dropped node is back (job/elastic.py)
    gone: Callable[[], list[str]] | None = None  # nodes the provider says are gone (liveness)

    def __post_init__(self) -> None:
        if self.stragglers is None and len(self.inv.nodes) > 1:
            self.stragglers = StragglerWatch([n.name for n in self.inv.nodes],
                                             fraction=self.job.slow_fraction,
                                             on_slow=self._slow)

    def _slow(self, slow: Slow) -> None:
        self.log(f"{slow}" + ("; replacing it (--replace-slow)" if self.job.replace_slow else
                              " (--replace-slow would replace it)"))
        if self.on_event is not None:
            self.on_event("straggler", str(slow), [slow.node])
        if self.job.replace_slow:
            with self.lock:  # the preemption path: save, copy, stop, replace, resume
                self.preempted.setdefault(slow.node, {"action": "slow", "signalled": "no"})

    def line(self, node: NodeRecord, text: str) -> None:
        self.last_output, self.heard = time.monotonic(), True
        self.output.append(f"[{node.name}] {text}")
        if self.on_line is not None:
            self.on_line(node, text)
        if self.stragglers is not None:
            self.stragglers.feed(node.name, text)
        if text.startswith(EVENT_PREFIX):
            try:
                event = read(NodeEvent, text[len(EVENT_PREFIX):]).fields()
            except Unreadable as exc:  # said (a line, an event), and the job goes on
                self.log(said := unreadable(node.name, "event", exc))
                if self.on_event is not None:
                    self.on_event("unreadable", said, [node.name])
                return
            if event.get("event") == "preemption":
                with self.lock:
                    self.preempted.setdefault(node.name, event)
            elif event.get("event") in ("maintenance-scheduled", "maintenance-cleared"):
                self.log(maintenance_message(node, event))

    def finished(self, node: NodeRecord, code: int) -> None:
        with self.lock:
            self.codes[node.name] = code
            if code != 0 and not self.first_failed and self.reason is None:
                self.first_failed.append(node.name)

    def poll(self) -> str | None:
        if self.stop is not None and self.reason is None and self.stop():
            self.reason = "cancelled"
            return "cancelled"
        if self.preempted and self.reason is None:
            self.reason = "preemption"
            return self._preemption()
        lost = self.gone() if self.gone is not None and self.reason is None else []
        if lost:
            self.reason = "node lost"
            return f"node lost: {', '.join(lost)} is gone (the provider says so)"
        if self.grow is not None and self.reason is None and self.grow():
            self.reason = "grow"
            return "grow: a replacement is ready, after a checkpoint"
        limit = self._hang_limit()
        if limit is not None and self.reason is None:
            quiet = time.monotonic() - max(self.last_output, self.keeper.last_change)
            if quiet > limit[0]:
                self.reason = "hang"
                self.log(f"no output and no checkpoint for {quiet:.0f} s ({limit[1]} "
                         f"{limit[0]:g}): the job looks hung; dumping every rank's stack")
                dump_stacks(self.inv, self.job, self.log)
                return f"hang: no progress for {quiet:.0f} s"
        return None

    def _hang_limit(self) -> tuple[float, str] | None:
        """The quiet seconds that make a hang now, and the flag that says so: until the
        launch's first line or checkpoint the start's limit, then the stall's."""
        stall, start = self.job.stall_timeout, self.job.start_timeout
        if self.heard or self.keeper.last_change > self.launched:
            return None if stall is None else (stall, "--stall-timeout")
        if start is not None:
            return start, "--start-timeout"
        if stall is None:
            return None
        return max(stall, START_TIMEOUT_S), "since the launch, --start-timeout's default"

    def _preemption(self) -> str:
        names = sorted(self.preempted)
        first = self.preempted[names[0]]
        signame = self.job.preempt_signal
        what = ("slow" if first.get("action") == "slow" else
                f"preemption notice ({first.get('action', '?')}"
                f"{' at ' + first['time'] if first.get('time') else ''})")
        self.log(f"{', '.join(names)}: {what}; every rank is asked to save now ({signame}); "
                 "waiting for the checkpoint")
        # the notice's save is newer than the first signal (node clock) or than each node's now
        ats = [float(e["at"]) for e in self.preempted.values() if e.get("at")]
        since = {n.name: min(ats) for n in self.inv.nodes} if ats else self.keeper.clocks()
        with NodeGroup(self.inv) as group:  # the notified nodes signalled their own ranks
            others = [n for n in self.inv.nodes if n.name not in self.preempted
                      or self.preempted[n.name].get("signalled") == "no"]
            layout = group.layout
            group.run(layout.remote_command("signal", "--pidfile", layout.pidfile,
                                            "--signal", signame,
                                            *_container_words(self.inv, self.job)),
                      nodes=others, timeout=60)
        began = time.monotonic()
        if self.keeper.wait_for_save(since, deadline_s=PREEMPT_SAVE_DEADLINE_S,
                                     hopeless=lambda: self._noticed_gone(names)):
            self.log("the checkpoint saved after the notice is kept")
        elif self._noticed_gone(names):
            self.log(f"no checkpoint was saved before {', '.join(names)} "
                     f"{'was' if len(names) == 1 else 'were'} gone "
                     f"({time.monotonic() - began:.0f} s after the notice); the last one "
                     "kept will be used")
        else:
            self.log(f"no checkpoint was saved within {PREEMPT_SAVE_DEADLINE_S:.0f} s of the "
                     "notice; the last one kept will be used")
        if first.get("action") == "slow":
            return f"slow node {', '.join(names)}"
        return f"preemption notice on {', '.join(names)}"

    def _noticed_gone(self, names: list[str]) -> bool:
        """Every noticed node is gone (the provider says so: liveness): no save the notice
        asked for can come any more (its ranks took part in it; a kubelet kills a deleted
        pod at its grace period's end, 5 s for a pod outside a queue), so the wait for it
        ends here, not at PREEMPT_SAVE_DEADLINE_S."""
        return self.gone is not None and set(names) <= set(self.gone())


def _container_words(inv: Inventory, job: JobSpec) -> list[str]:
    container = job_container(inv, job)
    return ["--container", container] if container else []


def dump_stacks(inv: Inventory, job: JobSpec, log: Log) -> None:
    """Every rank's Python stack: py-spy output comes back here; faulthandler's goes to the
    job's own output (already streamed with its [node-R] prefix)."""
    with NodeGroup(inv) as group:
        layout = group.layout
        res = group.run(layout.remote_command("stacks", "--pidfile", layout.pidfile,
                                              *_container_words(inv, job)), timeout=150)
    for name, r in res.items():
        text = r.value.stdout if r.value is not None else r.why()
        for line in lines(text):
            log(f"[{name}] {shown(line)}")
