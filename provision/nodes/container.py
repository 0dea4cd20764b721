"""Container mode: cloud nodes run the job inside a training image (`docker run` on the host).

The default image is chosen here once, per GPU architecture (default_image; a provider passes
the GPU model its catalog names), and an explicit `--image` that is a known NGC PyTorch
release too old for the GPUs is refused at plan time (check_image). A provider adds what its
fabric needs inside the
container through `Inventory.container_args` (devices, mounts) and
`Inventory.container_library_path` (folders put first on the image's own LD_LIBRARY_PATH). Where nodes have no
Docker (Slurm sites), the provider names another runtime in `Inventory.container_runtime`:
Apptainer/Singularity (`exec`, unprivileged, the host's environment and $HOME passed through).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provision.model.errors import LaunchError, UserInputError
from provision.model.inventory import Inventory
from provision.nodes import CONTAINER_ROOT, HomePath, shell
from provision.nodes.layout import join

# NGC PyTorch 24.06: CUDA 12.5 (NVIDIA PyTorch release notes, release 24.06). Volta to Hopper.
DEFAULT_TRAINING_IMAGE = "nvcr.io/nvidia/pytorch:24.06-py3"
# NGC PyTorch 25.01: PyTorch 2.6, CUDA 12.8 (NGC release notes; lablup/backend.ai-kernels PR
# #306 "NGC PyTorch 25.01 - Python 3.12 - PyTorch 2.6 - CUDA 12.8"). Blackwell needs CUDA 12.8:
# "CUDA 12.8 is the first CUDA version that natively supports Blackwell (compute capabilities
# 10.0 and 12.0)" (NVIDIA, "Software Migration Guide for NVIDIA Blackwell RTX GPUs", 2025).
BLACKWELL_TRAINING_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
NGC_PYTORCH = "nvcr.io/nvidia/pytorch"


@dataclass(frozen=True)
class GpuArchitecture:
    name: str
    min_cuda: tuple[int, int]  # the first CUDA with native code for it
    default_image: str


# First CUDA per architecture: NVIDIA CUDA Toolkit release notes / CUDA GPUs compute capability
# table (Volta 7.0: 9.0; Turing 7.5: 10.0; Ampere 8.0/8.6: 11.0/11.1; Ada 8.9 and Hopper 9.0:
# 11.8; Blackwell 10.0: 12.8, see above).
ARCHITECTURES = {
    a.name: a for a in (
        GpuArchitecture("volta", (9, 0), DEFAULT_TRAINING_IMAGE),
        GpuArchitecture("turing", (10, 0), DEFAULT_TRAINING_IMAGE),
        GpuArchitecture("ampere", (11, 1), DEFAULT_TRAINING_IMAGE),
        GpuArchitecture("ada", (11, 8), DEFAULT_TRAINING_IMAGE),
        GpuArchitecture("hopper", (11, 8), DEFAULT_TRAINING_IMAGE),
        GpuArchitecture("blackwell", (12, 8), BLACKWELL_TRAINING_IMAGE),
    )
}
# GPU model words as the catalogs spell them (AWS "NVIDIA B200", GCP "nvidia-b200",
# "nvidia-h100-80gb", "nvidia-tesla-a100") -> architecture.
GPU_MODEL_ARCHITECTURE = {
    "v100": "volta", "t4": "turing", "a100": "ampere", "a10g": "ampere", "a10": "ampere",
    "a40": "ampere", "a30": "ampere", "l4": "ada", "l40s": "ada", "l40": "ada",
    "h100": "hopper", "h200": "hopper", "gh200": "hopper", "b200": "blackwell",
    "b300": "blackwell", "gb200": "blackwell", "gb300": "blackwell",
}
# CUDA of NGC PyTorch releases (YY.MM), where a source was read: NVIDIA's PyTorch release
# notes (24.06: 12.5; 25.12: "Release 25.12 is based on CUDA 13.1.0"), lablup PRs #306 (25.01:
# CUDA 12.8) and #320 (25.09: "based on CUDA 13.0"). Releases before 25.01 are all older than
# CUDA 12.8 (25.01 is the first NGC PyTorch release on it), which is all the Blackwell check
# needs to know of them.
NGC_PYTORCH_CUDA = {"24.06": (12, 5), "25.01": (12, 8), "25.09": (13, 0), "25.12": (13, 1)}
FIRST_ON_CUDA_12_8 = "25.01"


def gpu_architecture(gpu_model: str) -> GpuArchitecture | None:
    """The architecture of a GPU model as a catalog spells it, or None when unknown."""
    for word in re.split(r"[^a-z0-9]+", gpu_model.lower()):
        if word in GPU_MODEL_ARCHITECTURE:
            return ARCHITECTURES[GPU_MODEL_ARCHITECTURE[word]]
    return None


def default_image(gpu_model: str | None) -> str:
    """The training image for nodes with these GPUs (the oldest-CUDA default when unknown)."""
    arch = gpu_architecture(gpu_model or "")
    return arch.default_image if arch else DEFAULT_TRAINING_IMAGE


def ngc_pytorch_cuda_at_most(image: str) -> tuple[int, int] | None:
    """An upper bound of the CUDA an NGC PyTorch image is built on, where known: exact for the
    releases in NGC_PYTORCH_CUDA, (12, 6) for any release before 25.01; None otherwise."""
    repo, _, tag = image.rpartition(":")
    match = re.fullmatch(r"(\d\d)\.(\d\d)(-py3)?", tag)
    if repo != NGC_PYTORCH or not match:
        return None
    release = f"{match.group(1)}.{match.group(2)}"
    if release in NGC_PYTORCH_CUDA:
        return NGC_PYTORCH_CUDA[release]
    return (12, 6) if release < FIRST_ON_CUDA_12_8 else None


def check_image(image: str, gpu_model: str, machine: str) -> None:
    """UserInputError (before anything is made) when `image` is a known NGC PyTorch release
    whose CUDA is older than the GPUs of `machine` need; images it knows nothing of pass."""
    arch = gpu_architecture(gpu_model)
    cuda = ngc_pytorch_cuda_at_most(image)
    if arch is None or cuda is None or cuda >= arch.min_cuda:
        return
    need = ".".join(map(str, arch.min_cuda))
    raise UserInputError(
        f"--image {image} is built on CUDA {'.'.join(map(str, cuda))} or older, but "
        f"{machine}'s {gpu_model} GPUs ({arch.name}) need CUDA {need} or newer: the job "
        "would fail with 'no kernel image is available for execution on the device'",
        hint=f"use an image built on CUDA {need}+, e.g. --image {arch.default_image}, or "
             "omit --image for the default of this GPU")


def training_image(image: str | None, gpu_model: str | None, machine: str) -> str:
    """The image the nodes pull and jobs run in: `image` (--image / the YAML's `image:`),
    refused when it is a known NGC release too old for the GPUs (check_image), else the
    default of the GPUs' architecture. Every cloud provider's plan calls this."""
    if image:
        if gpu_model:
            check_image(image, gpu_model, machine)
        return image
    return default_image(gpu_model)


def check_job_image(inv: Inventory, image: str | None) -> None:
    """A job's own --image (`launch`, `run`) against the cluster's GPUs (Inventory.gpu_model),
    before anything starts: UserInputError for a known NGC release too old for them."""
    if image and inv.gpu_model:
        check_image(image, inv.gpu_model, f"cluster {inv.name!r}")


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


# A `--device` value the node resolves when the job starts (remote/devices.py): every device
# of a sysfs class bound to a driver, e.g. the EFA uverbs devices but not the mlx5 ones beside
# them. Spelled here once for providers; remote/devices.py SELECTOR spells the same prefix.
DEVICE_SELECTOR = "@by-driver:"


def by_driver(sysfs_class: str, driver: str) -> str:
    """The `--device` value selecting, on each node, every `sysfs_class` device whose kernel
    driver is `driver` (`job start` expands it; no match stops the job with a clear error)."""
    return f"{DEVICE_SELECTOR}{sysfs_class}:{driver}"


def container_name(inv: Inventory) -> str:
    return f"mgpu-{inv.name}-job"


ENV_FILE = "env"  # in the job's folder on the node (remote/jobs.py: jobs/ID/)


@dataclass(frozen=True)
class EnvFile:
    """The job's --env values for `docker run --env-file`: a 0600 file in the job's folder,
    so that no command line holds them (`ps` on the node shows every process's). `folder`:
    the job's folder as the node's shell names it (a HomePath); `inside`: as the container
    sees it, where the container removes the file first thing (FORGET_ENV_FILE)."""

    folder: str
    inside: str

    @property
    def on_host(self) -> str:
        return join(self.folder, ENV_FILE)

    def write(self, env: dict[str, str]) -> str:
        """The shell step (ending in `&& `) writing `env` in docker's --env-file format: one
        `KEY=VALUE` a line, VALUE literal to the end of its line (JobSpec refuses line
        breaks). 0600 from its first byte: the umask is set in a subshell, so the job does
        not inherit it. The values are in this line only while the node's shell reads it."""
        lines = " ".join(shell.word(f"{key}={value}") for key, value in env.items())
        return (f"(umask 077 && mkdir -p {shell.word(self.folder)} && "
                f"printf '%s\\n' {lines} > {shell.word(self.on_host)}) && ")


# Runs in the container before the launcher: removes the --env-file the job's values came
# from ($0, as the container sees it), which the docker CLI has read before the container
# started (a container user that may not remove it leaves it, 0600, in the job's folder).
FORGET_ENV_FILE = 'rm -f -- "$0" 2>/dev/null; exec "$@"'


def docker_run_argv(inv: Inventory, image: str, env: dict[str, str], *, mount: str,
                    extra: list[str] | None = None, env_file: EnvFile | None = None) -> list[str]:
    """`docker run` words starting the job's container: the tool's remote folder `mount`
    (home-relative) at CONTAINER_ROOT, the variables `env` (`-e`, on the command line: the
    tool's own), those of `env_file` (the job's --env values; they win), the provider's
    container_args and the launcher's `extra`; the launcher's argv follows the image."""
    argv = ["sudo", "-n", "docker", "run", "--rm", "--name", container_name(inv), *RUN_FLAGS,
            "-v", HomePath(f"{mount}:{CONTAINER_ROOT}"), "-w", f"{CONTAINER_ROOT}/work"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    if env_file is not None:
        argv += ["--env-file", env_file.on_host]
    argv += [*inv.container_args, *(extra or []), image, *library_prefix(inv)]
    if env_file is not None:
        argv += ["sh", "-c", FORGET_ENV_FILE, f"{env_file.inside}/{ENV_FILE}"]
    return argv


def container_run_argv(inv: Inventory, image: str, env: dict[str, str], *, mount: str,
                       extra: list[str] | None = None,
                       env_file: EnvFile | None = None) -> list[str]:
    """The words that start the job's container with the inventory's runtime (the launcher's
    argv follows). `extra` are the launcher's `docker run` words (Docker only: Apptainer
    binds $HOME, so e.g. ~/.ssh is there already); `env_file`: Docker only (docker_run_argv)."""
    runtime = inv.container_runtime
    if runtime == "docker":
        return docker_run_argv(inv, image, env, mount=mount, extra=extra, env_file=env_file)
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
