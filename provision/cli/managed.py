"""Managed runs from the command line (issue 18): `attach`, and what the other commands ask of
a managed cluster (its store's URL, its controller's copy of the inventory). `jobs`, `logs`
and `cancel` read a managed cluster's store through the one job-record interface
(provision/cli/jobs.py)."""

from typing import Annotated, Any

import typer

from provision.cli.app import app, guard


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
@guard
def attach(
    name: Annotated[str, typer.Argument(help="cluster name")],
    store: Annotated[str, typer.Option("--store", help="the run's store URL (s3://, gs://, file://)")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Follow a managed cluster from this machine with only its store URL and credentials:
    lists its jobs; afterwards `jobs`, `logs` and `cancel NAME` use that store."""
    from provision.cli.jobs import print_jobs
    from provision.job.managed.checks import check_writable
    from provision.job.managed.client import remember
    from provision.job.managed.storerecords import StoreRecords
    from remote.store import parse_url

    try:
        url = parse_url(store)
    except ValueError as exc:
        from provision.model.errors import UserInputError

        raise UserInputError(f"--store: {exc}") from None
    check_writable(url)  # `cancel` writes there
    remember(name, str(url))
    print_jobs(StoreRecords(str(url), name, note=_err), as_json)


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
