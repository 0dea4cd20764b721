"""The nodes supervise themselves: `launch --detach` and `run --detach` without a store return
as soon as the job runs (SelfStopping, a provision/job/supervision.Supervision).

`launch --detach` leaves the cluster as it is. `run --detach` brings a cluster up, starts the
job, and hands teardown to the nodes: when its part of the job has ended (plus
`idle_minutes`, a window for `logs`/`jobs` to copy the logs), each node runs its provider's
`ProviderInfo.self_stop` line. What that line can do differs per provider, and is said when the
run starts (ProviderInfo.self_stop_note): an AWS instance powers off and so terminates; a GCP
VM powers off but its disk stays billed (deleting it needs credentials nodes never get); a
docker node container stops (it cannot remove itself); the ssh provider's machines are the
user's and never stop. In every case the inventory stays on this machine, so `down` removes
whatever is left; a node that hangs is still bounded by --max-hours on the clouds. A job that
could not be started takes its new cluster with it (nothing would ever stop it).

Nothing watches such a job: the supervision flags (`--max-restarts`, `--stall-timeout`,
`--on-node-loss`, `--preempt-signal`, `--notify`) are refused before anything is made, naming
`--store` (a cluster with a store has a controller that acts on them); and nothing here reads
its output, so its fabric gate is the separate one, before it starts (gate/step.py).
"""

from __future__ import annotations

import math

from provision.job import jobs
from provision.job.launch import launching_nodes
from provision.job.nodelines import Detach
from provision.job.supervision import Ready, Started, Supervision, Target
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory
from provision.model.jobstore import JobRecord
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from provision.nodes import NodeGroup

# What only a supervisor acts on: an attached run's own process, or a managed run's controller.
SUPERVISION_FLAGS = {"max_restarts": "--max-restarts", "stall_timeout": "--stall-timeout",
                     "start_timeout": "--start-timeout",
                     "on_node_loss": "--on-node-loss", "preempt_signal": "--preempt-signal",
                     "notify": "--notify",
                     "replace_slow": "--replace-slow", "min_nodes": "--min-nodes"}


def unsupervised_flags(job: JobSpec) -> list[str]:
    """The supervision flags `job` sets to something other than their default."""
    return [flag for name, flag in SUPERVISION_FLAGS.items()
            if getattr(job, name) != JobSpec.model_fields[name].default]


def refuse_unsupervised(job: JobSpec, cluster: str | None = None) -> None:
    """A `--detach` job without a store has no supervisor (the nodes run it alone): refuse
    the flags that would be silently ignored, before anything is created. `cluster`: an
    existing cluster's name (None: a new one)."""
    flags = unsupervised_flags(job)
    if not flags:
        return
    fix = (f"the cluster {cluster!r} has no store: make one with `mgpu-cloud up --store URL`"
           if cluster else "add --store s3://BUCKET/PREFIX (or gs://, file://)")
    raise UserInputError(
        f"{', '.join(flags)} need{'s' if len(flags) == 1 else ''} a supervisor, and a --detach "
        "job without --store has none: nothing would restart, watch or report it",
        hint=f"{fix} (its controller then supervises the detached job), or run attached "
             f"(without --detach), or leave out {', '.join(flags)}")


class SelfStopping(Supervision):
    """Started detached; the nodes run it alone and (a new cluster's) stop themselves after
    it, `idle_minutes` after their part ended. Returns the job's id."""

    hands_over = "the nodes"

    def __init__(self, idle_minutes: float = 1.0) -> None:
        self.idle_minutes = idle_minutes

    def check(self, job: JobSpec, target: Target, log: Log) -> None:
        refuse_unsupervised(job, None if target.new else target.name)
        if target.new and target.spares:  # issue 44: nobody would use them, and idle they
            raise UserInputError(  # would outlive the nodes that stop themselves
                f"--spares {target.spares}: a --detach job without --store is supervised by "
                "nobody, so no rank would move to a spare, and the spares (idle) would not "
                "stop themselves with the nodes",
                hint="add --store URL (the cluster's controller uses the spares), run it "
                     "attached, or leave --spares out")

    def start(self, ready: Ready) -> Started:
        from provision.model.registry import provider_info

        info = provider_info(ready.inv.provider)
        detach = (Detach(then=info.self_stop, then_after_s=self.idle_minutes * 60)
                  if ready.new else Detach())
        rec = start(ready.inv, ready.job, ready.group, detach, ready.log)
        if ready.new:
            self._say_who_stops(ready, info.self_stop, info.self_stop_note)
        return Started(job_id=rec.id)

    def _say_who_stops(self, ready: Ready, self_stop: str | None, note: str) -> None:
        inv, log = ready.inv, ready.log
        when = ("at once" if math.isclose(self.idle_minutes, 0)
                else f"{self.idle_minutes:g} min later")
        if self_stop:
            log(f"when the job has ended the nodes stop themselves ({when}): {note}. Logs are "
                "copied here only by `jobs`/`logs` before that.")
        else:
            log(f"{inv.provider} nodes do not stop themselves: the cluster stays until "
                f"`mgpu-cloud down {inv.name}`")


def start(inv: Inventory, job: JobSpec, group: NodeGroup, detach: Detach, log: Log) -> JobRecord:
    """Record and start `job` detached on a ready cluster whose workdir is in place (and
    which runs no job: lifecycle asked)."""
    nodes = launching_nodes(inv, job)
    rec = jobs.begin(inv, job, nodes, detached=True, self_stop=detach.then)
    jobs.start_detached(inv, job, rec, group, detach)
    log(f"job {rec.id} runs on {len(nodes)} node(s), detached; follow it with "
        f"`mgpu-cloud logs {inv.name} {rec.id} --follow`")
    return rec
