"""Shared fixtures. Every test gets its own MGPU_CLOUD_HOME, so nothing touches ~/.mgpu-cloud."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/fake_nodes.py and friends

ROOT = Path(__file__).resolve().parent.parent
from kit import IN_CI  # noqa: E402 - after the sys.path line above

pytest_plugins = ["storekit"]  # object stores and a webhook receiver (issue 18)

# A test run started in the background by a non-interactive shell (`make test &`, nohup, a CI
# step in some runners) has SIGINT ignored, and an ignored signal stays ignored across exec:
# the CLI processes the Ctrl-C tests start would never see their Ctrl-C. A terminal's default
# (Python's handler here; a child starts with SIG_DFL again) for this process and its children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def mgpu_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "mgpu-home"
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(home))
    return home


def docker_available() -> tuple[bool, str]:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True, ""
    except Exception as exc:  # noqa: BLE001
        return False, str(exc)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """A reachable Docker engine: required in CI (fails, never skips), skipped elsewhere."""
    ok, why = docker_available()
    if not ok:
        if IN_CI:
            pytest.fail(f"CI=true but the Docker engine is not reachable: {why}")
        pytest.skip(f"no Docker engine: {why}")
    if IN_CI:
        _sweep_killed_runs()
    yield


def _sweep_killed_runs() -> None:
    """CI's engine starts clean: what an earlier test run killed with its machine left
    (containers and networks of clusters whose inventories were in its temporary homes)
    would otherwise meet tests of the same cluster names. Outside CI the engine may hold a
    developer's own clusters: nothing is touched (`up` names such leftovers itself)."""
    import docker

    from provision.model.inventory import CLUSTER_TAG

    client = docker.from_env(timeout=60)
    label = {"label": CLUSTER_TAG}
    for c in client.containers.list(all=True, filters=label):
        print(f"removing {c.name}, left by an earlier test run")
        c.remove(force=True)
    for n in client.networks.list(filters=label):
        n.remove()


@pytest.fixture(scope="session")
def node_image(docker_engine: None) -> str:
    """The node image, built once (cached by tag across runs)."""
    from provision.cluster.providers.docker.images import ensure_node_image
    from provision.cluster.providers.docker.options import DockerOptions

    return ensure_node_image(DockerOptions(), log=print)
