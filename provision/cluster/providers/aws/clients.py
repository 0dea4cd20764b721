"""boto3 sessions and clients. Credentials come only from boto3's normal chain (env, profile,
SSO, instance role...); nothing here reads, copies or writes them.

`add_client_hook(fn)` is a documented seam: fn(client) runs on every client this provider
makes (tests attach a request recorder, fault injectors and the placement-group fake; the
benchmark attaches a call counter).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from provision.model.errors import ProviderUnavailableError, UserInputError

ClientHook = Callable[[Any], None]
_HOOKS: list[ClientHook] = []


def add_client_hook(hook: ClientHook) -> Callable[[], None]:
    """Run `hook(client)` on every client made from now on; returns a function removing it."""
    _HOOKS.append(hook)

    def remove() -> None:
        if hook in _HOOKS:
            _HOOKS.remove(hook)

    return remove


@cache
def _shared_loader() -> Any:
    from botocore.loaders import create_loader

    return create_loader()


def new_session() -> Any:
    """A fresh boto3 session (fresh credential/region resolution) that shares one botocore
    data loader, so service models are parsed once per process, not once per session."""
    import boto3
    import botocore.session

    core = botocore.session.Session()
    loader = _shared_loader()
    core.register_component("data_loader", loader)
    session = boto3.session.Session(botocore_session=core)
    paths = loader.search_paths  # boto3 appends its data dir on every session: keep one
    paths[:] = list(dict.fromkeys(paths))
    return session


def known_regions(session: Any) -> set[str]:
    regions: set[str] = set()
    for partition in session.get_available_partitions():
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    return regions


def resolve_region(session: Any, wanted: str | None) -> str:
    """--region, else the profile/env default; a clear error if none or unknown."""
    region = wanted or session.region_name
    if not region:
        raise UserInputError(
            "no AWS region given",
            hint="pass --region (e.g. --region us-east-1) or set AWS_DEFAULT_REGION",
        )
    if region not in known_regions(session):
        raise UserInputError(
            f"unknown AWS region {region!r}",
            hint="use a region name such as us-east-1, us-west-2 or eu-west-1",
        )
    return str(region)


def require_credentials(session: Any) -> None:
    if session.get_credentials() is None:
        raise ProviderUnavailableError(
            "no AWS credentials found",
            hint="configure them the usual way (aws configure, AWS_PROFILE, aws sso login, "
            "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); mgpu-cloud never stores them",
        )


def make_client(session: Any, service: str, region: str) -> Any:
    from botocore.config import Config

    # total_max_attempts=1: botocore would otherwise retry InsufficientInstanceCapacity (sent
    # as HTTP 500) in place; retry.py is the only retry layer.
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        user_agent_extra="mgpu-cloud",
    )
    client = session.client(service, region_name=region, config=config)
    for hook in list(_HOOKS):
        hook(client)
    return client
