"""Node images for the docker provider, cached by a hash of their inputs.

    base image   DockerOptions.base_image (default debian:bookworm-slim) if present or pullable;
                 else the locally made LOCAL_BASE (`mgpu-cloud image base`, debootstrap);
    node image   mgpu-cloud/node:<hash of Dockerfile + entrypoint + requirements + base id>,
                 built only when no image has that tag.

The build context is assembled in a temp folder: Dockerfile, node-entrypoint.sh and wheelhouse/
(wheels downloaded on the host with pip into the cache, once per requirements hash), so the
build never needs PyPI from inside a container.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from provision.cluster.providers.docker.options import DEFAULT_BASE_IMAGE, DockerOptions
from provision.model.assets import dockerfile_path, templates_dir
from provision.model.errors import ProviderUnavailableError
from provision.model.logsink import Log

LOCAL_BASE = "mgpu-cloud/base:bookworm"
NODE_REPO = "mgpu-cloud/node"
BASE_PACKAGES = (
    "python3,python3-venv,openssh-server,iproute2,procps,netcat-openbsd,ca-certificates,"
    "pdsh,g++,python3-dev,ninja-build"
)


def cache_dir() -> Path:
    d = Path(os.environ.get("MGPU_CLOUD_CACHE", "~/.cache/mgpu-cloud")).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _requirements() -> str:
    return (templates_dir() / "docker" / "node-requirements.txt").read_text()


def _image_exists(client: Any, ref: str) -> Any | None:
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def resolve_base_image(client: Any, wanted: str, log: Log) -> Any:
    """The base image object: `wanted` if local or pullable, else the local debootstrap base."""
    import docker.errors

    image = _image_exists(client, wanted)
    if image is not None:
        return image
    if wanted == DEFAULT_BASE_IMAGE:
        # The default base is not here: a base made by `mgpu-cloud image base` stands in for
        # it without a pull attempt (no registry here, or the user chose the local base).
        local = _image_exists(client, LOCAL_BASE)
        if local is not None:
            return local
    try:
        log(f"pulling base image {wanted} ...")
        return client.images.pull(wanted)
    except docker.errors.APIError as exc:
        fallback = _image_exists(client, LOCAL_BASE)
        if fallback is not None:
            log(f"cannot pull {wanted} ({exc.explanation or exc}); using local base {LOCAL_BASE}")
            return fallback
        raise ProviderUnavailableError(
            f"base image {wanted!r} is not on this machine and cannot be pulled "
            f"({exc.explanation or exc})",
            hint="build a local base from Debian packages: mgpu-cloud image base "
            "(or pass --base-image with an image you have)",
        ) from None


def ensure_wheelhouse(requirements: str, log: Log) -> Path:
    """Wheels for the node venv, built/downloaded once per requirements text."""
    digest = hashlib.sha256(requirements.encode()).hexdigest()[:12]
    target = cache_dir() / f"wheelhouse-{digest}"
    if (target / ".complete").exists():
        return target
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".wheelhouse-"))
    (tmp / "requirements.txt").write_text(requirements)
    log("downloading wheels for the node image (once) ...")
    proc = subprocess.run(
        # `pip wheel`, not `pip download`: sdists (DeepSpeed) are built into wheels here, so
        # the image build installs wheels only, with no compiler or index.
        [sys.executable, "-m", "pip", "wheel", "-r", str(tmp / "requirements.txt"),
         "-w", str(tmp)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ProviderUnavailableError(
            "could not download the node image's Python wheels:\n"
            + "\n".join(proc.stderr.strip().splitlines()[-5:]),
            hint="check that pip can reach your package index (pip download torch==2.13.0)",
        )
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


def node_image_tag(base_id: str) -> str:
    h = hashlib.sha256()
    h.update(dockerfile_path().read_bytes())
    h.update((templates_dir() / "docker" / "node-entrypoint.sh").read_bytes())
    h.update(_requirements().encode())
    h.update(base_id.encode())
    return f"{NODE_REPO}:{h.hexdigest()[:12]}"


def ensure_node_image(opts: DockerOptions, log: Log, client: Any = None) -> str:
    """Tag of a node image for `opts`, building it only if no image has that tag."""
    from provision.cluster.providers.docker.engine import docker_client

    client = client or docker_client()
    if opts.image:
        if _image_exists(client, opts.image) is None:
            raise ProviderUnavailableError(
                f"node image {opts.image!r} is not on this machine",
                hint="build it, or drop --node-image to let mgpu-cloud build one",
            )
        return opts.image
    base = resolve_base_image(client, opts.base_image, log)
    base_ref = base.tags[0] if base.tags else base.id
    tag = node_image_tag(base.id)
    if _image_exists(client, tag) is not None:
        return tag
    wheels = ensure_wheelhouse(_requirements(), log)
    with tempfile.TemporaryDirectory(prefix="mgpu-build-") as ctx:
        shutil.copy(dockerfile_path(), Path(ctx) / "Dockerfile")
        shutil.copy(templates_dir() / "docker" / "node-entrypoint.sh", Path(ctx))
        os.chmod(Path(ctx) / "node-entrypoint.sh", 0o755)
        shutil.copytree(wheels, Path(ctx) / "wheelhouse")
        log(f"building node image {tag} from {base_ref} (once; ~1-2 min) ...")
        proc = subprocess.run(
            ["docker", "build", "-q", "--build-arg", f"BASE_IMAGE={base_ref}", "-t", tag, ctx],
            capture_output=True, text=True,
        )
    if proc.returncode != 0:
        raise ProviderUnavailableError(
            f"building the node image failed:\n{proc.stderr.strip()[-2000:]}",
            hint="see the Dockerfile at the top of the project; `docker build` must work here",
        )
    # The builder stage is left dangling; remove it so repeated builds do not pile up.
    subprocess.run(["docker", "image", "prune", "-f", "--filter", "dangling=true"],
                   capture_output=True)
    return tag


def build_base_image(tag: str, log: Log) -> str:
    """Make a Debian bookworm base with debootstrap and import it as `tag` (needs root)."""
    if shutil.which("debootstrap") is None:
        raise ProviderUnavailableError(
            "debootstrap is not installed", hint="apt-get install -y debootstrap"
        )
    mirror = os.environ.get("MGPU_CLOUD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    with tempfile.TemporaryDirectory(prefix="mgpu-rootfs-") as root:
        log(f"debootstrap bookworm into {root} (~1-2 min) ...")
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm",
             root, mirror],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise ProviderUnavailableError(
                f"debootstrap failed:\n{(proc.stdout + proc.stderr).strip()[-2000:]}"
            )
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout,
                             capture_output=True, text=True)
        tar.wait()
    if imp.returncode != 0:
        raise ProviderUnavailableError(f"docker import failed: {imp.stderr.strip()}")
    log(f"base image {tag} ready")
    return tag
