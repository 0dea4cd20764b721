"""Fixtures: a stand-in cluster per test (API server over HTTP + a kubelet that runs nothing),
reached by the real kubernetes client through a kubeconfig; every manifest the provider sends
is judged by the official schemas (k8s_schemas.py) and a violation fails the test."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import rbac  # noqa: E402
from standin import Standin  # noqa: E402

from provision.model.inventory import InventoryStore  # noqa: E402
from provision.model.spec import ClusterSpec, build_cluster_spec, deep_merge  # noqa: E402


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Standin]:
    s = Standin(tmp_path)
    for k, v in s.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("provision.cluster.providers.k8s.pods.POLL_S", 0.02)
    yield s
    s.stop()
    assert s.api.violations == [], "manifests broke the official schemas:\n" + \
        "\n".join(s.api.violations)
    denied = rbac.denied_to_anyone(s.api.requests)
    assert denied == [], "requests the Role of docs/kubernetes.md does not allow:\n" + \
        "\n".join(denied)


@pytest.fixture
def store(mgpu_home: Path) -> InventoryStore:
    return InventoryStore(mgpu_home)


@pytest.fixture
def make_spec() -> Callable[..., ClusterSpec]:
    def make(**overrides: Any) -> ClusterSpec:
        base = {"provider": "k8s", "name": "c1", "nodes": 2}
        return build_cluster_spec({}, deep_merge(base, overrides))

    return make


def real_kubeconfig() -> str | None:
    """$KUBECONFIG when it names a cluster that is not one of these tests' stand-ins."""
    import os

    path = os.environ.get("KUBECONFIG", "")
    return path if path and "kubeconfig-" not in Path(path).name else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `real_cluster` run only when KUBECONFIG points at a cluster; otherwise
    they are deselected (not skipped: `pytest -k k8s` runs with no skips here)."""
    if real_kubeconfig():
        return
    dropped = [i for i in items if i.get_closest_marker("real_cluster")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_cluster: needs KUBECONFIG pointing at a real "
                                       "cluster (deselected otherwise)")
