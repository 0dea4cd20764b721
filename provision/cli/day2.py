"""Day-2 commands: ssh-config, monitor, cost, scale (jobs, logs, cancel: provision/cli/jobs.py).

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
    rows = [("CLUSTER", "PROVIDER", "TYPE", "NODES", "CREATED", "REMOVED", "NODE-H", "GOODPUT",
             "$")]
    for r in rep["clusters"]:
        rows.append((r["cluster"], r["provider"] or "-",
                     (r["type"] or "-") + (" (spot)" if r["spot"] else ""), str(r["nodes"]),
                     when(r["created"]), when(r["removed"]) if r["removed"] else "running",
                     f"{r['node_hours']:.2f}",
                     "-" if r["goodput"] is None else f"{100 * r['goodput']:.0f}%",
                     f"{r['cost_usd']:.2f}"))
    rows.append(("total", "", "", "", "", "", "", "", f"{rep['total_usd']:.2f}"))
    # too wide for the terminal: REMOVED, then CREATED, TYPE, PROVIDER go under each row
    typer.echo("\n".join(fit_table(rows, right={3, 6, 7, 8}, spill=(5, 4, 2, 1))))
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
