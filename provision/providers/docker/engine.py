"""The Docker engine connection and the one boundary where docker SDK errors are translated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from typing import Any

from provision.errors import MgpuError, ProviderUnavailableError, ProvisionError


@cache
def docker_client() -> Any:
    """A docker SDK client that has answered a ping; ProviderUnavailableError otherwise."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ProviderUnavailableError(
            f"the Docker engine is not reachable ({exc})",
            hint="start it (Debian, as root: apt-get install -y docker.io && dockerd &), "
            "or set DOCKER_HOST; `docker info` must answer",
        ) from None
    return client


@contextlib.contextmanager
def map_errors(action: str, error: type[MgpuError] = ProvisionError) -> Iterator[None]:
    """Translate docker SDK errors raised inside into `error`, naming the action."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.APIError as exc:
        raise error(f"{action} failed: {exc.explanation or exc}") from exc
    except (docker.errors.DockerException, requests.exceptions.ConnectionError) as exc:
        raise ProviderUnavailableError(f"{action} failed: Docker engine error: {exc}") from exc
