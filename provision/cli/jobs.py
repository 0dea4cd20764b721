"""Job commands: jobs, logs, cancel. They read a cluster's job records through ONE interface
(provision/job/jobrecords.JobRecords): this machine's, or a managed cluster's store
(provision/job/managed/storerecords.records_for picks), without asking which.

Like the rest of the CLI, only typer is imported here at start-up; everything else is
imported inside the commands (`mgpu-cloud --help` must stay fast).
"""

import sys
from typing import Annotated, Any

import typer

from provision.cli.app import app, guard

STORE_HELP = "a managed run's store URL (default: the cluster's, or the one `attach` saved)"


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def _records(name: str, store_url: str | None) -> Any:
    from provision.job.managed.storerecords import records_for

    return records_for(name, store_url, note=_err)


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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def print_jobs(records: Any, as_json: bool) -> None:
    """`jobs`' output (and `attach`'s): a table that fits the terminal, or the records."""
    from provision.cli.tables import fit_table
    from provision.operations.status import when

    summaries = records.list()
    if as_json:
        import json

        typer.echo(json.dumps([s.data for s in summaries], indent=2))
        return
    if not summaries:
        typer.echo(records.empty_text)
        return
    rows = [("ID", "STATE", "STARTED", "DURATION", "RESTARTS", "EXIT", "GOODPUT", "COMMAND")]
    rows += [(s.id, s.state + (f" ({s.note})" if s.note else ""), when(s.started_at),
              _duration(s.duration_s()), "-" if s.restarts is None else str(s.restarts),
              s.exit_text(), "-" if s.goodput is None else f"{100 * s.goodput:.0f}%",
              s.command) for s in summaries]
    typer.echo("\n".join(fit_table(rows, right={0, 4, 6}, spill=(2,))))  # STARTED may move


# --------------------------------------------------------------------------------------------
@app.command()
@guard
def jobs(
    name: Annotated[str | None, typer.Argument(help="cluster name (also one that was removed); default: the only cluster")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    store_url: Annotated[str | None, typer.Option("--store", help=STORE_HELP)] = None,
) -> None:
    """List a cluster's jobs: id, state, start, duration, restarts, exit code(s), command."""
    name = name or _the_only_cluster()
    print_jobs(_records(name, store_url), as_json)


@app.command()
@guard
def logs(
    name: Annotated[str, typer.Argument(help="cluster name (also one that was removed)")],
    job_id: Annotated[str | None, typer.Argument(metavar="[JOB]", help="job id (default: the latest)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep streaming until the job ends; exit with its code")] = False,
    node: Annotated[int | None, typer.Option("--node", help="only this node rank")] = None,
    store_url: Annotated[str | None, typer.Option("--store", help=STORE_HELP)] = None,
) -> None:
    """Print a job's output, `[node-R]`-prefixed, from its start (while it runs, or after)."""
    records = _records(name, store_url)
    jid = records.resolve(job_id)
    try:
        shown = records.logs(jid, sys.stdout, follow=follow, node=node)
    except KeyboardInterrupt:
        _err(records.after_interrupt(jid))
        raise typer.Exit(130) from None
    if not shown.complete:
        raise typer.Exit(1)
    if not follow:
        return
    job = shown.job
    if job is None or job.exit_code is None:
        _err(f"job {jid}: {job.state if job is not None else 'unknown'}")
        raise typer.Exit(255)
    _err(f"job {jid} {job.state} (exit code {job.exit_code})")
    raise typer.Exit(job.exit_code)


@app.command()
@guard
def cancel(
    name: Annotated[str, typer.Argument(help="cluster name")],
    job_id: Annotated[str | None, typer.Argument(metavar="[JOB]", help="job id (default: the latest)")] = None,
    grace: Annotated[float, typer.Option("--grace", help="seconds between TERM and KILL")] = 10.0,
    store_url: Annotated[str | None, typer.Option("--store", help=STORE_HELP)] = None,
) -> None:
    """Stop a job on every node (TERM to every rank's process group, KILL after --grace)."""
    _, said = _records(name, store_url).cancel(job_id, grace=grace)
    typer.echo(said)
