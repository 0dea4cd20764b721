"""Cluster commands: up, down, launch, run, status, exec, ssh, check, gc.

`run` and `launch` parse, pick the job's supervision (provision/job/managed/modes.py) and hand
both to provision/job/lifecycle.start: which flags contradict which mode is the supervision's
own check, made before anything is created."""

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from provision.cli.app import app, guard, note_skipped, with_options
from provision.cli.options import (
    CLUSTER_OPTIONS,
    GC_OPTIONS,
    JOB_OPTIONS,
    SCRIPT_HELP,
    UP_OPTIONS,
    cluster_spec,
    confirmer,
    job_spec,
    planned_only,
    script_and_args,
    to_nested,
)

if TYPE_CHECKING:
    from provision.model.inventory import Inventory


@contextlib.contextmanager
def _progress() -> Iterator[Any]:
    """An inventory store that shows per-node progress while nodes are created/bootstrapped."""
    from provision.cluster.progress import NodeProgress, ReportingStore

    progress = NodeProgress()
    try:
        yield ReportingStore(progress)
    finally:
        progress.close()


# --------------------------------------------------------------------------------------------
@app.command()
@guard
@with_options(UP_OPTIONS, "opts")
def up(
    no_bootstrap: Annotated[bool, typer.Option("--no-bootstrap", help="create the nodes only; skip SSH set-up")] = False,
    opts: dict[str, Any] = {},  # noqa: B006 - filled by _with_options
) -> None:
    """Create a cluster and prepare its nodes (SSH, hostfile, workdir)."""
    from provision.cluster import pipeline

    spec, _ = cluster_spec(opts)
    with _progress() as store:
        if spec.store:  # refused before anything is made (issue 18)
            from provision.job.managed.checks import check_store

            check_store(spec.provider, spec.store)
        inv = pipeline.up(spec, confirm=confirmer(opts), bootstrap=not no_bootstrap, store=store)
    if inv is not None:
        typer.echo(f"cluster {inv.name!r} is up: {len(inv.nodes)} node(s)", err=True)
        typer.echo(inv.name)


@app.command()
@guard
def down(name: Annotated[str, typer.Argument(help="cluster name")]) -> None:
    """Delete every resource of a cluster (idempotent; works from the inventory alone)."""
    from provision.job.managed import stopping
    from provision.model.errors import InventoryUnreadableError
    from provision.model.inventory import InventoryStore

    store = InventoryStore()
    if not store.exists(name):
        typer.echo(f"no cluster named {name!r}: nothing to remove", err=True)
        return
    try:
        stopping.down(name, store=store)
    except InventoryUnreadableError as exc:  # nothing deleted: say what can still be done
        raise InventoryUnreadableError(
            f"cannot remove cluster {name!r}: {exc.message}. `down` deletes exactly the "
            "resources the inventory recorded, so without it nothing was deleted (its "
            "nodes may still be running and billed)", hint=exc.hint, path=exc.path,
            cluster=name, provider=exc.provider) from None


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def _report(started: Any, opts: dict[str, Any]) -> None:
    """What `run`/`launch` end with: a detached job's id on stdout, else the exit code (a
    declined plan: planned_only's)."""
    if started.declined:
        raise typer.Exit(planned_only(opts))
    if started.job_id is not None:
        typer.echo(started.job_id)
        return
    raise typer.Exit(started.code)


# launch NAME [options] [--] SCRIPT ARGS: options follow NAME; the script's words follow it
# (provision.cli.command: a typo before the script is refused, not taken for the script).
@app.command()
@guard
@with_options(JOB_OPTIONS, "jopts")
def launch(
    name: Annotated[str, typer.Argument(help="cluster name")],
    script: Annotated[str, typer.Argument(help=SCRIPT_HELP)],
    args: Annotated[list[str] | None, typer.Argument(help="script arguments")] = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return once the job runs; prints its id (see `jobs`, `logs`)")] = False,
    jopts: dict[str, Any] = {},  # noqa: B006
) -> None:
    """Start SCRIPT on every node of a cluster (torchrun by default).

    Options go before SCRIPT: `launch NAME --nproc-per-node 2 train.py --lr 3e-4` (--lr is
    the script's)."""
    from provision.cli.managed import adopt, managed_url
    from provision.job import lifecycle
    from provision.job.managed.modes import supervision

    job = job_spec(*script_and_args(script, args), jopts, {})
    adopt(name)  # a managed cluster's controller may have replaced nodes (issue 18)
    mode = supervision(detach=detach, store=managed_url(name, None))
    _report(lifecycle.start(name, job, mode, log=_echo), {})


@app.command()
@guard
@with_options(CLUSTER_OPTIONS + JOB_OPTIONS, "opts")
def run(
    script: Annotated[str, typer.Argument(help=SCRIPT_HELP)],
    args: Annotated[list[str] | None, typer.Argument(help="script arguments")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="leave the cluster running afterwards")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return once the job runs; the nodes stop themselves after it")] = False,
    idle_minutes: Annotated[float, typer.Option("--idle-minutes", help="with --detach: minutes the nodes wait after the job before stopping (time for `logs` to copy the logs)")] = 1.0,
    opts: dict[str, Any] = {},  # noqa: B006
) -> None:
    """up + launch + fetch outputs + down, with teardown in every case (unless --keep).

    Options go before SCRIPT: `run --nodes 2 --keep train.py --steps 20` (--steps is the
    script's). A dry run prints the plan and exits 0."""
    from provision.cluster.pipeline import NewCluster
    from provision.job import lifecycle
    from provision.job.managed.modes import supervision
    from provision.model.timeline import process_started_at

    spec, file_values = cluster_spec(opts)
    job = job_spec(*script_and_args(script, args), opts, file_values)
    mode = supervision(detach=detach, store=spec.store, idle_minutes=idle_minutes)
    with _progress() as store:
        # the run's clock (status --timeline, the ledger) starts with this process
        started = lifecycle.start(NewCluster(spec, confirmer(opts), keep=keep,
                                             started_at=process_started_at()), job, mode,
                                  store=store, log=_echo)
    _report(started, opts)


@app.command()
@guard
def status(
    name: Annotated[str | None, typer.Argument(help="one cluster (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    timeline: Annotated[bool, typer.Option(
        "--timeline", help="where each bring-up's time went (up, run, launch, recovery), "
        "phase by phase")] = False,
) -> None:
    """List clusters known on this machine."""
    from provision.cli.managed import adopt
    from provision.model.inventory import InventoryStore
    from provision.operations.status import status_rows, status_text

    store = InventoryStore()
    store.clean_stale_locks()
    invs, unreadable = ([store.load(name)], []) if name else store.scan()
    note_skipped(unreadable)
    # a managed cluster's controller may have replaced nodes (issue 18): only those ask
    invs = [store.load(inv.name) if inv.controller is not None and adopt(inv.name) else inv
            for inv in invs]
    if timeline:
        _echo_timelines(invs, as_json)
        return
    rows = status_rows(invs)
    gates = {inv.name: inv.fabric_gate for inv in invs}  # the fabric gate's last result
    if as_json:
        import json

        for r in rows:
            gate = gates.get(r["name"])
            r["fabric_gate"] = gate.model_dump(mode="json") if gate else None
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(status_text(rows, {name: f"fabric gate: {gate.summary()}"
                                  for name, gate in gates.items() if gate}))


def _echo_timelines(invs: "list[Inventory]", as_json: bool) -> None:
    """`status --timeline`: each cluster's bring-up timelines (provision/model/timeline.py)."""
    from provision.operations.status import timeline_rows, timeline_text

    if as_json:
        import json

        typer.echo(json.dumps({inv.name: timeline_rows(inv) for inv in invs}, indent=2))
    else:
        typer.echo("\n".join(timeline_text(inv) for inv in invs) or "no clusters")


@app.command(
    "exec", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True}
)
@guard
def exec_(
    name: Annotated[str, typer.Argument(help="cluster name")],
    command: Annotated[list[str], typer.Argument(help="command to run on every node")],
) -> None:
    """Run a command on all nodes in parallel; per-node output and exit codes."""
    from provision.cli.managed import load_adopted
    from provision.nodes import CommandResult, NodeGroup

    inv = load_adopted(name)  # a managed cluster's controller may have replaced nodes
    words = command[1:] if command and command[0] == "--" else command
    if not words:
        from provision.model.errors import UserInputError

        raise UserInputError("no command given", hint=f"mgpu-cloud exec {name} -- hostname")
    with NodeGroup(inv) as group:
        results = group.run(" ".join(words))
    worst = 0
    for node, r in results.items():
        # a node that cannot be reached is a result too: exit 255, like ssh
        res = r.value if r.value is not None else CommandResult(255, "", r.why())
        typer.echo(f"--- {node} (exit {res.exit_code}) ---")
        if res.stdout:
            typer.echo(res.stdout.rstrip("\n"))
        if res.stderr:
            typer.echo(res.stderr.rstrip("\n"), err=True)
        worst = worst or res.exit_code
    raise typer.Exit(worst)


@app.command(context_settings={"ignore_unknown_options": True})
@guard
def ssh(
    name: Annotated[str, typer.Argument(help="cluster name")],
    node: Annotated[int, typer.Option("--node", help="node rank")] = 0,
    command: Annotated[list[str] | None, typer.Argument(help="ssh options (e.g. -L 6006:localhost:6006), then an optional command")] = None,
) -> None:
    """Open an SSH session on one node (host key pinned); extra ssh options pass through."""
    from provision.cli.managed import load_adopted
    from provision.nodes.sshconfig import ssh_command
    from provision.nodes.sshconn import ssh_argv

    inv = load_adopted(name)  # a managed cluster's controller may have replaced nodes
    argv = ssh_command(ssh_argv(inv, node, []), command or [])
    os.execvp(argv[0], argv)


# The preflight columns that go under each node's row when the table is too wide: master
# port, disk free, topology, cuda, nccl, driver (node, gpus and torch stay in the table).
_CHECK_SPILL = (8, 7, 6, 4, 5, 2)


@app.command()
@guard
def check(
    name: Annotated[str, typer.Argument(help="cluster name")],
    bandwidth: Annotated[bool, typer.Option("--bandwidth", help="also run an all-reduce benchmark")] = False,
    max_bytes: Annotated[str, typer.Option("--max-bytes", help="largest all-reduce size")] = "1G",
    min_bytes: Annotated[str, typer.Option("--min-bytes", help="smallest all-reduce size")] = "1M",
    interconnect: Annotated[str | None, typer.Option("--interconnect", help="nvlink3|nvlink4|pcie4|efa-p4d|efa-p5|ib-hdr|ib-ndr|eth-10|eth-25|eth-100")] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", help="GPUs each node should have")] = None,
    fabric: Annotated[bool, typer.Option("--fabric", help="run the fabric gate now (as `launch --fabric-check on` does) and keep its result")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Compare every node's GPUs, driver, torch/NCCL versions and ports; optionally bandwidth.
    Shows the fabric gate's last result (--fabric: runs it now)."""
    from provision.job.programs import run_allreduce
    from provision.model.inventory import InventoryStore
    from provision.nodes import checks as judge
    from provision.nodes.preflight import gather_preflights

    inv = InventoryStore().load(name)
    reports = gather_preflights(inv)
    findings = judge.compare_preflights(reports, gpus_per_node)
    out: dict[str, Any] = {"preflight": reports, "findings": [f.__dict__ for f in findings]}
    summary = None
    if bandwidth:
        code, records = run_allreduce(inv, min_bytes=min_bytes, max_bytes=max_bytes,
                                      log=lambda m: typer.echo(m, err=True))
        kind = interconnect or judge.guess_interconnect(next(iter(reports.values())), len(inv.nodes)) or "unknown"
        summary = judge.summarize_bandwidth(records, kind)
        out["bandwidth"] = {"records": records, "interconnect": kind, "verdict": summary.verdict,
                            "peak_busbw_gbps": summary.peak_busbw_gbps}
        findings = [*findings, *summary.findings]
        if code != 0:
            findings.append(judge.Finding("error", "bandwidth", f"all-reduce exited {code}"))
    # the fabric gate: its last result, or a new one with --fabric
    gate = inv.fabric_gate
    if fabric:
        from provision.job.gate.separate import check_fabric

        gate = check_fabric(name, log=lambda m: typer.echo(m, err=True))
        if gate.verdict == "fail":
            findings.append(judge.Finding("error", "fabric-gate", "; ".join(gate.problems),
                                          tuple(n.node for n in gate.nodes if n.verdict != "ok"),
                                          gate.fixes[0] if gate.fixes else None))
    if gate is not None:
        out["fabric_gate"] = gate.model_dump(mode="json")
    if as_json:
        import json

        typer.echo(json.dumps(out, indent=2, default=str))
    else:
        from provision.cli.tables import fit_lines, fit_table

        # plain tables that fit the terminal: versions are never cut, long notes wrap
        tables = [fit_table(judge.preflight_rows(reports), spill=_CHECK_SPILL)]
        if summary:
            tables.append(fit_table(judge.bandwidth_rows(out["bandwidth"]["records"]),
                                    right=set(range(5))))
        tables.append(fit_table(judge.render_findings_table(findings)))
        typer.echo("\n\n".join("\n".join(lines) for lines in tables))
        if summary:
            typer.echo(fit_lines(f"peak busbw {summary.peak_busbw_gbps:.2f} GB/s on "
                                 f"{summary.interconnect}: {summary.verdict}"))
        if gate is not None:
            from provision.job.gate.judge import render_table

            when = "now" if fabric else f"last run {gate.checked_at}"
            typer.echo(fit_lines(f"{render_table(gate)}\n  ({when}; `check {name} --fabric` "
                                 "runs it again)"))
    raise typer.Exit(1 if any(f.severity == "error" for f in findings) else 0)


@app.command()
@guard
@with_options(GC_OPTIONS, "scope")
def gc(
    provider: Annotated[str, typer.Option("--provider", "-p", help="the provider to search")] = "docker",
    delete: Annotated[bool, typer.Option("--delete", help="delete what is found")] = False,
    scope: dict[str, Any] = {},  # noqa: B006 - filled by with_options
) -> None:
    """List (and with --delete remove) tagged resources that no inventory knows."""
    from provision.cluster.providers import get_provider
    from provision.model.inventory import InventoryStore
    from provision.model.spec import build_cluster_spec

    cli = {"provider": provider, "name": "gc-scope",
           **to_nested(scope, GC_OPTIONS, provider)}
    spec = build_cluster_spec({}, cli)
    prov = get_provider(provider)
    found = prov.orphans(spec, set(InventoryStore().names()))
    for r in found:
        where = r.zone or r.region or ""
        typer.echo(f"{r.kind}\t{r.id}\t{r.name or ''}\t{where}")
    typer.echo(f"{len(found)} orphaned resource(s)", err=True)
    if delete and found:
        prov.delete_orphans(spec, found)
        typer.echo(f"deleted {len(found)} resource(s)", err=True)
