"""The docker provider's controller: one container per cluster that supervises managed runs.

    NAME-controller   a container of the node image (it has the tool's dependencies), on the
                      cluster's network (plan.network_of), without NET_RAW, SSH on 127.0.0.1 only (host key made
                      by the tool, pinned), labelled with the cluster like the nodes (so `down`,
                      rollback and `gc` remove it). Its one credential is the engine's socket:
                      the docker provider's own credential (whoever can use the engine is root
                      on this machine already). A file:// store's folder is mounted at the same
                      path, as on every node.

From inside, the controller removes the cluster at the end of a `run --detach`: the node
containers first, only those the engine labels as the cluster's (removal.py), then the
cluster's network (it moves onto the engine's default network first, so the store and the
webhook stay reachable for its last records), and at last itself (the last call it makes;
the engine kills it). A cluster of the shared network's time keeps it (no cluster owns it).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from provision.cluster.providers.docker.engine import docker_client, map_errors
from provision.cluster.providers.docker.environment import controller_binds, copy_login_files
from provision.cluster.providers.docker.removal import (
    owned_container,
    remove_containers,
    remove_networks,
)
from provision.model.inventory import (
    CLUSTER_TAG,
    Inventory,
    InventoryStore,
    NodeRecord,
    ResourceRecord,
)

ROLE_LABEL = "mgpu-cloud-role"
DOCKER_SOCKET = "/var/run/docker.sock"


def controller_name(cluster: str) -> str:
    return f"{cluster}-controller"


def _image(inv: Inventory) -> str:
    for r in inv.resources_of("container"):
        if r.extra.get("image"):
            return r.extra["image"]
    from provision.cluster.providers.docker.images import ensure_node_image
    from provision.cluster.providers.docker.options import DockerOptions

    opts = inv.spec.options_as(DockerOptions) if inv.spec else DockerOptions()
    return ensure_node_image(opts, log=lambda m: None)


def create_controller(inv: Inventory, store: InventoryStore) -> NodeRecord:
    """Create and start the controller container (recorded before it starts)."""
    from provision.cluster.providers.docker.plan import DROPPED_CAPS, network_of
    from provision.model.keys import ensure_controller_key, generate_ed25519, host_key_only

    api = docker_client().api
    name = controller_name(inv.name)
    image = _image(inv)
    host_key = generate_ed25519("controller")
    _, public_key = ensure_controller_key(store.keys_dir(inv.name))
    binds = {DOCKER_SOCKET: {"bind": DOCKER_SOCKET, "mode": "rw"}, **controller_binds(inv)}
    net = network_of(inv)  # the cluster's nodes are there (made by their `up`)
    with map_errors(f"creating the controller {name}"):
        cid = api.create_container(
            image, name=name, hostname="controller",
            labels={CLUSTER_TAG: inv.name, ROLE_LABEL: "controller"},
            ports=[22],
            host_config=api.create_host_config(port_bindings={22: ("127.0.0.1", None)},
                                               network_mode=net, binds=binds,
                                               cap_drop=DROPPED_CAPS),
            detach=True,
        )["Id"]
    store.record(inv, ResourceRecord(kind="container", id=cid, name=name,
                                     extra={"image": image, "role": "controller"}))
    with map_errors(f"starting the controller {name}"):
        copy_login_files(api, cid, host_key, public_key)
        api.start(cid)
        settings = api.inspect_container(cid)["NetworkSettings"]
    return NodeRecord(name="controller", rank=-1, address="127.0.0.1",
                      port=int(settings["Ports"]["22/tcp"][0]["HostPort"]),
                      private_address=settings["Networks"][net]["IPAddress"],
                      user="root", slots=0, host_key=host_key_only(host_key.public_openssh),
                      resource_id=cid)


def _own_id(inv: Inventory) -> str | None:
    return inv.controller.resource_id if inv.controller is not None else None


def teardown_from_inside(inv: Inventory, store: InventoryStore) -> None:
    """Everything of the cluster but the controller itself, only what the engine labels as
    the cluster's (removal.py): node containers, then the cluster's network (after the
    controller left it). Idempotent; the caller then calls `remove_self`. TeardownError
    naming what could not be removed or was refused (left as it is)."""
    import docker.errors

    api = docker_client().api
    me = _own_id(inv)
    by_label = {"label": f"{CLUSTER_TAG}={inv.name}"}
    listed: set[str] = set()
    with contextlib.suppress(docker.errors.APIError):
        listed = {c["Id"] for c in api.containers(all=True, filters=by_label)}
    done = remove_containers(api, inv.name, [r.id for r in inv.resources_of("container")],
                             listed=listed, keep={me} if me else set())
    old = inv.resources_of("network")  # its own (none: a cluster of the shared network)
    if old:
        me = me or socket.gethostname()
        with contextlib.suppress(docker.errors.APIError):
            # onto the engine's default network first: the store and the webhook stay
            # reachable for the last records, once the cluster's network is gone
            api.connect_container_to_network(me, "bridge")
        for r in old:
            with contextlib.suppress(docker.errors.APIError):
                api.disconnect_container_from_network(me, r.id, force=True)
        remove_networks(api, inv.name, [r.id for r in old], listed=set(), into=done)
    done.forget(inv, store)
    done.raise_for(f"run `mgpu-cloud down {inv.name}` from the machine that made it")


def remove_self(inv: Inventory) -> None:
    """The controller's container removes itself: the engine kills this process during it.
    NotTheClusters (nothing removed) when the engine does not label it as the cluster's."""
    import docker.errors

    me = _own_id(inv)
    if me:
        api = docker_client().api
        with contextlib.suppress(docker.errors.APIError):
            cid = owned_container(api, inv.name, me)
            if cid is not None:
                api.remove_container(cid, force=True)


def remove_lost(inv: Inventory, store: InventoryStore) -> None:
    """A controller container that is gone or no longer answers, removed from here (only if
    the engine labels it as the cluster's) and forgotten (issue 36: a new one takes its job
    back)."""
    ids = {r.id for r in inv.resources_of("container") if r.extra.get("role") == "controller"}
    if inv.controller is not None and inv.controller.resource_id:
        ids.add(inv.controller.resource_id)
    out = remove_containers(docker_client().api, inv.name, sorted(ids), listed=set())
    out.forget(inv, store)
    out.raise_for(f"remove what is left by hand: docker rm -f {controller_name(inv.name)}")


def controller_ids(inv: Inventory, api: Any) -> set[str]:
    """The cluster's controller container(s), from the inventory and by label: `destroy`
    removes them before the nodes, so no replacement is made while the nodes go."""
    import docker.errors

    ids = {r.id for r in inv.resources_of("container") if r.extra.get("role") == "controller"}
    with contextlib.suppress(docker.errors.APIError):
        ids |= {c["Id"] for c in api.containers(all=True, filters={  # ids only: no inspects
            "label": [f"{CLUSTER_TAG}={inv.name}", f"{ROLE_LABEL}=controller"]})}
    return ids


def controller_of(api: Any, cluster: str) -> str | None:
    """The controller container's id (tests, `gc`)."""
    found = api.containers(all=True, filters={"label": [f"{CLUSTER_TAG}={cluster}",
                                                        f"{ROLE_LABEL}=controller"]})
    return str(found[0]["Id"]) if found else None
