"""Day-2 commands: jobs, logs, cancel, ssh-config, monitor, cost, scale.

Like the rest of the CLI, only typer is imported here at start-up; everything else is
imported inside the commands (`mgpu-cloud --help` must stay fast).
"""

import sys
from typing import Annotated, Any

import typer

from provision.cli.app import app, guard, note_skipped, with_options
from provision.cli.options import (
    CLUSTER_OPTIONS,
    JOB_OPTIONS,
    cluster_spec,
    confirmer,
    job_spec,
    planned_only,
)


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


@app.command("ssh-config")
@guard
def ssh_config(
    name: Annotated[str, typer.Argument(help="cluster name")],
    install: Annotated[bool, typer.Option("--install", help="Include it from ~/.ssh/config (removed by `down`)")] = False,
) -> None:
    """Print an OpenSSH config for the cluster: `ssh NAME`, `ssh NAME-node-R`, scp, rsync."""
    from provision.model.inventory import InventoryStore
    from provision.nodes.sshconfig import config_text
    from provision.nodes.sshconfig import install as install_config

    store = InventoryStore()
    inv = store.load(name)
    if install:
        path = install_config(inv, store)
        _err(f"wrote {path}; ~/.ssh/config includes it: ssh {name}, ssh {name}-node-1, "
             f"scp FILE {name}:, pdsh -R ssh -w {name}-node-[0-{len(inv.nodes) - 1}] hostname")
        return
    typer.echo(config_text(inv))


@app.command()
@guard
def monitor(
    name: Annotated[str, typer.Argument(help="cluster name")],
    interval: Annotated[float, typer.Option("--interval", help="seconds between samples")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="one sample of every node, then exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="with --once: machine-readable output")] = False,
) -> None:
    """Live per-node GPU utilisation, memory, power, temperature (CPU/memory/load without GPUs)."""
    import time

    from provision.model.inventory import InventoryStore
    from provision.nodes import NodeGroup
    from provision.operations.monitor import HEADER, LiveMonitor, shared_note, snapshot, table_rows
    from provision.operations.status import text_table

    inv = InventoryStore().load(name)
    note = shared_note(inv)  # e.g. docker: the host's numbers on every node, said so
    if once:
        with NodeGroup(inv) as group:
            samples = snapshot(group)
        if as_json:
            import json

            typer.echo(json.dumps({"cluster": name, "nodes": samples, "note": note or None},
                                  indent=2))
        else:
            typer.echo("\n".join(text_table([HEADER, *table_rows(samples)])))
            if note:
                typer.echo(f"note: {note}")
        raise typer.Exit(1 if any("error" in s for s in samples) else 0)
    live = LiveMonitor(inv, interval)
    live.start()
    try:
        if sys.stdout.isatty():
            from rich.live import Live
            from rich.table import Table

            def render() -> Table:
                table = Table(*HEADER, title=f"{name} (every {interval:g} s; Ctrl-C to stop)",
                              caption=f"note: {note}" if note else None)
                for row in table_rows(live.latest()):
                    table.add_row(*row)
                return table

            with Live(render(), refresh_per_second=4) as screen:
                while True:
                    time.sleep(interval / 2)
                    screen.update(render())
        else:
            while True:
                time.sleep(interval)
                lines = text_table([HEADER, *table_rows(live.latest())])
                typer.echo("\n".join(lines + ([f"note: {note}"] if note else [])) + "\n")
    except KeyboardInterrupt:
        pass
    finally:
        live.close()


@app.command()
@guard
def cost(
    name: Annotated[str | None, typer.Argument(help="one cluster name (default: all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """What every cluster made here cost (also removed ones), at the catalog price."""
    from provision.cli.tables import fit_lines, fit_table
    from provision.cluster.cost import report
    from provision.model.inventory import InventoryStore
    from provision.operations.status import when

    rep = report(name)
    note_skipped([exc for exc in InventoryStore().scan()[1]
                  if name in (None, exc.cluster)])
    if as_json:
        import json

        typer.echo(json.dumps(rep, indent=2))
        return
    if not rep["clusters"]:
        typer.echo("no clusters recorded yet")
        return
    rows = [("CLUSTER", "PROVIDER", "TYPE", "NODES", "CREATED", "REMOVED", "NODE-H", "$")]
    for r in rep["clusters"]:
        rows.append((r["cluster"], r["provider"] or "-",
                     (r["type"] or "-") + (" (spot)" if r["spot"] else ""), str(r["nodes"]),
                     when(r["created"]), when(r["removed"]) if r["removed"] else "running",
                     f"{r['node_hours']:.2f}", f"{r['cost_usd']:.2f}"))
    rows.append(("total", "", "", "", "", "", "", f"{rep['total_usd']:.2f}"))
    # too wide for the terminal: REMOVED, then CREATED, TYPE, PROVIDER go under each row
    typer.echo("\n".join(fit_table(rows, right={3, 6, 7}, spill=(5, 4, 2, 1))))
    typer.echo(fit_lines("catalog prices x time from up to down; the bill also has disks, "
                         "traffic and rounding"), err=True)


_SCALE_CLUSTER_OPTIONS = [o for o in CLUSTER_OPTIONS if o.name != "nodes"]


@app.command()
@guard
@with_options(_SCALE_CLUSTER_OPTIONS + JOB_OPTIONS, "opts")
def scale(
    script: Annotated[str, typer.Argument(help="training script (prints samples/s=X, or is timed); the tool's options go before it")],
    args: Annotated[list[str] | None, typer.Argument(help="script arguments")] = None,
    sizes: Annotated[str, typer.Option("--nodes", "-n", help="cluster sizes to compare, e.g. 1,2,4")] = "1,2",
    cluster: Annotated[str | None, typer.Option("--cluster", help="use this existing cluster (no up/down)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    plot_path: Annotated[str | None, typer.Option("--plot", help="also write a PNG chart here (needs matplotlib)")] = None,
    opts: dict[str, Any] = {},  # noqa: B006 - filled by with_options
) -> None:
    """Run the same job on 1..N nodes: throughput, speedup, efficiency and $ per job.

    Options go before SCRIPT: `scale --nodes 1,2,4 train.py --steps 50`."""
    from provision.cli.options import script_and_args
    from provision.operations import scale as scaling
    from provision.operations.status import text_table

    counts = scaling.parse_sizes(sizes)
    if plot_path:
        scaling.require_matplotlib()  # before any node is made, not after the runs
    spec = None
    file_values: dict[str, Any] = {}
    if cluster is None:
        spec, file_values = cluster_spec({**opts, "nodes": counts[-1]})
    job = job_spec(*script_and_args(script, args), opts, file_values)
    result = scaling.scale(job, counts, spec=spec, cluster=cluster, confirm=confirmer(opts),
                           log=_err)
    if result is None:
        raise typer.Exit(planned_only(opts))
    if plot_path:
        scaling.plot(result, plot_path)
        _err(f"wrote {plot_path}")
    if as_json:
        import json

        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo("\n".join(text_table(scaling.table(result), right=set(range(7)))))
    raise typer.Exit(1 if any(r["exit_code"] for r in result["rows"]) else 0)
