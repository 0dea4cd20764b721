"""The docker provider's typed plan: what `create` makes, resolved from the spec once.

    network     NAME-net (bridge)
    containers  NAME-node-R with hostname and network alias node-R, SSH on 127.0.0.1 only
Nothing here talks to the engine except `plan`'s reachability check (in provider.py).
"""

from __future__ import annotations

from provision.cluster.providers.docker.options import DockerOptions
from provision.model.base import StrictModel
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec

DEFAULT_SLOTS = 2


def network_name(cluster: str) -> str:
    return f"{cluster}-net"


def container_name(cluster: str, rank: int) -> str:
    return f"{cluster}-node-{rank}"


class DockerNode(StrictModel):
    rank: int
    container: str  # NAME-node-R
    hostname: str  # node-R: hostname and network alias (how the other nodes reach it)


class DockerRequest(StrictModel):
    """What `create` (and `replace`, for one node) does, typed."""

    network: str
    nodes: list[DockerNode]
    slots: int
    node_image: DockerOptions  # which node image (built or given) and the per-node limits

    def node(self, rank: int) -> DockerNode:
        return next(n for n in self.nodes if n.rank == rank)


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
                                 details={"driver": "bridge"})]
    resources += [PlannedResource(kind="container", name=n.container,
                                  details={"hostname": n.hostname, "ssh": "127.0.0.1:<random port>"})
                  for n in request.nodes]
    return DockerPlan(provider="docker", cluster=spec.name, nodes=spec.nodes,
                      slots_per_node=request.slots, resources=resources, request=request)
