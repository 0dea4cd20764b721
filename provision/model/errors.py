"""The one exception tree of mgpu-cloud.

    MgpuError                    (exit 1)  base: .message says what failed, .hint how to fix it
    ├── UserInputError           (exit 2)  bad spec, flag, file or name; raised before any write
    │   ├── SpecError                      a ClusterSpec/JobSpec that does not validate
    │   └── ClusterExistsError             `up` with a name that already has an inventory
    ├── ClusterNotFoundError     (exit 2)  no inventory with that name
    ├── InventoryUnreadableError (exit 1)  an inventory file that cannot be read (path, line)
    ├── ClusterBusyError         (exit 3)  another mgpu-cloud command holds the cluster's lock
    ├── ProviderUnavailableError (exit 4)  Docker engine down, credentials missing, SDK not installed
    ├── ProvisionError           (exit 5)  a create step failed (after rollback)
    │   └── CapacityError                  no zone had capacity for the request
    ├── TeardownError            (exit 6)  some resources could not be deleted (the inventory is kept)
    ├── BootstrapError           (exit 7)  one or more nodes could not be prepared (all named)
    └── LaunchError              (exit 8)  the job could not be started on every node

Lower-layer errors (docker, paramiko, botocore, google.api_core) are translated into these at
one boundary per provider (`map_errors` context managers), classified by error code tables.
The CLI is the only place that turns them into messages and exit codes.
"""

from __future__ import annotations


class MgpuError(Exception):
    """Base of every error the tool raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class UserInputError(MgpuError):
    exit_code = 2


class SpecError(UserInputError):
    pass


class ClusterExistsError(UserInputError):
    pass


class ClusterNotFoundError(MgpuError):
    exit_code = 2


class InventoryUnreadableError(MgpuError):
    """An inventory file that is not valid YAML, not an inventory, or not readable at all.
    `.path` is the file (of cluster `.cluster`); listings skip it and name it, commands on
    that cluster refuse."""

    def __init__(self, message: str, hint: str | None = None, *, path: str = "",
                 cluster: str = "", provider: str | None = None) -> None:
        super().__init__(message, hint)
        self.path, self.cluster = path, cluster
        self.provider = provider  # as far as the damaged text tells (None: unknown)


class ClusterBusyError(MgpuError):
    exit_code = 3


class ProviderUnavailableError(MgpuError):
    exit_code = 4


class ProvisionError(MgpuError):
    exit_code = 5


class CapacityError(ProvisionError):
    pass


class TeardownError(MgpuError):
    exit_code = 6


class BootstrapError(MgpuError):
    exit_code = 7


class LaunchError(MgpuError):
    exit_code = 8
