"""A thin EC2 wrapper: every call goes through retry.transient; paginated reads in one place."""

from __future__ import annotations

import hashlib
from typing import Any

from provision.cluster.providers.aws import retry
from provision.cluster.providers.aws.clients import make_client, new_session
from provision.cluster.providers.aws.errors import UnexpectedAnswer
from provision.model.inventory import CLUSTER_TAG

# RunInstances / CreateNatGateway / CreateRouteTable: "ClientToken ... Constraints: Maximum 64
# ASCII characters" (EC2 API Reference; botocore's EC2 model). A readable prefix + 40 hex chars.
CLIENT_TOKEN_MAX = 64


def client_token(*parts: str) -> str:
    """An idempotency token for one create attempt: the same parts give the same token, always
    45 ASCII characters whatever the cluster name."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]
    return f"mgpu-{digest}"


def tag_spec(resource_type: str, cluster: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": [{"Key": CLUSTER_TAG, "Value": cluster}]}]


def cluster_filter(cluster: str | None) -> dict[str, Any]:
    """Filter on the cluster tag: one cluster, or (None) any cluster."""
    if cluster is None:
        return {"Name": "tag-key", "Values": [CLUSTER_TAG]}
    return {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}


def cluster_of(tags: list[dict[str, str]] | None) -> str | None:
    for tag in tags or []:
        if tag.get("Key") == CLUSTER_TAG:
            return tag.get("Value")
    return None


class Ec2:
    """EC2 (and SSM) calls for one region."""

    def __init__(self, region: str, session: Any | None = None) -> None:
        self.region = region
        self.session = session or new_session()
        self.client = make_client(self.session, "ec2", region)
        self._ssm: Any | None = None

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """One call (transient errors retried); the whole answer. Use `get` when a field of
        the answer is read: an answer without it is an error, not an empty result."""
        result: dict[str, Any] = retry.transient(getattr(self.client, operation), **params)
        return result

    def get(self, operation: str, key: str, **params: Any) -> Any:
        """Field `key` of the answer. An answer without it (an HTML page parsed into nothing)
        raises UnexpectedAnswer, retried like other transient errors."""

        def once() -> Any:
            answer = getattr(self.client, operation)(**params)
            if key not in answer:
                raise UnexpectedAnswer(operation, key)
            return answer[key]

        return retry.transient(once)

    def pages(self, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
        """All items under `key` of a paginated read (restarted whole on a transient error).
        A page without `key` is an UnexpectedAnswer: teardown must never read garbage as
        'nothing left'."""

        def run() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = []
            for page in self.client.get_paginator(operation).paginate(**params):
                if key not in page:
                    raise UnexpectedAnswer(operation, key)
                items.extend(page[key])
            return items

        return retry.transient(run)

    def instances(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        reservations = self.pages(
            "describe_instances", "Reservations", Filters=filters,
            PaginationConfig={"PageSize": 1000},
        )
        return [i for r in reservations for i in r.get("Instances", [])]

    def ssm_parameter(self, name: str) -> str:
        if self._ssm is None:
            self._ssm = make_client(self.session, "ssm", self.region)
        ssm = self._ssm

        def once() -> str:
            answer = ssm.get_parameter(Name=name)
            value = (answer.get("Parameter") or {}).get("Value")
            if not value:
                raise UnexpectedAnswer("GetParameter", "Parameter.Value")
            return str(value)

        return retry.transient(once)
