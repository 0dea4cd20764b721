"""`mgpu-cloud dashboard`: the local web dashboard (provision/operations/dashboard/). Imports nothing of
it until the command runs."""

from typing import Annotated

import typer

from provision.cli.app import app, guard


@app.command()
@guard
def dashboard(
    port: Annotated[int, typer.Option("--port", "-p", help="port to listen on (0: any free one)")] = 8765,
    host: Annotated[str, typer.Option("--host", help="address to listen on; on every address each request needs the printed token")] = "127.0.0.1",
    open_browser: Annotated[bool, typer.Option("--open", help="open it in the web browser (through a 0600 page: the token is on no command line)")] = False,
) -> None:
    """Web dashboard on 127.0.0.1: clusters, jobs, live logs, GPU and cost charts. Open the
    address it prints: its ?token= lets only you in (other users of this machine reach
    127.0.0.1 too)."""
    from provision.operations.dashboard.server import serve

    serve(host, port, open_browser=open_browser, say=lambda line: typer.echo(line))
