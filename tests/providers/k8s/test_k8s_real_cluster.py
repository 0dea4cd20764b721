"""Against a real cluster: collected only when KUBECONFIG points at one (conftest.py
deselects it otherwise). Needs MGPU_CLOUD_K8S_IMAGE: an image the cluster can pull with sshd
and python3 >= 3.11 (the docker provider's node image pushed to a registry), and the Role of
docs/kubernetes.md in the namespace ($MGPU_K8S_NAMESPACE, default `default`).

    KUBECONFIG=~/.kube/config MGPU_CLOUD_K8S_IMAGE=REGISTRY/mgpu-node:TAG \\
        .venv/bin/python -m pytest -q tests/providers/k8s/test_k8s_real_cluster.py
"""

from __future__ import annotations

import os
import uuid

import pytest
from kit import cli

pytestmark = pytest.mark.real_cluster


def test_up_exec_down_on_a_real_cluster() -> None:
    from kubernetes import client, config

    ns = os.environ.get("MGPU_K8S_NAMESPACE", "default")
    name = f"mgpu-real-{uuid.uuid4().hex[:6]}"
    up = cli("up", "--provider", "k8s", "--nodes", "2", "--name", name, "--namespace", ns)
    try:
        assert up.returncode == 0, up.stderr
        out = cli("exec", name, "--", "python3 -c 'import sys; print(sys.version_info[:2])'")
        assert out.returncode == 0 and out.stdout.count("(3, 1") == 2, out.stdout + out.stderr
    finally:
        down = cli("down", name)
        assert down.returncode == 0, down.stderr
    api = config.new_client_from_config()
    left = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"mgpu-cloud-cluster={name}")
    assert left.items == []
