"""The Docker engine connection and the one boundary where docker SDK errors are translated."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from functools import cache
from typing import Any

from provision.model.errors import MgpuError, ProviderUnavailableError, ProvisionError


def _skip_sdk_ssh_transport() -> None:
    """The SDK imports paramiko (~0.15 s) at import time, only for ssh:// engines, and treats
    paramiko as optional (a None entry in sys.modules makes that import raise ImportError,
    as if paramiko were missing). For other engines skip it: Fabric imports paramiko later,
    on a background thread while containers start, instead of before the first engine call.
    Runs when this module is imported, i.e. before any module of this package imports the SDK."""
    if "docker" not in sys.modules and not os.environ.get("DOCKER_HOST", "").startswith("ssh:"):
        sys.modules.setdefault("docker.transport.sshconn", None)  # type: ignore[arg-type]


_skip_sdk_ssh_transport()


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
