"""The docker provider's typed plan: what `create` makes, resolved from the spec once.

    network     mgpu-cloud (bridge), shared by every docker cluster: made by the first `up`
                that finds it missing, never removed by `down` (as kind's "kind" network)
    containers  NAME-node-R with hostname node-R (the others reach it by name through the
                /etc/hosts block bootstrap writes, as on the clouds), SSH on 127.0.0.1 only
Nothing here talks to the engine except `plan`'s reachability check (in provider.py).
"""

from __future__ import annotations

from provision.cluster.providers.docker.options import DockerOptions
from provision.model.base import StrictModel
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec

DEFAULT_SLOTS = 2


# One network for every docker cluster. A network per cluster cost ~0.3 s of engine time in
# each `run` (made 0.08-0.09 s, removed 0.18-0.20 s, measured on this machine's engine;
# benchmarks/run_overhead.py): a third of a 2x2 run's overhead, for an isolation between
# local rehearsal clusters of one user that nothing needs. Old inventories may still record a
# NAME-net network: `down` removes what an inventory records.
SHARED_NETWORK = "mgpu-cloud"
SHARED_LABEL = "mgpu-cloud-network"  # = "shared"; not the cluster label: no cluster owns it


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

    def node(self, rank: int) -> DockerNode:
        return next(n for n in self.nodes if n.rank == rank)


class DockerPlan(Plan):
    request: DockerRequest


def docker_request(spec: ClusterSpec) -> DockerRequest:
    return DockerRequest(
        network=SHARED_NETWORK,
        nodes=[DockerNode(rank=r, container=container_name(spec.name, r), hostname=f"node-{r}")
               for r in range(spec.nodes)],
        slots=spec.gpus_per_node or DEFAULT_SLOTS,
        node_image=spec.options_as(DockerOptions),
    )


def build_plan(spec: ClusterSpec) -> DockerPlan:
    request = docker_request(spec)
    resources = [PlannedResource(kind="network", name=request.network,
                                 details={"driver": "bridge",
                                          "shared": "by every docker cluster, kept after down"})]
    resources += [PlannedResource(kind="container", name=n.container,
                                  details={"hostname": n.hostname, "ssh": "127.0.0.1:<random port>"})
                  for n in request.nodes]
    return DockerPlan(provider="docker", cluster=spec.name, nodes=spec.nodes,
                      slots_per_node=request.slots, resources=resources, request=request)
