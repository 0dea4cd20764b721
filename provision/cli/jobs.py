"""Job commands: jobs, logs, cancel (a cluster's own jobs; a managed cluster's come from its
store, provision/cli/managed.py).

Like the rest of the CLI, only typer is imported here at start-up; everything else is
imported inside the commands (`mgpu-cloud --help` must stay fast).
"""

import sys
from typing import Annotated, Any

import typer

from provision.cli.app import app, guard, note_skipped


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def _inventory_or_none(name: str) -> Any:
    from provision.model.errors import InventoryUnreadableError
    from provision.model.inventory import InventoryStore

    store = InventoryStore()
    try:
        return store.load(name) if store.exists(name) else None
    except InventoryUnreadableError as exc:  # the job records are kept apart: still shown
        note_skipped([exc], "unchecked: its jobs are shown as last recorded, not asked of its nodes")
        return None


def _the_only_cluster() -> str:
    """The cluster a command means when none is named: the only one there is."""
    from provision.model.errors import UserInputError
    from provision.model.inventory import InventoryStore

    names = InventoryStore().names()
    if len(names) == 1:
        return names[0]
    if not names:
        raise UserInputError("no cluster on this machine", hint="create one: mgpu-cloud up")
    raise UserInputError(f"which cluster? there are {len(names)}: {', '.join(names)}",
                         hint=f"name one: mgpu-cloud jobs {names[0]}")


def _record(name: str, job_id: str | None) -> Any:
    from provision.model.jobstore import JobStore

    store = JobStore()
    return store.load(name, job_id) if job_id else store.latest(name)


def _exit_text(rec: Any) -> str:
    codes = [n.exit_code for n in rec.nodes.values()]
    if all(c is None for c in codes):
        return "-"
    return ",".join("-" if c is None else str(c) for c in codes)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# --------------------------------------------------------------------------------------------
@app.command()
@guard
def jobs(
    name: Annotated[str | None, typer.Argument(help="cluster name (also one that was removed); default: the only cluster")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    store_url: Annotated[str | None, typer.Option("--store", help="a managed run's store URL (default: the cluster's, or the one `attach` saved)")] = None,
) -> None:
    """List a cluster's jobs: id, state, start, duration, exit code per node, command."""
    from provision.cli.managed import jobs_from_store, managed_url
    from provision.cli.tables import fit_table
    from provision.job.jobs import refresh
    from provision.model.jobstore import JobStore
    from provision.nodes import NodeGroup
    from provision.operations.status import when

    name = name or _the_only_cluster()
    url = managed_url(name, store_url)
    if url:  # a managed cluster: its store has the records (issue 18)
        jobs_from_store(url, name, as_json)
        return

    store = JobStore()
    recs = store.all(name)
    inv = _inventory_or_none(name)
    if inv is None and not recs:  # neither a cluster nor one that ran jobs here
        from provision.model.inventory import InventoryStore

        InventoryStore().load(name)  # raises "no cluster named ... (known clusters: ...)"
    if inv is not None and inv.status == "ready":
        with NodeGroup(inv) as group:
            recs = refresh(inv, recs, group, store=store)
    if as_json:
        import json

        typer.echo(json.dumps([{**r.model_dump(mode="json"), "exit_code": r.exit_code,
                                "duration_s": r.duration_s()} for r in recs], indent=2))
        return
    if not recs:
        typer.echo(f"no jobs on {name!r} yet")
        return
    rows = [("ID", "STATE", "STARTED", "DURATION", "EXIT", "COMMAND")]
    rows += [(r.id, r.state + (" (detached)" if r.detached else ""), when(r.started_at),
              _duration(r.duration_s()), _exit_text(r), r.command) for r in recs]
    typer.echo("\n".join(fit_table(rows, right={0})))


@app.command()
@guard
def logs(
    name: Annotated[str, typer.Argument(help="cluster name (also one that was removed)")],
    job_id: Annotated[str | None, typer.Argument(metavar="[JOB]", help="job id (default: the latest)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep streaming until the job ends; exit with its code")] = False,
    node: Annotated[int | None, typer.Option("--node", help="only this node rank")] = None,
    store_url: Annotated[str | None, typer.Option("--store", help="a managed run's store URL (default: the cluster's, or the one `attach` saved)")] = None,
) -> None:
    """Print a job's output, `[node-R]`-prefixed, from its start (while it runs, or after)."""
    from provision.cli.managed import logs_from_store, managed_url

    url = managed_url(name, store_url)
    if url:  # a managed cluster: its store has the output (issue 18)
        logs_from_store(url, name, job_id, follow, node)
        return
    from provision.job.jobs import follow as follow_job
    from provision.job.jobs import print_saved_logs, refresh
    from provision.model.jobstore import is_current
    from provision.nodes import NodeGroup

    rec = _earlier_attempts(_record(name, job_id), node)  # one run's whole history
    names = list(rec.nodes)
    if node is not None:
        names = [n for n, nj in rec.nodes.items() if nj.rank == node]
        if not names:
            from provision.model.errors import UserInputError

            raise UserInputError(f"job {rec.id} did not run on node {node}; it ran on "
                                 + ", ".join(rec.nodes))
    inv = _inventory_or_none(name)
    live = inv is not None and is_current(rec, inv) and inv.status == "ready"
    if rec.logs_saved or not live:
        missing = print_saved_logs(rec, sys.stdout, names)
        if missing:
            from provision.model.errors import MgpuError

            raise MgpuError(f"the log of job {rec.id} on {', '.join(missing)} was not copied "
                            "before the cluster was removed")
        _finish(rec, follow)
        return
    with NodeGroup(inv) as group:
        refresh(inv, [rec], group)
        if rec.logs_saved:
            print_saved_logs(rec, sys.stdout, names)
        else:
            nodes = [n for n in group.nodes if n.name in names]
            try:
                followed = follow_job(rec, group, sys.stdout, nodes, wait=follow)
            except KeyboardInterrupt:
                _err(_after_ctrl_c(inv, rec, group, name))
                raise typer.Exit(130) from None
            for r in followed.values():
                if r.error is not None:
                    _err(f"{r.node.name}: could not read the log: {r.error}")
            if followed.failed and not follow:
                raise typer.Exit(1)
            if follow:
                refresh(inv, [rec], group)
    _finish(rec, follow)


def _after_ctrl_c(inv: Any, rec: Any, group: Any, name: str) -> str:
    """What a Ctrl-C on `logs` leaves behind, as the nodes tell it now (one short query; a
    second Ctrl-C stops that too)."""
    from provision.job.jobs import refresh

    try:
        refresh(inv, [rec], group)
    except Exception as exc:  # noqa: BLE001 - the user asked to stop: say what is known
        return f"stopped following job {rec.id}; its state is unknown ({exc})"
    if rec.final:
        code = "" if rec.exit_code is None else f", exit code {rec.exit_code}"
        return f"stopped following job {rec.id}; it had already finished: {rec.state}{code}"
    return (f"stopped following job {rec.id}; it goes on "
            f"(cancel it: mgpu-cloud cancel {name} {rec.id})")


def _earlier_attempts(rec: Any, node: int | None) -> Any:
    """For a run that restarted: print the attempts before its last one (kept copies), each
    under a header, and return the last attempt (printed by `logs` as any job is)."""
    from provision.job.jobs import print_saved_logs
    from provision.model.jobstore import JobStore

    chain = JobStore().history(rec)
    if len(chain) == 1:
        return rec
    for attempt in chain:
        ended = f": {attempt.failure}" if attempt.failure else f": {attempt.state}"
        typer.echo(f"=== job {attempt.id}, attempt {attempt.attempt} of {len(chain)}"
                   f"{ended if attempt is not chain[-1] else ''} ===")
        if attempt is chain[-1]:
            return attempt
        names = [n for n, nj in attempt.nodes.items() if node is None or nj.rank == node]
        for missing in print_saved_logs(attempt, sys.stdout, names):
            _err(f"job {attempt.id}: no copy of {missing}'s log was kept")
    return chain[-1]


def _finish(rec: Any, follow: bool) -> None:
    if not follow:
        return
    code = rec.exit_code
    if code is None:
        _err(f"job {rec.id}: {rec.state}")
        raise typer.Exit(255)
    _err(f"job {rec.id} {rec.state} (exit code {code})")
    raise typer.Exit(code)


@app.command()
@guard
def cancel(
    name: Annotated[str, typer.Argument(help="cluster name")],
    job_id: Annotated[str | None, typer.Argument(metavar="[JOB]", help="job id (default: the latest)")] = None,
    grace: Annotated[float, typer.Option("--grace", help="seconds between TERM and KILL")] = 10.0,
    store_url: Annotated[str | None, typer.Option("--store", help="a managed run's store URL (default: the cluster's, or the one `attach` saved)")] = None,
) -> None:
    """Stop a job on every node (TERM to every rank's process group, KILL after --grace)."""
    from provision.cli.managed import cancel_in_store, managed_url

    url = managed_url(name, store_url)
    if url:  # a managed cluster: its controller stops the job (issue 18)
        cancel_in_store(url, name, job_id)
        return
    from provision.job.jobs import cancel as cancel_job
    from provision.job.jobs import refresh
    from provision.model.errors import MgpuError
    from provision.model.inventory import InventoryStore
    from provision.model.jobstore import is_current
    from provision.nodes import NodeGroup

    inv = InventoryStore().load(name)
    rec = _record(name, job_id)
    if not is_current(rec, inv):
        raise MgpuError(f"job {rec.id} ran on an earlier cluster named {name!r}")
    with NodeGroup(inv) as group:
        refresh(inv, [rec], group)
        if rec.final:
            typer.echo(f"job {rec.id} has already ended: {rec.state}")
            return
        cancel_job(rec, group, grace=grace)
        refresh(inv, [rec], group)
    typer.echo(f"job {rec.id}: {rec.state}")
