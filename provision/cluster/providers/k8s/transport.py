"""How the controller reaches a pod: SSH to the pod's sshd, the TCP stream carried by the API
server's port-forward (pods/portforward, a websocket the kubernetes client opens), the way
`kubectl port-forward` does, but in-process and per connection.

Why SSH through port-forward rather than the exec API (docs/kubernetes.md, measured): one
transport for every provider (uploads on stdin, streamed output, exit codes, `tar` copies, the
job supervisor's channel), host keys still pinned, and no second implementation of
NodeConnection over exec's channel protocol (stdin cannot be half-closed before its v5, which
`tar -x` of an upload needs). The trust anchor is the API server's TLS and the kubeconfig's
credentials, plus the pinned host key of each pod.
"""

from __future__ import annotations

from typing import Any

from provision.model.inventory import Inventory, NodeRecord
from provision.nodes.transport import Connector, NodeConnection, SshConnection

SSH_PORT = 22


class PodGateway:
    """What Fabric asks of a gateway (`open()`, `transport.open_channel(...)`): here the
    channel is a new port-forward stream to the pod's port 22. Truthy, as Fabric tests it."""

    def __init__(self, core: Any, namespace: str, pod: str) -> None:
        self.core, self.namespace, self.pod = core, namespace, pod
        self.transport = self
        self._forwards: list[Any] = []

    def open(self) -> None:
        return None

    def open_channel(self, kind: str, dest_addr: Any = None, src_addr: Any = None) -> Any:
        from kubernetes.stream import portforward

        pf = portforward(self.core.connect_get_namespaced_pod_portforward, self.pod,
                         self.namespace, ports=str(SSH_PORT))
        self._forwards.append(pf)
        return pf.socket(SSH_PORT)

    def close(self) -> None:
        for pf in self._forwards:
            pf.close()
        self._forwards.clear()


class PodSshConnection(SshConnection):
    """SshConnection (pinned host keys, the cluster key) whose socket is a port-forward."""

    def __init__(self, inv: Inventory, node: NodeRecord, core: Any, namespace: str) -> None:
        super().__init__(inv, node)
        self._gateway = PodGateway(core, namespace, node.address)
        self._conn.gateway = self._gateway

    def close(self) -> None:
        super().close()
        self._gateway.close()


def connector(inv: Inventory) -> Connector:
    """Connections to `inv`'s pods through its kubeconfig context's API server."""
    from provision.cluster.providers.k8s.client import kube
    from provision.cluster.providers.k8s.options import K8sOptions

    if inv.spec is None:
        raise ValueError(f"cluster {inv.name!r}: its inventory has no spec")
    opts = inv.spec.options_as(K8sOptions)
    k = kube(opts.namespace, opts.context)

    def make(inv: Inventory, node: NodeRecord) -> NodeConnection:
        return PodSshConnection(inv, node, k.core, opts.namespace)

    return make
