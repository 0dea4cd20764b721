"""`mgpu-cloud ssh NAME` and `ssh-config` to pods: OpenSSH's ProxyCommand is this module, a
relay between its stdin/stdout and the pod's port 22 through the API server's port-forward
(transport.PortForwardSocket, the same websocket the tool's own connections use), as
`kubectl port-forward` would, but for one connection and without a local port.

    ssh -o ProxyCommand='PYTHON -m provision.cluster.providers.k8s.relay --namespace NS
        [--context C] [--kubeconfig PATH] -- POD' root@POD

The host key is pinned as for every node (the cluster's known_hosts names the pod, port 22;
StrictHostKeyChecking yes): the relay carries bytes only, it authenticates nothing. The
credentials are the kubeconfig's, read by the relay when ssh starts it; the kubeconfig path
in effect when the config was written is named, so an editor's ssh finds it too.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from provision.cluster.providers.k8s.transport import PortForwardSocket
from provision.model.inventory import Inventory, NodeRecord

CHUNK = 65536


def proxy_argv(inv: Inventory, node: NodeRecord) -> list[str]:
    """The ProxyCommand's words reaching `node`'s pod (registry: ProviderInfo.proxy)."""
    from provision.cluster.providers.k8s.options import K8sOptions

    if inv.spec is None:
        raise ValueError(f"cluster {inv.name!r}: its inventory has no spec")
    opts = inv.spec.options_as(K8sOptions)
    argv = [sys.executable, "-m", "provision.cluster.providers.k8s.relay",
            "--namespace", opts.namespace]
    if opts.context:
        argv += ["--context", opts.context]
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if kubeconfig:
        argv += ["--kubeconfig", os.pathsep.join(os.path.abspath(p)
                                                 for p in kubeconfig.split(os.pathsep) if p)]
    return [*argv, "--", node.address]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def relay(sock: PortForwardSocket, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """stdin -> the pod, the pod -> stdout, until either side ends."""
    def upstream() -> None:
        try:
            while data := os.read(stdin_fd, CHUNK):
                sock.sendall(data)
        except OSError:
            pass
        sock.close()  # ssh is done: so is the forward

    threading.Thread(target=upstream, daemon=True).start()
    while data := sock.recv(CHUNK):
        _write_all(stdout_fd, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision.cluster.providers.k8s.relay")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--context")
    parser.add_argument("--kubeconfig")
    parser.add_argument("pod")
    args = parser.parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    from provision.cluster.providers.k8s.client import kube, map_errors
    from provision.cluster.providers.k8s.transport import open_portforward
    from provision.model.errors import MgpuError

    try:
        with map_errors(f"port-forward to pod {args.pod}"):
            sock = open_portforward(kube(args.namespace, args.context).api, args.namespace,
                                    args.pod)
        relay(sock)
    except MgpuError as exc:
        print(f"mgpu-cloud: {exc.message}", file=sys.stderr)
        return 255
    except Exception as exc:  # noqa: BLE001 - websocket's own errors (e.g. a 403 upgrade)
        print(f"mgpu-cloud: port-forward to pod {args.pod}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 255
    return 0


if __name__ == "__main__":
    sys.exit(main())
