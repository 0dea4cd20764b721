"""`mgpu-cloud image ...`: the docker provider's own commands (its node image).

Imported when the CLI starts (it lists every provider's commands): typer only at the top.
Plain typer: the CLI layer adds its error handling when it mounts these (cli/app.py)."""

from typing import Annotated

import typer

image_app = typer.Typer(help="Build the docker provider's node image.", no_args_is_help=True)


@image_app.command("base")
def image_base(
    tag: Annotated[str, typer.Option("--tag", help="tag of the base image")] = "mgpu-cloud/base:bookworm",
) -> None:
    """Build a Debian base image locally with debootstrap (for hosts with no registry)."""
    from provision.cluster.providers.docker.images import build_base_image

    typer.echo(build_base_image(tag, log=lambda m: typer.echo(m, err=True)))


@image_app.command("build")
def image_build(
    base_image: Annotated[str | None, typer.Option("--base-image")] = None,
) -> None:
    """Build (or find cached) the node image from the top-level Dockerfile; prints its tag."""
    from provision.cluster.providers.docker.images import ensure_node_image
    from provision.cluster.providers.docker.options import DockerOptions

    opts = DockerOptions() if base_image is None else DockerOptions(base_image=base_image)
    typer.echo(ensure_node_image(opts, log=lambda m: typer.echo(m, err=True)))
