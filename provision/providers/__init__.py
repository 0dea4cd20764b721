"""The Provider contract and a lazily-importing registry.

A provider module is imported only when a command needs it, so `mgpu-cloud --help` never
pays for boto3 or google-cloud-compute.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from provision.errors import ProviderUnavailableError, UserInputError
from provision.inventory import Inventory, InventoryStore, ResourceRecord
from provision.plan import Plan
from provision.spec import PROVIDERS, ClusterSpec


@runtime_checkable
class Provider(Protocol):
    name: str

    def plan(self, spec: ClusterSpec) -> Plan:
        """Validate `spec` against the provider (read-only calls at most) and describe what
        `create` would make and cost. Never writes. Raises UserInputError /
        ProviderUnavailableError for bad input, unreachable APIs or missing credentials."""
        ...

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        """Make the resources of `plan`, recording each in `inv` through `store.record` as soon
        as its id exists, then fill `inv.nodes`. All-or-nothing: on any failure it destroys what
        it made and raises ProvisionError naming the cause."""
        ...

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Delete every resource of `inv`. Idempotent; resources already gone are not errors.
        Raises TeardownError (after trying everything) if some could not be deleted."""
        ...

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Tagged resources in the spec's scope (region/project) whose cluster is not in
        `known` (the names of the inventories on this machine)."""
        ...

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        """Delete resources returned by `orphans`. Idempotent."""
        ...


_REGISTRY: dict[str, str] = {
    "docker": "provision.providers.docker",
    "aws": "provision.providers.aws",
    "gcp": "provision.providers.gcp",
    "ssh": "provision.providers.ssh",
}


def get_provider(name: str) -> Provider:
    if name not in _REGISTRY:
        raise UserInputError(
            f"unknown provider {name!r}; choose one of: {', '.join(PROVIDERS)}"
        )
    try:
        module = importlib.import_module(_REGISTRY[name])
    except ImportError as exc:
        raise ProviderUnavailableError(
            f"provider {name!r} cannot be loaded: {exc}",
            hint="reinstall mgpu-cloud with its dependencies: pip install mgpu-cloud",
        ) from exc
    provider: Provider = module.PROVIDER_CLASS()
    return provider
