"""What a cloud controller's first boot installs (issue 18; docs/ARCHITECTURE.md, managed runs).

The aws and gcp controllers are plain small VMs: their boot (cloud-init user data on AWS, the
startup script on GCP) runs templates/controller/setup.sh.j2 in the background, which installs
python3's venv and the tool's dependencies that the supervisor imports, at the versions
installed on the machine that creates the controller (the code uploaded by the hand-off is that
machine's too), then touches READY (or writes the tail of its log to FAILED). READY only
when the venv's python is at least MIN_PYTHON (pyproject's requires-python: the code uses
datetime.UTC and other 3.11 names), so an image with an older python3 fails at set-up,
naming its version, instead of at the supervisor's first record. The hand-off
waits for one of them before it uploads anything (handoff.wait_controller_setup). No secret is
in the script: it reaches the VM's metadata, which every process there can read.
"""

from __future__ import annotations

import importlib.metadata

STATE_DIR = "/var/lib/mgpu-cloud"
READY = f"{STATE_DIR}/controller-ready"
FAILED = f"{STATE_DIR}/controller-failed"
VENV = "/opt/mgpu-cloud"
MIN_PYTHON = (3, 11)  # pyproject.toml requires-python (tests/providers/aws: they agree)
# (distribution, module the set-up imports to check it): what provision.job.managed.supervisor
# loads on a controller (the CLI's typer/rich/docker are not needed there)
COMMON = (("pydantic", "pydantic"), ("PyYAML", "yaml"), ("Jinja2", "jinja2"),
          ("tenacity", "tenacity"), ("fabric", "fabric"), ("paramiko", "paramiko"))
FOR_PROVIDER = {
    "aws": (("boto3", "boto3"),),
    "gcp": (("google-cloud-compute", "google.cloud.compute_v1"), ("google-auth", "google.auth"),
            ("requests", "requests")),
}
FOR_STORE = {"s3": (("boto3", "boto3"),),
             "gs": (("google-cloud-storage", "google.cloud.storage"),)}


def _pin(dist: str) -> str:
    try:
        return f"{dist}=={importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return dist


def packages(provider: str, store_scheme: str | None) -> list[tuple[str, str]]:
    """(pip requirement, module) pairs the controller needs, without repeats."""
    wanted = COMMON + FOR_PROVIDER.get(provider, ()) + FOR_STORE.get(store_scheme or "", ())
    return [(_pin(dist), module) for dist, module in dict(wanted).items()]


def setup_script(cluster: str, provider: str, store_scheme: str | None) -> str:
    from provision.model.render import render

    pkgs = packages(provider, store_scheme)
    return render("controller/setup.sh.j2", cluster=cluster, state_dir=STATE_DIR,
                  ready=READY, failed=FAILED, venv=VENV,
                  min_python=".".join(map(str, MIN_PYTHON)), min_python_tuple=str(MIN_PYTHON),
                  requirements=[p for p, _ in pkgs], modules=[m for _, m in pkgs])
