"""Container mode: cloud nodes run the job inside a training image (`docker run` on the host).

The default image is defined here once; a provider adds what its fabric needs inside the
container (devices, library mounts) through `Inventory.container_args`.
"""

from __future__ import annotations

from provision.inventory import Inventory
from provision.nodes import CONTAINER_ROOT, HomePath

DEFAULT_TRAINING_IMAGE = "nvcr.io/nvidia/pytorch:24.06-py3"
RUN_FLAGS = [
    "--gpus", "all", "--network", "host", "--ipc", "host",
    "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
]


def container_name(inv: Inventory) -> str:
    return f"mgpu-{inv.name}-job"


def docker_run_argv(inv: Inventory, image: str, env: dict[str, str], *, mount: str,
                    extra: list[str] | None = None) -> list[str]:
    """`docker run` words starting the job's container: the tool's remote folder `mount`
    (home-relative) at CONTAINER_ROOT, the job's variables, the provider's container_args and
    the launcher's `extra`; the launcher's argv follows the image."""
    argv = ["sudo", "-n", "docker", "run", "--rm", "--name", container_name(inv), *RUN_FLAGS,
            "-v", HomePath(f"{mount}:{CONTAINER_ROOT}"), "-w", f"{CONTAINER_ROOT}/work"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += [*inv.container_args, *(extra or []), image]
    return argv
