"""Slurm command lines, and what their output means. Pure: no I/O, unit-tested as is.

Every command runs on the login node. The line sent over SSH is always
`bash -c 'eval "$(printf %s BASE64 | base64 -d)"'` (`shell`): valid in any login shell (sh,
bash, zsh, tcsh), whatever the script holds (newlines, quotes).

A node command runs as a job step of the allocation (`srun_line`):
    srun --jobid=J --overlap -N1 -n1 --nodelist=NODE ... bash -c SCRIPT
--overlap: a step shares the allocation's CPUs/GPUs with the steps already running there (the
training while `stop` or `exec` runs; without it, Slurm 22.05 queues the second step forever).
"""

from __future__ import annotations

import base64
import math
import re
import shlex
from dataclasses import dataclass

from provision.model.base import StrictModel

JOB_NAME_PREFIX = "mgpu-cloud-"
SETUP_FAILED = "mgpu-cloud: the slurm setup line failed"
MARK = "::mgpu-cloud::"  # section marker in the output of multi-part scripts

# squeue %T states: the allocation is usable / may become usable / is over.
RUNNING_STATES = {"RUNNING"}
WAITING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                  "RESV_DEL_HOLD", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT"}
# Pending reasons after which Slurm will never start the job as asked (squeue %r). Reasons
# such as Priority, Resources, ReqNodeNotAvail or Assoc*/QOS* limits can clear by themselves.
NEVER_REASONS = {
    "PartitionNodeLimit": "more nodes than the partition allows per job",
    "PartitionTimeLimit": "a longer --time than the partition allows",
    "BadConstraints": "no node of the partition has the --constraint features",
    "InvalidAccount": "the account is not valid for this user/partition",
    "InvalidQOS": "the QOS is not valid for this user/account",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows per job",
    "QOSMaxWallDurationPerJobLimit": "a longer --time than the QOS allows",
    "AssocMaxNodesPerJobLimit": "more nodes than the account allows per job",
    "AssocMaxWallDurationPerJobLimit": "a longer --time than the account allows",
    "DependencyNeverSatisfied": "a dependency that can never be satisfied",
    "JobHeldAdmin": "an administrator holds the job",
}
# Reported right after submission, before the scheduler's first pass (then a precise reason
# follows); one that stays names a request no node can satisfy (e.g. more nodes than exist).
SETTLING_REASONS = {"PartitionConfig"}


@dataclass(frozen=True)
class JobState:
    """One squeue line of the allocation (`STATE_FORMAT`)."""

    state: str
    reason: str
    nodelist: str
    start: str

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES


STATE_FORMAT = "%T|%r|%N|%S"


def parse_state(line: str) -> JobState | None:
    """squeue -h -o STATE_FORMAT -> JobState; None for no line (the job is unknown/gone)."""
    parts = line.strip().split("|")
    if len(parts) != 4 or not parts[0]:
        return None
    return JobState(*parts)


class AllocationRequest(StrictModel):
    """What `create` submits: one held job of `nodes` whole nodes for `time_minutes`."""

    job_name: str
    nodes: int
    time_minutes: int
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    gpus_per_node: int | None = None
    extra: list[str] = []


def job_name(cluster: str) -> str:
    return f"{JOB_NAME_PREFIX}{cluster}"


def format_time(minutes: int) -> str:
    """Minutes -> sbatch --time `D-HH:MM:SS`."""
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def minutes_for(hours: float) -> int:
    return max(1, math.ceil(hours * 60 - 1e-9))


def parse_time(text: str) -> int | None:
    """A Slurm time (scontrol/sinfo: `UNLIMITED`, `infinite`, `[D-]HH:MM:SS`, `MM:SS`,
    `D-HH`, minutes) -> minutes, rounded up; None when unlimited/unset."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        days = int(d)
        parts = [int(p) for p in text.split(":")]
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts[:3]
    return days * 24 * 60 + hours * 60 + minutes + (1 if seconds else 0)


GRES_GPU_RE = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


def gpu_count(gres: str) -> int:
    """GPUs in a node's GRES (`gpu:2`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,gpu:v100:2`)."""
    return sum(int(n) for n in GRES_GPU_RE.findall(gres))


def shell(script: str) -> str:
    """The line to send over SSH for `script` (bash, any content), safe in any login shell."""
    b64 = base64.b64encode(script.encode()).decode()
    return "bash -c " + shlex.quote(f'eval "$(printf %s {b64} | base64 -d)"')


def sbatch_argv(req: AllocationRequest) -> list[str]:
    """The held allocation: whole nodes (--exclusive), never requeued onto other nodes behind
    our back, no output file (the batch node may lack the submit folder), `sleep` until
    scancel or the time limit."""
    argv = ["sbatch", "--parsable", "--exclusive", "--no-requeue",
            f"--job-name={req.job_name}", f"--nodes={req.nodes}",
            f"--time={format_time(req.time_minutes)}", "--output=/dev/null",
            "--error=/dev/null", "--chdir=/"]
    for flag, value in (("--partition", req.partition), ("--account", req.account),
                        ("--qos", req.qos), ("--constraint", req.constraint),
                        ("--reservation", req.reservation)):
        if value:
            argv.append(f"{flag}={value}")
    if req.gpus_per_node:
        argv.append(f"--gpus-per-node={req.gpus_per_node}")
    return [*argv, *req.extra, "--wrap=exec sleep infinity"]


def check_argv(req: AllocationRequest) -> list[str]:
    """sbatch --test-only of the same request: Slurm validates it and says when it would
    start, without creating a job."""
    argv = sbatch_argv(req)
    return [argv[0], "--test-only", *argv[2:-1], "--wrap=true"]


def srun_argv(job_id: str, node: str | None, nodes: int = 1) -> list[str]:
    """A step on `node` (or on `nodes` nodes, one task each, when node is None)."""
    where = [f"--nodelist={node}"] if node else []
    return ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={nodes}",
            f"--ntasks={nodes}", "--ntasks-per-node=1", *where, "--chdir=/", "--mpi=none",
            "--quiet"]


def node_script(command: str, setup: str | None) -> str:
    """What runs on a node: in $HOME (like an SSH session), after the site's setup line. What
    the setup line prints goes to stderr: stdout is the command's (a file copied off the node,
    the JSON of `remote.pyz job status`)."""
    lines = ['cd "$HOME" || exit 1']
    if setup:
        lines.append(f"{{ {setup}\n}} >&2 || {{ echo '{SETUP_FAILED}' >&2; exit 97; }}")
    lines.append(command)
    return "\n".join(lines) + "\n"


def srun_line(job_id: str, node: str | None, command: str, *, setup: str | None = None,
              nodes: int = 1) -> str:
    """The login-node line running `command` on `node` as a step of job `job_id`."""
    script = node_script(command, setup)
    b64 = base64.b64encode(script.encode()).decode()
    inner = f'eval "$(printf %s {b64} | base64 -d)"'
    return " ".join([*srun_argv(job_id, node, nodes), "bash", "-c", shlex.quote(inner)])


def sections(output: str) -> dict[str, str]:
    """Split the output of a script that printed `MARK name` lines into {name: text}."""
    out: dict[str, str] = {}
    name: str | None = None
    buf: list[str] = []
    for line in output.splitlines():
        if line.startswith(MARK):
            if name is not None:
                out[name] = "\n".join(buf)
            name, buf = line[len(MARK):].strip(), []
        elif name is not None:
            buf.append(line)
    if name is not None:
        out[name] = "\n".join(buf)
    return out


def section_script(parts: dict[str, str]) -> str:
    """A script printing `MARK name` before the output (stdout and stderr) of each part."""
    return "\n".join(f"echo {shlex.quote(MARK + name)}\n{{ {cmd}\n}} 2>&1" for name, cmd in
                     parts.items()) + "\n"


def key_values(line: str) -> dict[str, str]:
    """`scontrol show ... -o` line -> {Key: Value} (values may not contain spaces)."""
    out: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out
