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

import select
from typing import Any

from provision.model.inventory import Inventory, NodeRecord
from provision.nodes.transport import Connector, NodeConnection, SshConnection

SSH_PORT = 22
CHANNEL_DATA, CHANNEL_ERROR = 0, 1
# An SSH keepalive after this long without sending: a quiet rank's session is otherwise cut by
# an idle timeout on the way (the kubelet's streaming-connection-idle-timeout, a read deadline
# only the client's data moves; 4 h by default, minutes on hardened clusters; a load balancer
# in front of the API server: AWS NLB 350 s, classic ELB 60 s), which looks like a lost node.
KEEPALIVE_S = 30


class PortForwardSocket:
    """The socket paramiko reads and writes, carried by one pods/portforward websocket: what
    paramiko sends goes out as data-channel frames, what comes back is unframed. The
    websocket stays blocking (a send is never cut by a timeout mid-frame); paramiko's read
    timeouts are a select() on it before a frame is read. The kubernetes client's own
    PortForward relays through a socketpair and a thread, which prints a traceback each
    time a connection closes with bytes unread."""

    def __init__(self, ws: Any, port: int) -> None:
        self.ws, self.port = ws, port
        self._buf = b""
        self._opened: set[int] = set()  # channels whose first frame (the port) came
        self._timeout: float | None = None
        self._eof = False
        self._closed = False  # paramiko's Transport.stop_thread reads it, as on a socket

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def _readable(self) -> bool:
        sock = self.ws.sock
        if sock is None:
            return True
        if hasattr(sock, "pending") and sock.pending():  # TLS: bytes already decrypted
            return True
        return bool(select.select([sock], [], [], self._timeout)[0])

    def recv(self, n: int) -> bytes:
        from websocket import ABNF, WebSocketConnectionClosedException

        while not self._buf and not self._eof:
            if not self._readable():
                raise TimeoutError("timed out")  # socket.timeout, as paramiko polls
            try:
                opcode, frame = self.ws.recv_data_frame(True)
            except (WebSocketConnectionClosedException, OSError):
                self._eof = True
                break
            if opcode == ABNF.OPCODE_CLOSE:
                self._eof = True
            elif opcode == ABNF.OPCODE_BINARY and frame.data:
                channel, data = frame.data[0], frame.data[1:]
                if channel not in self._opened:
                    self._opened.add(channel)  # its first frame: the port number
                elif channel == CHANNEL_ERROR:
                    raise ConnectionError(f"port-forward to port {self.port}: "
                                          f"{data.decode(errors='replace')}")
                else:
                    self._buf += data
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def send(self, data: bytes) -> int:
        self.ws.send_binary(bytes([CHANNEL_DATA]) + bytes(data))
        return len(data)

    def sendall(self, data: bytes) -> None:
        self.send(data)

    def close(self) -> None:
        self._eof = self._closed = True
        self.ws.close()


def open_portforward(api: Any, namespace: str, pod: str, port: int = SSH_PORT
                     ) -> PortForwardSocket:
    """A websocket to the pod's `port` through the API server, authenticated as the
    kubeconfig says (a bearer token, refreshed by its exec plugin; or a client certificate)."""
    from kubernetes.stream.ws_client import create_websocket, get_websocket_url

    cfg = api.configuration
    url = get_websocket_url(f"{cfg.host}/api/v1/namespaces/{namespace}/pods/{pod}/portforward",
                            [("ports", str(port))])
    # the key's name differs between client versions ("BearerToken" in 36, "authorization"
    # before); auth_settings() names the header and runs the exec plugin's refresh
    headers = {s["key"]: s["value"] for s in cfg.auth_settings().values()
               if s.get("in") == "header" and s.get("value")}
    return PortForwardSocket(create_websocket(cfg, url, headers), port)


class PodGateway:
    """What Fabric asks of a gateway (`open()`, `transport.open_channel(...)`): here the
    channel is a new port-forward to the pod's port 22. Truthy, as Fabric tests it."""

    def __init__(self, api: Any, namespace: str, pod: str) -> None:
        self.api, self.namespace, self.pod = api, namespace, pod
        self.transport = self

    def open(self) -> None:
        return None

    def open_channel(self, kind: str, dest_addr: Any = None, src_addr: Any = None) -> Any:
        return open_portforward(self.api, self.namespace, self.pod)


class PodSshConnection(SshConnection):
    """SshConnection (pinned host keys, the cluster key) whose socket is a port-forward, with
    SSH keepalives (KEEPALIVE_S)."""

    def __init__(self, inv: Inventory, node: NodeRecord, api: Any, namespace: str) -> None:
        super().__init__(inv, node)
        self._conn.gateway = PodGateway(api, namespace, node.address)
        self._conn.keepalive_s = KEEPALIVE_S


def connector(inv: Inventory) -> Connector:
    """Connections to `inv`'s pods through its kubeconfig context's API server; a node seen
    from inside the cluster (the controller's view, supervisor.inside_view: its address is
    its pod IP) is reached straight over the pod network, as every pod reaches another
    (the Kubernetes network model), and the controller needs no pods/portforward."""
    from provision.cluster.providers.k8s.client import kube
    from provision.cluster.providers.k8s.options import K8sOptions
    from provision.nodes.transport import ssh_connector

    if inv.spec is None:
        raise ValueError(f"cluster {inv.name!r}: its inventory has no spec")
    opts = inv.spec.options_as(K8sOptions)
    api: list[Any] = []  # made at the first port-forward (the controller never makes one)

    def make(inv: Inventory, node: NodeRecord) -> NodeConnection:
        if node.address == node.private_address:
            return ssh_connector(inv, node)
        if not api:
            api.append(kube(opts.namespace, opts.context).api)
        return PodSshConnection(inv, node, api[0], opts.namespace)

    return make
