"""Managed runs from the command line (issue 18): `attach`, and the store-backed paths of
`jobs` / `logs` / `cancel` (day2.py hands over to these when the cluster has a store)."""

import sys
from typing import Annotated, Any

import typer

from provision.cli.app import app, guard


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


def jobs_from_store(url: str, name: str, as_json: bool) -> None:
    from provision.cli.tables import fit_table
    from provision.job.managed.client import all_jobs, forget_if_torn_down
    from provision.operations.status import when

    recs = all_jobs(url, name)
    if forget_if_torn_down(name, recs):
        _err(f"cluster {name!r} was removed by its controller; its inventory here is dropped")
    if as_json:
        import json

        typer.echo(json.dumps(recs, indent=2))
        return
    if not recs:
        typer.echo(f"no managed jobs of {name!r} in {url}")
        return
    rows = [("ID", "STATE", "STARTED", "RESTARTS", "EXIT", "COMMAND")]
    rows += [(r["id"], r["state"] + (" (torn down)" if r["torn_down"] else ""),
              when(r["started_at"]) if r["started_at"] else "-", str(r["restarts"]),
              "-" if r["exit_code"] is None else str(r["exit_code"]), r["command"])
             for r in recs]
    typer.echo("\n".join(fit_table(rows, right={0, 3})))


def logs_from_store(url: str, name: str, job_id: str | None, follow: bool,
                    node: int | None) -> None:
    from provision.job.managed.client import latest_id, print_logs

    jid = latest_id(url, name, job_id)
    try:
        final = print_logs(url, name, jid, sys.stdout, follow=follow, node=node)
    except KeyboardInterrupt:
        _err(f"stopped following; job {jid} goes on (cancel it: mgpu-cloud cancel {name} {jid})")
        raise typer.Exit(130) from None
    if follow:
        code = final.exit_code if final is not None and final.exit_code is not None else 255
        _err(f"job {jid} {final.state if final else 'unknown'} (exit code {code})")
        raise typer.Exit(code)


def cancel_in_store(url: str, name: str, job_id: str | None) -> None:
    from provision.job.managed.client import cancel, latest_id

    jid = latest_id(url, name, job_id)
    cancel(url, name, jid)
    typer.echo(f"job {jid}: cancel requested; its controller stops it within seconds "
               f"(mgpu-cloud logs {name} {jid} --follow)")


@app.command()
@guard
def attach(
    name: Annotated[str, typer.Argument(help="cluster name")],
    store: Annotated[str, typer.Option("--store", help="the run's store URL (s3://, gs://, file://)")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Follow a managed cluster from this machine with only its store URL and credentials:
    lists its jobs; afterwards `jobs`, `logs` and `cancel NAME` use that store."""
    from provision.job.managed.checks import check_writable
    from provision.job.managed.client import remember
    from remote.store import parse_url

    try:
        url = parse_url(store)
    except ValueError as exc:
        from provision.model.errors import UserInputError

        raise UserInputError(f"--store: {exc}") from None
    check_writable(url)  # `cancel` writes there
    remember(name, str(url))
    jobs_from_store(str(url), name, as_json)


def managed_url(name: str, given: str | None) -> Any:
    """The store to use for `name`, or None (not a managed cluster: the classic paths)."""
    from provision.job.managed.client import store_url_for

    return store_url_for(name, given)


def load_adopted(name: str) -> Any:
    """The inventory of `name`, read once; a managed cluster's (one with a controller) after
    `adopt` took its controller's copy (exec, ssh: the plain clusters pay nothing for it)."""
    from provision.model.inventory import InventoryStore

    store = InventoryStore()
    inv = store.load(name)
    if inv.controller is not None and adopt(name):
        inv = store.load(name)
    return inv


def adopt(name: str) -> bool:
    """Take the controller's copy of a managed cluster's inventory when it replaced nodes
    meanwhile (status, launch, exec, ssh; `down` does it itself). True if it changed here."""
    from provision.job.managed.client import adopt_from_store
    from provision.model.errors import MgpuError

    try:
        changed = adopt_from_store(name, warn=_err)
    except MgpuError:
        return False  # a damaged or missing inventory: the command itself reports it
    if changed:
        _err(f"cluster {name!r}: nodes its controller replaced are now known here")
    return changed
