"""Container mode: cloud nodes run the job inside a training image (`docker run` on the host).

The default image is defined here once; a provider adds what its fabric needs inside the
container through `Inventory.container_args` (devices, mounts) and
`Inventory.container_library_path` (folders put first on the image's own LD_LIBRARY_PATH). Where nodes have no
Docker (Slurm sites), the provider names another runtime in `Inventory.container_runtime`:
Apptainer/Singularity (`exec`, unprivileged, the host's environment and $HOME passed through).
"""

from __future__ import annotations

from provision.model.errors import LaunchError
from provision.model.inventory import Inventory
from provision.nodes import CONTAINER_ROOT, HomePath

DEFAULT_TRAINING_IMAGE = "nvcr.io/nvidia/pytorch:24.06-py3"
RUN_FLAGS = [
    "--gpus", "all", "--network", "host", "--ipc", "host",
    "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
]


# Runs in the container before the launcher: puts the provider's library folders (passed as
# $0) first on the image's own LD_LIBRARY_PATH (`docker run -e` could only replace it).
PREPEND_LIBRARY_PATH = 'LD_LIBRARY_PATH="$0${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$@"'


def library_prefix(inv: Inventory) -> list[str]:
    """Words between the image and the launcher's argv that prepend
    Inventory.container_library_path inside the container ([] when there is none)."""
    if not inv.container_library_path:
        return []
    return ["sh", "-c", PREPEND_LIBRARY_PATH, ":".join(inv.container_library_path)]


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
    argv += [*inv.container_args, *(extra or []), image, *library_prefix(inv)]
    return argv


def container_run_argv(inv: Inventory, image: str, env: dict[str, str], *, mount: str,
                       extra: list[str] | None = None) -> list[str]:
    """The words that start the job's container with the inventory's runtime (the launcher's
    argv follows). `extra` are the launcher's `docker run` words (Docker only: Apptainer
    binds $HOME, so e.g. ~/.ssh is there already)."""
    runtime = inv.container_runtime
    if runtime == "docker":
        return docker_run_argv(inv, image, env, mount=mount, extra=extra)
    if runtime == "none":
        raise LaunchError(f"cluster {inv.name!r} cannot run container images (no Docker, "
                          "Apptainer or Singularity on its nodes)",
                          hint="run without --image, in an environment set up on the nodes")
    uri = image if "://" in image or image.endswith(".sif") or image.startswith(("/", ".")) \
        else f"docker://{image}"
    # `env K=V` before the runtime: Apptainer passes the caller's environment into the
    # container (no --cleanenv), so the variables arrive without a comma-splitting --env.
    return ["env", *(f"{k}={v}" for k, v in env.items()), runtime, "exec",
            "--bind", HomePath(f"{mount}:{CONTAINER_ROOT}"), "--pwd", f"{CONTAINER_ROOT}/work",
            *inv.container_args, uri, *library_prefix(inv)]
