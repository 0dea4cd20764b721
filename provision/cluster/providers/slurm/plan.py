"""`plan` for Slurm: read-only questions to the site, one SSH command on the login node.

    resolve_target   --login/--proxy-jump/-i through ~/.ssh/config (as the ssh provider does),
                     host keys from the user's known_hosts (never trusted on first use)
    probe            ONE script on the login node: Slurm version, partition limits (scontrol),
                     node states and GPUs (sinfo), `sbatch --test-only` of the exact request
                     (Slurm's own verdict and expected start, no job made), the user's
                     associations (sacctmgr, where accounting is on), container runtimes
    build_plan       pure: the probe's output -> SlurmPlan, or UserInputError quoting Slurm
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from provision.cluster.providers.slurm.login import Hop, LoginSession, LoginTarget, split_target
from provision.cluster.providers.slurm.options import DEFAULT_TIME_MINUTES, SlurmOptions
from provision.cluster.providers.slurm.slurmcmd import (
    AllocationRequest,
    check_argv,
    format_time,
    gpu_count,
    job_name,
    key_values,
    minutes_for,
    parse_time,
    section_script,
    sections,
    shell,
)
from provision.model.base import StrictModel
from provision.model.errors import UserInputError
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec
from provision.model.sshhost import SshHostOptions

PROBE_TIMEOUT_S = 60.0
MIN_VERSION = (20, 11)  # srun --overlap


class SiteFacts(StrictModel):
    """What plan learnt about the site (shown, and used by create)."""

    version: str
    user: str
    partition: str
    gpus_per_node: int  # GPUs (GRES gpu) of the partition's smallest node, 0 if none
    container_runtimes: list[str]  # on the login node: "pyxis", "apptainer", "singularity"
    accounting: bool


class SlurmPlan(Plan):
    target: LoginTarget
    request: AllocationRequest
    site: SiteFacts


# --------------------------------------------------------------------------- login target
def resolve_target(opts: SlurmOptions) -> tuple[LoginTarget, list[str]]:
    """The login node (and jump host) with pinned host keys; notes about keys accepted now.
    UserInputError / ProviderUnavailableError otherwise (the same rules as the ssh provider's
    hosts: provision/nodes/sshhosts.py)."""
    from provision.cluster.providers.slurm.login import LoginError
    from provision.nodes.hostkeys import Endpoint, HostKeyProblem, Jump, Unreachable
    from provision.nodes.sshhosts import (
        HostDefaults,
        HostKeys,
        load_ssh_config,
        resolve_host,
        split_jump,
    )

    if not opts.login:
        raise UserInputError("the slurm provider needs the login node",
                             hint="pass --login [user@]host[:port] (or an ssh config alias)")
    user, host, port = split_target(opts.login, "--login")
    entry: dict[str, object] = {"address": host, "user": user, "proxy_jump": opts.proxy_jump}
    if port is not None:
        entry["port"] = port
    resolved = resolve_host(SshHostOptions.model_validate(entry), "--login",
                            defaults=[HostDefaults(identity_file=opts.identity_file)],
                            config=load_ssh_config(), default_slots=None, base=None)
    keys = HostKeys(opts.accept_new_host_keys)
    notes: list[str] = []

    def pin(endpoint: Endpoint, via: Jump | None, what: str) -> str:
        try:
            key, how = keys.pin(endpoint, via)
        except HostKeyProblem as exc:
            raise UserInputError(f"{what}: {exc}", hint=keys.hint(exc.kind)) from None
        except Unreachable as exc:
            raise LoginError(f"{what} unreachable: {exc}", hint=keys.hint("unreachable")) from None
        if how == "accepted":
            notes.append(keys.accepted(what, key))
        return key

    jump_hop: Hop | None = None
    jump: Jump | None = None
    if resolved.proxy_jump:
        juser, jend = split_jump(resolved.proxy_jump)
        jkey = pin(jend, None, f"jump host {resolved.proxy_jump}")
        jump_hop = Hop(user=juser, address=jend.address, port=jend.port, host_key=jkey)
        jump = Jump(jend, juser, resolved.identity_file, jkey)
    key = pin(Endpoint(resolved.address, resolved.port), jump, f"login node {resolved.target}")
    login = Hop(user=resolved.user, address=resolved.address, port=resolved.port, host_key=key)
    return LoginTarget(login=login, identity_file=resolved.identity_file, jump=jump_hop), notes


# --------------------------------------------------------------------------------- probe
def request_for(spec: ClusterSpec, opts: SlurmOptions, gpus_per_node: int | None,
                time_minutes: int | None = None) -> AllocationRequest:
    return AllocationRequest(
        job_name=job_name(spec.name), nodes=spec.nodes,
        time_minutes=time_minutes or (minutes_for(spec.max_hours) if spec.max_hours
                                      else DEFAULT_TIME_MINUTES),
        partition=opts.partition, account=opts.account, qos=opts.qos,
        constraint=opts.constraint, reservation=opts.reservation,
        gpus_per_node=gpus_per_node, extra=_no_kill(spec) + list(opts.sbatch_args))


def _no_kill(spec: ClusterSpec) -> list[str]:
    """With warm spares (issue 44) a failed node must not end the allocation: by default
    Slurm terminates a job when one of its nodes fails; `--no-kill` keeps the allocation so
    that new steps run on the nodes left (SchedMD, sbatch(1), "-k, --no-kill")."""
    return ["--no-kill"] if spec.spares else []


def probe_script(partition: str | None, test_request: AllocationRequest) -> str:
    """Sections: version, user, partition (scontrol), nodes (sinfo), test (sbatch
    --test-only, then `exit=N`), assoc (sacctmgr, then `exit=N`), runtime."""
    q = shlex.quote
    default = "sinfo -h -o %P | sed -n 's/[*]$//p' | head -n 1"
    pick = f"P={q(partition)}" if partition else f'P="$({default})"'
    return f"{pick}\n" + section_script({
        "version": "sinfo --version",
        "user": "id -un",
        "partition": 'echo "$P"; [ -n "$P" ] && scontrol show partition -o "$P"',
        "nodes": '[ -n "$P" ] && sinfo -h -N -p "$P" -o "%N|%t|%c|%m|%G|%f"',
        "test": f"timeout 30 {shlex.join(check_argv(test_request))}; echo \"exit=$?\"",
        "assoc": 'timeout 15 sacctmgr -nP show assoc where user="$(id -un)" '
                 "format=Account,Partition,QOS,MaxWall,MaxNodes,GrpTRES; echo \"exit=$?\"",
        "runtime": "srun --help 2>&1 | grep -q -- --container-image && echo pyxis; "
                   "for c in apptainer singularity; do command -v $c >/dev/null && echo $c; "
                   "done; true",
    })


def run_probe(target: LoginTarget, partition: str | None, req: AllocationRequest) -> str:
    session = LoginSession(target)
    try:
        res = session.run(shell(probe_script(partition, req)), timeout=PROBE_TIMEOUT_S)
    finally:
        session.close()
    if "version" not in sections(res.stdout):
        raise UserInputError(f"the login node did not answer the Slurm probe "
                             f"(exit {res.exit_code}): {res.tail()}",
                             hint="is this a Slurm login node? `sinfo` should work there")
    return res.stdout


# ----------------------------------------------------------------------------- build_plan
@dataclass
class Partition:
    name: str
    limits: dict[str, str]
    nodes: list[dict[str, str]] = field(default_factory=list)

    @property
    def max_nodes(self) -> int | None:
        v = self.limits.get("MaxNodes", "UNLIMITED")
        return int(v) if v.isdigit() else None

    @property
    def total_nodes(self) -> int | None:
        v = self.limits.get("TotalNodes", "")
        return int(v) if v.isdigit() else None

    @property
    def max_minutes(self) -> int | None:
        return parse_time(self.limits.get("MaxTime", "UNLIMITED"))

    def state_counts(self) -> dict[str, int]:
        """idle / allocated / mixed / other, by node (Slurm's short states)."""
        counts = {"idle": 0, "allocated": 0, "mixed": 0, "other": 0}
        for n in self.nodes:
            state = n["state"].rstrip("*~#!%$@^-")
            key = {"idle": "idle", "alloc": "allocated", "mix": "mixed"}.get(state, "other")
            counts[key] += 1
        return counts

    def gpus_per_node(self) -> int:
        """GPUs of the partition's smallest node (what every node of a job surely has)."""
        gpus = [gpu_count(n["gres"]) for n in self.nodes]
        return min(gpus) if gpus else 0

    def most_gpus(self) -> int:
        return max((gpu_count(n["gres"]) for n in self.nodes), default=0)


def parse_partition(text: str, nodes_text: str) -> Partition | None:
    lines = text.splitlines()
    if len(lines) < 2 or "PartitionName=" not in lines[1]:
        return None  # no such partition (scontrol: "Partition X not found")
    part = Partition(lines[0].strip(), key_values(lines[1]))
    for line in nodes_text.splitlines():
        cols = line.split("|")
        if len(cols) == 6:
            part.nodes.append(dict(zip(("name", "state", "cpus", "memory", "gres", "features"),
                                       cols, strict=True)))
    return part


def container_note(found: list[str]) -> str:
    """What --image will use, as far as the login node shows (create asks the nodes)."""
    usable = [r for r in found if r in ("apptainer", "singularity")]
    if usable:
        return f"containers (--image): {usable[0]} exec (checked again on the nodes at up)"
    if "pyxis" in found:
        return ("containers (--image): only pyxis found, which mgpu-cloud does not drive yet: "
                "run without --image (set the environment up with the slurm `setup` line)")
    return "containers (--image): none found (run without --image)"


def _exit_of(text: str) -> tuple[int, str]:
    """(exit code, output without the trailing `exit=N` line)."""
    lines = text.rstrip("\n").splitlines()
    if lines and lines[-1].startswith("exit="):
        return int(lines[-1][5:] or 1), "\n".join(lines[:-1])
    return 1, text


def _version(text: str) -> tuple[int, int]:
    words = text.split()
    try:
        major, minor = words[-1].split(".")[:2]
        return int(major), int(minor)
    except (IndexError, ValueError):
        return (0, 0)


def _slurm_says(text: str) -> str:
    return "\n  ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _limit_problems(spec: ClusterSpec, asked: str, partition: Partition | None,
                    gpus: int | None, most_gpus: int, req: AllocationRequest) -> list[str]:
    """What the partition's own limits refuse (Slurm's --test-only verdict comes apart)."""
    problems: list[str] = []
    if partition is not None:
        if partition.max_nodes is not None and spec.nodes > partition.max_nodes:
            problems.append(f"partition {asked} allows at most {partition.max_nodes} node(s) per "
                            f"job; --nodes {spec.nodes} asked")
        elif partition.total_nodes is not None and spec.nodes > partition.total_nodes:
            problems.append(f"partition {asked} has {partition.total_nodes} node(s); --nodes "
                            f"{spec.nodes} asked")
    if gpus and gpus > most_gpus:
        problems.append(f"partition {asked} has at most {most_gpus} GPU(s) per node; "
                        f"--gpus-per-node {gpus} asked")
    if partition is not None and partition.max_minutes is not None \
            and req.time_minutes > partition.max_minutes:
        problems.append(f"partition {asked} allows at most {format_time(partition.max_minutes)} "
                        f"per job; --time {format_time(req.time_minutes)} asked (--max-hours)")
    return problems


def _request_details(spec: ClusterSpec, opts: SlurmOptions, req: AllocationRequest,
                     gpus: int | None, partition: Partition, test_text: str) -> dict[str, str]:
    details = {
        "partition": partition.name, "nodes": str(spec.nodes),
        "time": format_time(req.time_minutes) + ("" if spec.max_hours else " (default)"),
        "exclusive": "yes",
        "gpus_per_node": str(gpus) if gpus else "none (no GPUs in the partition)",
    }
    for key in ("account", "qos", "constraint", "reservation"):
        value = getattr(opts, key)
        if value:
            details[key] = value
    start = next((line for line in test_text.splitlines() if " to start at " in line), "")
    if start:
        details["expected_start"] = start.split(" to start at ", 1)[1].split(" using ")[0]
    return details


def _associations(assoc_text: str) -> str:
    rows = [r.split("|") for r in assoc_text.splitlines() if r.strip()]
    shown = "; ".join(
        f"account {r[0]}" + (f" partition {r[1]}" if r[1] else "")
        + (f" QOS {r[2]}" if r[2] else "") + (f" MaxWall {r[3]}" if r[3] else "")
        + (f" MaxNodes {r[4]}" if r[4] else "") + (f" GrpTRES {r[5]}" if r[5] else "")
        for r in rows if len(r) >= 6)
    return f"your associations: {shown or 'none listed'}"


def _site_notes(spec: ClusterSpec, opts: SlurmOptions, partition: Partition, site_gpus: int,
                req: AllocationRequest, accounting: str | None, runtimes: list[str]) -> list[str]:
    """The plan's notes about the site (after the login line); accounting: the associations
    text, None where accounting is off."""
    counts, limits = partition.state_counts(), partition.limits
    notes = [f"partition {partition.name}: {limits.get('State', '?')}, "
             f"{len(partition.nodes)} node(s) ({counts['idle']} idle, "
             f"{counts['allocated']} allocated, {counts['mixed']} mixed, "
             f"{counts['other']} other), per job at most "
             f"{limits.get('MaxNodes', '?')} node(s) and {limits.get('MaxTime', '?')}, "
             f"{site_gpus} GPU(s) per node"]
    tail = [_associations(accounting) if accounting is not None
            else "accounting is off at this site: --account/--qos are not checked"]
    if not spec.max_hours:
        tail.append(f"--time {format_time(req.time_minutes)} by default; --max-hours sets "
                    "it (the allocation, and every process in it, ends then)")
    tail.append("node commands run as job steps through the login node (srun)"
                if opts.node_access == "srun" else
                "node commands run over SSH to the nodes through the login node "
                "(checked at up)")
    tail.append(container_note(runtimes))
    tail.append("nothing is billed in dollars: the allocation counts against your "
                "account/fair share while it runs; `down` cancels it")
    if spec.gpus_per_node and not site_gpus:
        tail.append(f"the partition has no GPUs: {spec.gpus_per_node} process(es) per "
                    "node, no GPUs requested")
    return notes + tail


def build_plan(spec: ClusterSpec, opts: SlurmOptions, target: LoginTarget, output: str,
               notes: list[str]) -> SlurmPlan:
    """The probe's output -> SlurmPlan. UserInputError, quoting Slurm, when Slurm (or a
    partition limit) refuses the request."""
    parts = sections(output)
    version = parts.get("version", "").strip()
    if _version(version) < MIN_VERSION:
        raise UserInputError(f"{version or 'an unknown Slurm'} is too old: job steps sharing "
                             "an allocation (srun --overlap) need Slurm 20.11 or newer")
    user = parts.get("user", "").strip() or target.login.user
    test_code, test_text = _exit_of(parts.get("test", ""))
    partition = parse_partition(parts.get("partition", ""), parts.get("nodes", ""))
    asked = opts.partition or (partition.name if partition else "")
    site_gpus = partition.gpus_per_node() if partition else 0
    most_gpus = partition.most_gpus() if partition else 0
    gpus = (spec.gpus_per_node or site_gpus) if most_gpus else None
    req = request_for(spec, opts, gpus)
    problems = _limit_problems(spec, asked, partition, gpus, most_gpus, req)
    if test_code != 0:
        problems.append(f"Slurm refused the request (sbatch --test-only):\n  "
                        f"{_slurm_says(test_text)}")
    if problems:
        raise UserInputError(
            "the allocation cannot be made: " + "\n".join(problems),
            hint="`sinfo -s` on the login node lists the partitions; check --partition, "
                 "--account, --qos, --constraint, --nodes and --max-hours")
    if partition is None:  # Slurm accepted it, but `scontrol show partition` said nothing
        raise UserInputError(f"cannot read the limits of partition {asked or '(default)'!r} "
                             "on the login node", hint="pass --partition explicitly; `sinfo -s` "
                             "lists the partitions")
    assoc_code, assoc_text = _exit_of(parts.get("assoc", ""))
    runtimes = parts.get("runtime", "").split()
    site = (f"Slurm {version.split()[-1]} at {target.login.text}"
            + (f" via {target.jump.text}" if target.jump else "") + f", user {user}")
    plan_notes = [site, *_site_notes(spec, opts, partition, site_gpus, req,
                                     assoc_text if assoc_code == 0 else None, runtimes)]
    plan_notes[2:2] = notes  # after the site and partition lines, as before
    details = _request_details(spec, opts, req, gpus, partition, test_text)
    return SlurmPlan(
        provider="slurm", cluster=spec.name, nodes=spec.nodes,
        slots_per_node=spec.gpus_per_node or site_gpus or 1,
        resources=[PlannedResource(kind="slurm-allocation", name=req.job_name, details=details)],
        hourly_cost_usd=0.0, max_hours=req.time_minutes / 60, notes=plan_notes,
        target=target, request=req,
        site=SiteFacts(version=version, user=user, partition=partition.name,
                       gpus_per_node=site_gpus, container_runtimes=runtimes,
                       accounting=assoc_code == 0),
    )


def plan(spec: ClusterSpec) -> SlurmPlan:
    opts = spec.options_as(SlurmOptions)
    if opts.node_access == "ssh" and opts.proxy_jump:
        raise UserInputError("--node-access ssh reaches the nodes through the login node as a "
                             "jump host; a login node behind --proxy-jump would need two hops",
                             hint="use --node-access srun (the default)")
    target, notes = resolve_target(opts)
    # The GPUs to ask for depend on the partition (none when it has none): --test-only checks
    # everything else, build_plan checks the GPU count against the partition's nodes.
    probe_req = request_for(spec, opts, None)
    output = run_probe(target, opts.partition, probe_req)
    return build_plan(spec, opts, target, output, notes)
