"""The words that run, or follow, a job under `remote.pyz job` on a node (remote/jobs.py).

    supervisor_words(...)   `job start`: attached (streams, ends with the controller's
                            channel unless `survive`), or detached (returns at once)
    follow_command(inv, ID) `job follow --end-line`: a job that already runs, to its end
"""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass

from provision.model.inventory import Inventory
from provision.nodes import HomePath, RemoteLayout
from provision.nodes.shell import words


@dataclass(frozen=True)
class Detach:
    """A detached start. `then`: a shell line each node runs `then_after_s` seconds after its
    part of the job ended (e.g. the provider's self-stop for `run --detach`)."""

    then: str | None = None
    then_after_s: float = 0.0


def supervisor_words(home: RemoteLayout, job_id: str, detach: Detach | None,
                     preempt: tuple[str, str, str] | None = None,
                     container: str | None = None, survive: bool = False) -> list[str]:
    """The words that run a job's command line under remote.pyz on a node (`home`: the
    remote folder as the node's shell sees it). Attached: start + follow, stopped when the
    controller's channel closes; detached: returns as soon as the job runs. `preempt`:
    (protocol, url, signal) of the node's preemption watcher (remote/preempt.py); `container`:
    the job runs in that container (signals reach its processes through `docker exec`);
    `survive`: attached, but the job goes on when the channel closes (a managed run's: its
    controller may be lost, and a new one follows the job again, issue 36)."""
    words = ["python3", home.pyz, "job", "start", "--dir", home.job_dir(job_id),
             "--pidfile", home.pidfile, "--cwd", home.work]
    if preempt is not None:
        words += ["--preempt", *preempt]
    if container is not None:
        words += ["--container", container]
    if detach is None:  # its last line: the job's state and checkpoints there (job/ends.py)
        words += ["--attach", "--survive-eof"] if survive else ["--attach"]
    elif detach.then:
        words += ["--then", detach.then, "--then-after", f"{detach.then_after_s:g}"]
    return [*words, "--"]


def follow_command(inv: Inventory, job_id: str) -> str:
    """Follow job `job_id` that already runs on a node, to its end line (remote/jobs.py)."""
    home = RemoteLayout(HomePath(inv.remote_root))
    return words(["python3", home.pyz, "job", "follow", "--dir", home.job_dir(job_id),
                  "--end-line"])


def adhoc_job_id() -> str:
    """An id for a job nobody records (e.g. `check --bandwidth`'s all-reduce)."""
    return f"adhoc-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
