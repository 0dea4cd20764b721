"""The registries of providers and launchers: names and declarations, no implementations.

A provider is one package, provision/cluster/providers/<name>/, whose `__init__.py` defines
`INFO = ProviderInfo(...)`: its options model, its CLI flags, whether it costs money, and
where its implementation lives. A launcher is one module of provision/job/launchers/. This
module names them by dotted path (like packaging entry points) and loads a declaration only
when asked: the model layer never imports a layer above it (tests/test_layers.py), and
importing a provider's `__init__` stays cheap (no SDK, no pydantic), because the CLI reads
every provider's flags when it starts. Adding a provider is its folder plus one line in
REGISTRY; the spec, the CLI and the pipeline learn everything else from INFO.

The contract a provider implements is provision.cluster.providers.contract.Provider, a
launcher's provision.job.launchers.Launcher: `load_class` checks an entry against it when it
is loaded (tests/test_registry.py loads every entry).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from provision.model.errors import UserInputError

# name -> package. One line per provider.
REGISTRY: dict[str, str] = {
    "docker": "provision.cluster.providers.docker",
    "aws": "provision.cluster.providers.aws",
    "gcp": "provision.cluster.providers.gcp",
    "ssh": "provision.cluster.providers.ssh",
    "slurm": "provision.cluster.providers.slurm",
    "k8s": "provision.cluster.providers.k8s",
}
DEFAULT_PROVIDER = "docker"


@dataclass(frozen=True)
class Flag:
    """One CLI flag of a provider, mapped to a field of its options model.

    Two providers may declare the same flag (e.g. --zone): the CLI shows it once and hands the
    value to whichever provider was chosen. `gc=True`: the flag also scopes `mgpu-cloud gc`."""

    decl: str  # "--instance-type"
    field: str  # field of the options model
    type: Any = str  # str | int | float | bool (a bool is a switch)
    help: str = ""
    short: str | None = None  # "-i"
    gc: bool = False

    @property
    def param(self) -> str:
        """The Python parameter name the CLI gives the flag (kept apart from core options)."""
        return "p_" + self.decl.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    summary: str  # one line for --help
    options: str  # "module:Class" of the options model (the `NAME:` section of a cluster YAML)
    implementation: str  # "module:Class" implementing contract.Provider
    costs_money: bool  # plans of a provider that costs money are confirmed before `up`
    flags: tuple[Flag, ...] = ()
    connector: str | None = None  # "module:function(inv) -> Connector"; None: SSH to the nodes
    # "module:function(inv, node) -> argv": the program an interactive `ssh` to a node runs as
    # its ProxyCommand (k8s: the tool's own port-forward); None: ssh connects straight
    proxy: str | None = None
    commands: tuple[tuple[str, str], ...] = ()  # CLI sub-commands: (name, "module:typer_app")
    # The field of the options model naming the node type (shown by `cost`), if any.
    machine_type: str | None = None
    # A shell line a node runs (as the node user) to end its own billing when a detached run
    # is over (`run --detach`), and what it leaves for `down`; None: nodes cannot (or must not)
    # stop themselves, and the cluster stays until `down`.
    self_stop: str | None = None
    self_stop_note: str = ""
    # Said under `monitor`'s table when its numbers are not each node's own (e.g. containers
    # sharing the machine's kernel); "" when they are.
    monitor_note: str = ""


def provider_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


T = TypeVar("T")


def load_ref(ref: str) -> Any:
    """What `ref` ("module:attribute") names, its module imported now."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_class(ref: str, base: type[T]) -> type[T]:
    """The class `ref` names, checked as it is loaded to be a subclass of `base` (the
    contract its registry promises: contract.Provider for REGISTRY's implementations,
    launchers.Launcher for LAUNCHERS): TypeError naming both otherwise. The caller passes
    `base`, so this module imports no layer above it."""
    found = load_ref(ref)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise TypeError(f"registry entry {ref!r} is {found!r}, not a subclass of "
                        f"{base.__module__}.{base.__qualname__}")
    return found


@cache
def provider_info(name: str) -> ProviderInfo:
    """INFO of provider `name`; UserInputError naming the known providers otherwise."""
    if name not in REGISTRY:
        raise UserInputError(
            f"unknown provider {name!r}; choose one of: {', '.join(REGISTRY)}"
        )
    info: ProviderInfo = importlib.import_module(REGISTRY[name]).INFO
    return info


def all_provider_infos() -> list[ProviderInfo]:
    return [provider_info(name) for name in REGISTRY]


def connector_for(name: str) -> Any | None:
    """The provider's own node transport factory (`inv -> Connector`), or None (SSH)."""
    ref = provider_info(name).connector
    return load_ref(ref) if ref else None


def proxy_for(name: str) -> Any | None:
    """The provider's ProxyCommand maker for interactive ssh (`(inv, node) -> argv`), or
    None (ssh reaches the node's address itself)."""
    ref = provider_info(name).proxy
    return load_ref(ref) if ref else None


def options_model(name: str) -> Any:
    """The pydantic options model of provider `name` (imports pydantic)."""
    return load_ref(provider_info(name).options)


# name -> "module:Class". One line per launcher (provision/job/launchers/).
LAUNCHERS: dict[str, str] = {
    "torchrun": "provision.job.launchers.torchrun:Torchrun",
    "deepspeed": "provision.job.launchers.deepspeed:DeepSpeed",
    "accelerate": "provision.job.launchers.accelerate:Accelerate",
}
DEFAULT_LAUNCHER = "torchrun"


def launcher_names() -> tuple[str, ...]:
    return tuple(LAUNCHERS)
