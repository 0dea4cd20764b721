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
from provision.model.errors import UserInputError
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

    def node(self, rank: int, cluster: str) -> DockerNode:
        """Node `rank`'s container, or a spare's by its number (one past the ranks)."""
        return next((n for n in self.nodes if n.rank == rank),
                    DockerNode(rank=rank, container=container_name(cluster, rank),
                               hostname=f"node-{rank}"))


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
