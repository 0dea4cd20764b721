"""The docker provider's typed plan: what `create` makes, resolved from the spec once.

    network     NAME-net (bridge), the cluster's own, labelled with it (made by `up`, removed
                by `down`, `gc`, rollback and the controller's teardown): a node reaches its
                own cluster's nodes and controller, never another cluster's
    containers  NAME-node-R with hostname node-R (the others reach it by name through the
                /etc/hosts block bootstrap writes, as on the clouds), SSH on 127.0.0.1 only
Nothing here talks to the engine except `plan`'s reachability check (in provider.py).
"""

from __future__ import annotations

from provision.cluster.providers.docker.options import DockerOptions
from provision.model.base import StrictModel
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec

DEFAULT_SLOTS = 2


# A network per cluster (issue 42): on one shared bridge a node reached every other
# cluster's nodes and controllers, and could sit between them and a plain-HTTP store
# endpoint. Docker drops traffic between two bridge networks (its isolation chains), and
# nodes run without NET_RAW (no raw or packet sockets: no ARP or address spoofing on their
# own bridge). It costs ~0.3 s of engine time per `run` (made ~0.1 s, removed ~0.2 s).
# Clusters made between issue 18 and issue 42 run on the network every docker cluster shared
# then: their replacements and controller join it, and `down` leaves it (no cluster owns it).
SHARED_NETWORK = "mgpu-cloud"
DROPPED_CAPS = ["NET_RAW"]  # of every node and controller container


def network_name(cluster: str) -> str:
    return f"{cluster}-net"


def network_of(inv: Inventory) -> str:
    """The network the cluster's containers are on: the one its inventory records (its
    own), else the shared one of a cluster made before each had its own."""
    own = inv.resources_of("network")
    return own[0].name if own and own[0].name else SHARED_NETWORK


def container_name(cluster: str, rank: int) -> str:
    return f"{cluster}-node-{rank}"


class DockerNode(StrictModel):
    rank: int
    container: str  # NAME-node-R
    hostname: str  # node-R: its hostname, and the name the other nodes reach it by


class DockerRequest(StrictModel):
    """What `create` (and `replace`, for one node) does, typed."""

    network: str
    nodes: list[DockerNode]
    slots: int
    node_image: DockerOptions  # which node image (built or given) and the per-node limits

    def node(self, rank: int, cluster: str) -> DockerNode:
        """Node `rank`'s container, or a spare's by its number (one past the ranks)."""
        return next((n for n in self.nodes if n.rank == rank),
                    DockerNode(rank=rank, container=container_name(cluster, rank),
                               hostname=f"node-{rank}"))


class DockerPlan(Plan):
    request: DockerRequest


def docker_request(spec: ClusterSpec) -> DockerRequest:
    return DockerRequest(
        network=network_name(spec.name),
        nodes=[DockerNode(rank=r, container=container_name(spec.name, r), hostname=f"node-{r}")
               for r in range(spec.nodes)],
        slots=spec.gpus_per_node or DEFAULT_SLOTS,
        node_image=spec.options_as(DockerOptions),
    )


def build_plan(spec: ClusterSpec) -> DockerPlan:
    request = docker_request(spec)
    resources = [PlannedResource(kind="network", name=request.network,
                                 details={"driver": "bridge",
                                          "reaches": "this cluster's nodes only"})]
    resources += [PlannedResource(kind="container", name=n.container,
                                  details={"hostname": n.hostname, "ssh": "127.0.0.1:<random port>"})
                  for n in request.nodes]
    boot = request.node_image.simulate_boot
    _check_boot(boot)
    notes = [f"--simulate-boot {boot:g}: each node answers SSH {boot:g} s after it starts, "
             "as a booting cloud VM (a new node and a replacement alike)"] if boot else []
    return DockerPlan(provider="docker", cluster=spec.name, nodes=spec.nodes,
                      slots_per_node=request.slots, resources=resources, request=request,
                      node_hourly_usd=0.0, notes=notes)


def _check_boot(boot: float) -> None:
    """A boot longer than bootstrap waits for SSH would fail every `up`: said before."""
    from provision.nodes.bootstrap import SSH_DEADLINE_S

    if boot and boot + 30 > SSH_DEADLINE_S:
        raise UserInputError(
            f"--simulate-boot {boot:g}: bootstrap waits {SSH_DEADLINE_S:g} s for a node's SSH",
            hint=f"at most {SSH_DEADLINE_S - 30:g} s, or raise the wait: "
                 f"MGPU_CLOUD_SSH_DEADLINE={boot + 60:g}")
