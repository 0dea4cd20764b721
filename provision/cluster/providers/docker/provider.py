"""Docker provider: nodes are containers of the node image on this machine's engine.

Per cluster NAME (everything labelled mgpu-cloud-cluster=NAME):
    network     NAME-net, the cluster's own bridge (plan.py: no node reaches another
                cluster's containers)
    containers  NAME-node-0 .. NAME-node-(N-1), hostname node-R, on NAME-net, without
                NET_RAW (plan.DROPPED_CAPS); the others reach node-R through the /etc/hosts
                block bootstrap writes (its address: the container's IP there), as on the
                clouds.
                SSH published on 127.0.0.1 only (a random port); its host key (made by the
                tool, pinned before the first login) and the cluster key's public half in
                authorized_keys are copied in between create and start (environment.py),
                never in the container's environment. A file:// store: only its
                PREFIX/NAME/data folder is mounted.
`down`, `replace` and `gc` remove only what the engine labels as the cluster's (removal.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from provision.cluster.providers.contract import KeepsSpares, Recoverable, Supervising
from provision.cluster.providers.docker.engine import docker_client, map_errors
from provision.cluster.providers.docker.environment import (
    boot_entrypoint,
    copy_login_files,
    node_binds,
)
from provision.cluster.providers.docker.options import DockerOptions
from provision.cluster.providers.docker.plan import (
    DROPPED_CAPS,
    DockerNode,
    DockerPlan,
    DockerRequest,
    build_plan,
    docker_request,
    network_of,
)
from provision.cluster.providers.docker.removal import (
    delete_orphans,
    orphans,
    remove_containers,
    remove_networks,
    retire_node,
)
from provision.cluster.providers.spares import Estimate
from provision.model.errors import ClusterExistsError, TeardownError, UserInputError
from provision.model.inventory import (
    CLUSTER_TAG,
    Inventory,
    InventoryStore,
    NodeRecord,
    PreemptionSource,
    ResourceRecord,
)
from provision.model.render import parse_env_file, render
from provision.model.spec import ClusterSpec
from provision.model.timeline import reached
from provision.nodes import background, fan_out
from provision.nodes.pool import provider_waits

if TYPE_CHECKING:
    from provision.model.keys import KeyPair

log = logging.getLogger("mgpu_cloud")

# The stand-in for the cloud metadata service on docker nodes (remote/preempt.py "file"
# protocol): a notice is a file `instance-action` written into this folder on a node.
METADATA_STANDIN = "/tmp/mgpu-metadata"  # noqa: S108 - inside the node container
NODE_LABEL = "mgpu-cloud-node"


class DockerProvider(Recoverable[DockerPlan], KeepsSpares[DockerPlan], Supervising[DockerPlan]):
    name = "docker"

    def plan_class(self) -> type[DockerPlan]:
        return DockerPlan

    def errors(self, action: str, *, planning: bool = False) -> AbstractContextManager[Any]:
        return map_errors(action)

    def _plan(self, spec: ClusterSpec) -> DockerPlan:
        client = docker_client()  # Docker not reachable -> clear error before anything is made
        _refuse_leftovers(client, spec.name)
        plan = build_plan(spec)
        _refuse_a_foreign_network(client, plan.request.network, spec.name)
        return plan

    # ---------------------------------------------------------------------------------------
    def _create(self, spec: ClusterSpec, plan: DockerPlan, inv: Inventory,
                store: InventoryStore) -> None:
        """Engine calls go out as early as possible; the tool's own work (keys, image lookup,
        inventory writes; then the NCCL preset and the SSH stack's imports) happens while
        the engine is busy. On failure it raises; the pipeline removes what the inventory
        recorded."""
        from provision.cluster.providers.docker.images import ensure_node_image

        request = plan.request
        client = docker_client()
        store_lock = threading.Lock()  # inventory writes come from several threads

        def record(kind: str, rid: str, name: str) -> None:
            extra = {"image": image} if kind == "container" else {}
            with store_lock:
                store.record(inv, ResourceRecord(kind=kind, id=rid, name=name, extra=extra))

        # Low-level API calls: the SDK's model methods add an inspect after every create.
        api = client.api
        image = ""

        def make_network() -> None:
            with map_errors(f"creating the network {request.network}"):
                nid = ensure_cluster_network(api, request.network, spec.name)
            record("network", nid, request.network)

        def start(node: DockerNode) -> NodeRecord:
            return _start_container(api, inv, request, image, node, host_keys[node.rank],
                                    public_key, record)

        net_future = background(make_network)
        try:
            # Imported here: cryptography loads while the engine makes the network.
            from provision.model.keys import ensure_cluster_key, generate_ed25519

            key_path, public_key = ensure_cluster_key(store.keys_dir(spec.name))
            host_keys = [generate_ed25519(f"node-{r}") for r in range(spec.nodes)]
            with store_lock:
                inv.key_path = str(key_path)
                store.save(inv)
            image = ensure_node_image(request.node_image, log=log.info, client=client)
        finally:
            # On failure, wait until the network is recorded, so the rollback removes it.
            exc = net_future.exception()
        if exc is not None:
            raise exc
        started = background(lambda: fan_out(request.nodes, start))
        try:
            # While the engine starts the containers (~0.4 s): bootstrap's imports (when the
            # pipeline asked for them) and the NCCL preset (its first render imports Jinja2).
            provider_waits()
            nccl_env = parse_env_file(render("nccl/docker.env.j2", gpus=request.node_image.gpus))
            with store_lock:
                inv.nccl_env = nccl_env
                inv.preemption = PreemptionSource(protocol="file", url=METADATA_STANDIN)
        finally:
            # As above: every container recorded before a failure goes to the rollback.
            exc = started.exception()
        if exc is not None:
            raise exc
        inv.nodes = started.result()
        inv.manage_etc_hosts = True  # node-R -> its IP on the cluster's network (bootstrap)
        reached(inv, "nodes running", part_of="create call",
                detail=f"{len(inv.nodes)} container(s)")
        store.save(inv)

    # --- recovery -------------------------------------------------------------------------
    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when the node's container is gone or not running."""
        import docker.errors

        if not node.resource_id:
            return True
        try:
            state = docker_client().api.inspect_container(node.resource_id)["State"]
        except docker.errors.NotFound:
            return False
        return bool(state.get("Running")) and not state.get("Paused")

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """Remove the node's container (only when the engine labels it as the cluster's:
        NotTheClusters otherwise, nothing removed or made); start a new one with the same name
        and hostname and a new host key (its IP may differ: recovery's refresh_peers gives
        the others its new /etc/hosts line)."""
        image = _image_of(inv, node)
        self._retire(inv, store, node)
        new = _start_one(inv, store, node, image)
        inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
        store.save(inv)
        return new

    # --- warm spares (contract.KeepsSpares; issue 44) ---------------------------------------
    def _replacement_estimate(self, spec: ClusterSpec) -> Estimate:
        boot = spec.options_as(DockerOptions).simulate_boot
        return Estimate(boot + 1.0, (f"--simulate-boot {boot:g} s + " if boot else "") +
                        "~1 s to start a container and log in, measured here")

    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        """The node's container removed, when the engine labels it as the cluster's
        (NotTheClusters otherwise: nothing removed), and forgotten."""
        retire_node(docker_client().api, inv, store, node)

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        """A container NAME-node-S (S: the spare's number), booting like any node."""
        return _start_one(inv, store, spare, _image_of(inv, None))

    # --- managed runs: the controller (docker/controller.py; contract.Supervising) --------
    def _create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        from provision.cluster.providers.docker.controller import create_controller

        return create_controller(inv, store)

    def _teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.docker.controller import teardown_from_inside

        teardown_from_inside(inv, store)

    def _remove_lost_controller(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.docker.controller import remove_lost

        remove_lost(inv, store)

    def _remove_controller_from_inside(self, inv: Inventory) -> None:
        from provision.cluster.providers.docker.controller import remove_self

        remove_self(inv)

    # ---------------------------------------------------------------------------------------
    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Every container and network the inventory names or the engine labels with the
        cluster, the controller first; only what the engine labels as the cluster's
        (removal.py): another one the inventory names is refused by name, left as it is and
        dropped from the inventory."""
        import docker.errors

        from provision.cluster.providers.docker.controller import controller_ids

        api = docker_client().api
        by_label = {"label": f"{CLUSTER_TAG}={inv.name}"}
        listed: set[str] = set()
        # the engine's list answers ids and labels at once (containers.list inspects each)
        with contextlib.suppress(docker.errors.APIError):
            listed = {c["Id"] for c in api.containers(all=True, filters=by_label)}
        # the controller first: while the nodes go it could otherwise replace one (issue 18)
        done = remove_containers(api, inv.name, [r.id for r in inv.resources_of("container")],
                                 listed=listed, first=controller_ids(inv, api))
        # its own network (recorded, labelled); a cluster of the shared network's time has
        # none: the shared one carries no cluster's label and stays
        nets: set[str] = set()
        with contextlib.suppress(docker.errors.APIError):
            nets = {n["Id"] for n in api.networks(filters=by_label)}
        remove_networks(api, inv.name, [r.id for r in inv.resources_of("network")],
                        listed=nets, into=done)
        done.forget(inv, store)
        done.raise_for(f"the inventory is kept; retry with: mgpu-cloud down {inv.name}")

    # ---------------------------------------------------------------------------------------
    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return orphans(docker_client(), known)

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        """Each as the cluster its label named when `gc` listed it, checked again now: the
        list alone removes nothing."""
        delete_orphans(docker_client().api, resources)


def _refuse_leftovers(client: Any, name: str) -> None:
    """Containers of a cluster of this name that no inventory here knows (a run killed with
    the machine, or one made under another MGPU_CLOUD_HOME) would make `up` fail half-way:
    a container name is unique per engine. Said before anything is made."""
    found = client.api.containers(all=True, filters={"label": f"{CLUSTER_TAG}={name}"})
    if not found:
        return
    names = sorted(n.lstrip("/") for c in found for n in c["Names"])
    raise ClusterExistsError(
        f"the Docker engine already has container(s) of a cluster named {name!r} that no "
        f"inventory here knows: {', '.join(names)} (left by a run that was killed, or made "
        "with another MGPU_CLOUD_HOME)",
        hint=f"remove them: docker rm -f {' '.join(names)} "
             "(`mgpu-cloud gc --provider docker` lists every such leftover), or pick another "
             "--name")


def _refuse_a_foreign_network(client: Any, name: str, cluster: str) -> None:
    """A network of the cluster's network name that is not labelled as that cluster's (made
    by hand, by another tool): said at plan time, before anything is made, rather than
    joined. One labelled as the cluster's (left by a run that was killed) is used."""
    import docker.errors

    try:
        found = client.api.inspect_network(name)
    except docker.errors.NotFound:
        return
    if (found.get("Labels") or {}).get(CLUSTER_TAG) != cluster:
        raise UserInputError(
            f"the Docker engine has a network named {name!r} that is not cluster {cluster!r}'s "
            f"(driver {found.get('Driver')!r}, no label {CLUSTER_TAG}={cluster}); the "
            "cluster's nodes would join it",
            hint=f"if nothing of yours uses it: docker network rm {name}; or pick another "
                 "--name")


def ensure_cluster_network(api: Any, name: str, cluster: str) -> str:
    """The cluster's own bridge network, labelled with it; its id. One left by a killed run
    (the plan checked its label) is used: the engine answers 409 to a name it has
    (CheckDuplicate, which engines before API 1.44 do not assume)."""
    import docker.errors

    try:
        return str(api.create_network(name, driver="bridge", check_duplicate=True,
                                      labels={CLUSTER_TAG: cluster})["Id"])
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
    return str(api.inspect_network(name)["Id"])


def _request_of(inv: Inventory, node: NodeRecord) -> DockerRequest:
    """The request `node` was made from (replace: from the inventory's typed spec)."""
    if inv.spec is None:
        raise TeardownError(f"cluster {inv.name!r}: its inventory has no spec to replace "
                            f"{node.name} from")
    request = docker_request(inv.spec)
    request.slots = node.slots
    request.network = network_of(inv)  # its own; the shared one of an older cluster
    return request


def _start_container(api: Any, inv: Inventory, request: DockerRequest, image: str,
                     node: DockerNode, host_key: KeyPair, public_key: str,
                     record: Callable[[str, str, str], None]) -> NodeRecord:
    """Create and start `node`'s container (recorded before it starts); its NodeRecord.
    Translates its own SDK errors (not only the `errors` hook): several containers start in
    parallel, and the message must name the one that failed."""
    from provision.model.keys import host_key_only

    name, rank, opts = node.container, node.rank, request.node_image
    net_name = request.network
    host: dict[str, Any] = {"port_bindings": {22: ("127.0.0.1", None)},
                            "network_mode": net_name, "shm_size": "1g",
                            "cap_drop": DROPPED_CAPS}
    if opts.cpus:
        host["nano_cpus"] = int(opts.cpus * 1e9)
    if opts.memory:
        host["mem_limit"] = opts.memory
    if binds := node_binds(inv):  # a file:// store: its data/ folder (environment.py)
        host["binds"] = binds
    if opts.gpus:
        import docker.types

        host["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    with map_errors(f"creating container {name}"):
        cid = api.create_container(
            image,
            name=name,
            hostname=node.hostname,
            labels={CLUSTER_TAG: inv.name, NODE_LABEL: str(rank)},
            ports=[22],
            host_config=api.create_host_config(**host),
            detach=True,
            entrypoint=boot_entrypoint(api, image, opts.simulate_boot),
        )["Id"]
    record("container", cid, name)
    with map_errors(f"starting container {name}"):
        copy_login_files(api, cid, host_key, public_key)
        api.start(cid)
        settings = api.inspect_container(cid)["NetworkSettings"]
    return NodeRecord(
        name=node.hostname, rank=rank, address="127.0.0.1",
        port=int(settings["Ports"]["22/tcp"][0]["HostPort"]),
        private_address=settings["Networks"][net_name]["IPAddress"], user="root",
        slots=request.slots, host_key=host_key_only(host_key.public_openssh), resource_id=cid,
    )


def _image_of(inv: Inventory, node: NodeRecord | None) -> str:
    """The node image `node` (else any node) was made from: the same for every node."""
    old = next((r for r in inv.resources_of("container")
                if node is not None and r.id == node.resource_id), None)
    image = (old.extra.get("image") if old else None) or next(
        (r.extra["image"] for r in inv.resources_of("container") if r.extra.get("image")), "")
    if not image and node is not None and node.resource_id:
        image = docker_client().api.inspect_container(node.resource_id)["Config"]["Image"]
    if not image:
        raise TeardownError(f"cluster {inv.name!r}: its inventory names no node image")
    return str(image)


def _start_one(inv: Inventory, store: InventoryStore, node: NodeRecord,
               image: str) -> NodeRecord:
    """A new container for `node`'s name and rank (a replacement, or a spare by its number),
    with a new host key, recorded before it starts."""
    from provision.model.keys import ensure_cluster_key, generate_ed25519

    request = _request_of(inv, node)
    _, public_key = ensure_cluster_key(store.keys_dir(inv.name))

    def record(kind: str, rid: str, name: str) -> None:
        store.record(inv, ResourceRecord(kind=kind, id=rid, name=name, extra={"image": image}))

    return _start_container(docker_client().api, inv, request, image,
                            request.node(node.rank, inv.name), generate_ed25519(node.name),
                            public_key, record)
