"""The registries (provision/model/registry.py): every entry loads as the class its registry
promises, checked by the loader itself (`load_class`), so an entry naming something else fails
as it is loaded, naming both. Whatever REGISTRY and LAUNCHERS hold is loaded here: a provider
or launcher added later is covered without a change to this file."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Provider
from provision.job.launchers import Launcher, get_launcher
from provision.model.registry import (
    LAUNCHERS,
    REGISTRY,
    ProviderInfo,
    load_class,
    options_model,
    provider_info,
)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_provider_entry_loads_as_a_provider(name: str) -> None:
    info = provider_info(name)
    assert isinstance(info, ProviderInfo) and info.name == name
    cls = load_class(info.implementation, Provider)  # type: ignore[type-abstract]
    assert issubclass(cls, Provider)
    assert isinstance(get_provider(name), cls)
    assert issubclass(options_model(name), BaseModel)


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_every_launcher_entry_loads_as_a_launcher(name: str) -> None:
    cls = load_class(LAUNCHERS[name], Launcher)  # type: ignore[type-abstract]
    assert issubclass(cls, Launcher) and cls.name == name
    assert isinstance(get_launcher(name), cls)


def test_an_entry_of_the_wrong_kind_is_refused_as_it_loads() -> None:
    with pytest.raises(TypeError, match=r"torchrun:Torchrun.*not a subclass of "
                                         r"provision\.cluster\.providers\.contract\.Provider"):
        load_class("provision.job.launchers.torchrun:Torchrun", Provider)  # type: ignore[type-abstract]
    with pytest.raises(TypeError, match="not a subclass of provision.job.launchers.Launcher"):
        load_class("provision.job.launchers:get_launcher", Launcher)  # type: ignore[type-abstract]
