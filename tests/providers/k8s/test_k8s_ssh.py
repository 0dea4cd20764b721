"""`mgpu-cloud ssh` and `ssh-config` to pods: OpenSSH gets the tool's own port-forward relay as
its ProxyCommand (the pod's name as the host, pinned in the cluster's known_hosts), and the
relay carries bytes both ways through the stand-in's pods/portforward. (The real sshd of a
pod, through real OpenSSH: tests/integration/test_k8s_managed.py.)"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import threading
from collections.abc import Callable

import pytest
from standin import Standin

from provision.cluster.providers.k8s.relay import relay
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec
from provision.nodes.sshconfig import config_text
from provision.nodes.sshconn import ssh_argv, write_cluster_known_hosts


def test_ssh_to_a_pod_goes_through_the_relay_with_its_host_key_pinned(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    inv = up(make_spec(k8s={"namespace": "default", "context": "standin"}))
    write_cluster_known_hosts(inv, store)
    argv = ssh_argv(inv, 1, [])
    proxy = next(a.split("=", 1)[1] for a in argv if a.startswith("ProxyCommand="))
    words = shlex.split(proxy)
    pod = inv.nodes[1].address
    assert words == [sys.executable, "-m", "provision.cluster.providers.k8s.relay",
                     "--namespace", "default", "--context", "standin", "--kubeconfig",
                     str(standin.kubeconfig), "--", pod]
    assert argv[-2:] == ["--", f"root@{pod}"] and "StrictHostKeyChecking=yes" in argv
    known = open(inv.known_hosts_path or "").read()
    assert f"{pod} {inv.nodes[1].host_key}" in known  # the pod's name, port 22: pinned
    text = config_text(inv)
    block = text.split(f"Host {inv.name}-node-1")[1].split("\nHost ")[0]
    assert f"HostName {pod}" in block and f"ProxyCommand {proxy}" in block
    assert "ProxyJump" not in text and "StrictHostKeyChecking yes" in block


def test_the_relay_carries_bytes_both_ways_through_the_port_forward(standin: Standin) -> None:
    """stdin -> pod, pod -> stdout, as ssh drives a ProxyCommand; an echo server is the pod."""
    from kubernetes import config

    from provision.cluster.providers.k8s.transport import open_portforward

    listener = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = listener.accept()
        while data := conn.recv(1 << 16):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=echo, daemon=True).start()
    standin.kubelet.address = lambda pod: ("127.0.0.1", 0)
    standin.store.create("pods", "default", {"metadata": {"name": "echo"}, "spec": {
        "containers": [{"name": "c", "image": "x"}]}})
    api = config.new_client_from_config(config_file=str(standin.kubeconfig))
    sock = open_portforward(api, "default", "echo", listener.getsockname()[1])
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    done = threading.Thread(target=relay, args=(sock, stdin_r, stdout_w), daemon=True)
    done.start()
    payload = os.urandom(300_000)
    threading.Thread(target=lambda: (os.write(stdin_w, payload[:150_000]),
                                     os.write(stdin_w, payload[150_000:])), daemon=True).start()
    got = b""
    while len(got) < len(payload):
        got += os.read(stdout_r, 1 << 16)
    assert got == payload
    os.close(stdin_w)  # ssh is done: the relay ends the forward and returns
    done.join(10)
    assert not done.is_alive()
    listener.close()


def test_the_relay_says_why_it_cannot_forward(standin: Standin,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from provision.cluster.providers.k8s.relay import main

    assert main(["--namespace", "default", "--kubeconfig", str(standin.kubeconfig),
                 "no-such-pod"]) == 255
    assert "port-forward to pod no-such-pod" in capsys.readouterr().err
