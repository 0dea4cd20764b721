"""Providers: one package each (docker/, aws/, gcp/, ssh/, slurm/), behind one contract.

Their names and declarations (ProviderInfo) are in provision.model.registry; this package
loads an implementation (`get_provider`, typed by the contract) when one is needed: the provider's SDK is imported only
then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from provision.model.errors import ProviderUnavailableError
from provision.model.registry import load_class, provider_info

if TYPE_CHECKING:  # the contract imports pydantic models: not at the CLI's start
    from provision.cluster.providers.contract import AnyProvider


def get_provider(name: str) -> AnyProvider:
    """A new instance of provider `name`; its SDK is imported only now."""
    from provision.cluster.providers.contract import Provider

    info = provider_info(name)
    try:
        # TypeError: not a Provider (an ABC may stand for type[T]: python/mypy#4717)
        cls = load_class(info.implementation, Provider)  # type: ignore[type-abstract]
    except ImportError as exc:
        raise ProviderUnavailableError(
            f"provider {name!r} cannot be loaded: {exc}",
            hint="reinstall mgpu-cloud with its dependencies: pip install mgpu-cloud",
        ) from exc
    provider: AnyProvider = cls()
    return provider
