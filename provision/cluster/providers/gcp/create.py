"""Create a GCP cluster: firewall rules (and GPUDirect's data networks and their rules), the
first region's resource policy and data subnets, then N instances in one zone (placement.py: zone and region
failover), then each VM's own host key read from Compute (hostkeys.py).

All-or-nothing overall: on any failure the pipeline deletes everything recorded
(GcpProvider.destroy). Every resource is recorded before its insert is sent (writes.py).
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.gcp import bodies, gpudirect, hostkeys, placement, teardown
from provision.cluster.providers.gcp.catalog import fabric_expectation
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.layout import Layout
from provision.cluster.providers.gcp.plan import GcpPlan
from provision.cluster.providers.gcp.writes import insert_all, request_id
from provision.model.errors import ProvisionError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, PreemptionSource
from provision.model.keys import ensure_cluster_key
from provision.model.logsink import Log
from provision.model.render import parse_env_file, render
from provision.model.spec import ClusterSpec
from provision.model.timeline import reached

LOGIN_USER = bodies.LOGIN_USER
# Where a node reads preemption and maintenance notices (remote/preempt.py "gcp").
METADATA_URL = "http://metadata.google.internal"


def _create_firewalls(clients: Clients, store: InventoryStore, inv: Inventory,
                      layout: Layout) -> None:
    from google.cloud import compute_v1

    insert_all(clients, store, inv, [
        (teardown.firewall_record(clients.project, b.name), clients.firewalls.insert_unary,
         compute_v1.InsertFirewallRequest(project=clients.project, firewall_resource=b,
                                          request_id=request_id()))
        for b in bodies.firewall_bodies(layout)])


def _create_data_networks(clients: Clients, store: InventoryStore, inv: Inventory,
                          layout: Layout) -> None:
    """GPUDirect (global part): the data networks, then their firewall rules; the inserts of
    one kind are sent together, then waited for. The subnets are regional (placement.py)."""
    from google.cloud import compute_v1

    networks, _subnets, firewalls = bodies.data_network_bodies(layout)
    project = clients.project
    insert_all(clients, store, inv, [
        (teardown.network_record(project, b.name), clients.networks.insert_unary,
         compute_v1.InsertNetworkRequest(project=project, network_resource=b,
                                         request_id=request_id()))
        for b in networks])
    insert_all(clients, store, inv, [
        (teardown.firewall_record(project, b.name), clients.firewalls.insert_unary,
         compute_v1.InsertFirewallRequest(project=project, firewall_resource=b,
                                          request_id=request_id()))
        for b in firewalls])


def node_record(rank: int, inst: Any, zone: str, slots: int, host_key: str) -> NodeRecord:
    nic = inst.network_interfaces[0]
    external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
    if not external:
        raise ProvisionError(f"instance {inst.name} has no external address")
    return NodeRecord(
        name=f"node-{rank}", rank=rank, address=external, private_address=nic.network_i_p,
        user=LOGIN_USER, slots=slots, host_key=host_key, resource_id=inst.name, zone=zone,
    )


def nccl_env(layout: Layout) -> dict[str, str]:
    stack = layout.gpu_direct
    text = render(gpudirect.nccl_preset(stack), cluster=layout.cluster,
                  machine_type=layout.machine_type, socket_ifname="^lo,docker",
                  socket_nthreads=4, nsocks_perthread=4, stack=stack, nics_env=gpudirect.NICS_ENV,
                  uds_path=gpudirect.TCPX_UDS_PATH, aperture_devices=gpudirect.APERTURE_DEVICES)
    return parse_env_file(text)


def _node_side(inv: Inventory, spec: ClusterSpec, layout: Layout) -> None:
    inv.wait_for_gpu = True
    inv.manage_etc_hosts = True
    inv.container_image = layout.training_image  # checked against the GPUs by `plan`
    inv.gpu_model = layout.gpu_model
    inv.nccl_env = nccl_env(layout)  # saved with the first record
    inv.container_args = gpudirect.container_args(layout.gpu_direct)
    inv.container_library_path = gpudirect.library_path(layout.gpu_direct)
    inv.fabric = fabric_expectation(layout.machine_type)
    # Every cluster watches the metadata server, spot or not: GPU VMs cannot live-migrate
    # (onHostMaintenance TERMINATE), so host maintenance ends them like a preemption, but with
    # a one-hour notice (remote/preempt.py); spot VMs get `preempted` ~30 s ahead.
    inv.preemption = PreemptionSource(protocol="gcp", url=METADATA_URL)


def create(spec: ClusterSpec, plan: GcpPlan, inv: Inventory, store: InventoryStore,
           clients: Clients, log: Log) -> None:
    """See the module docstring. Fills inv.nodes (host keys pinned from Compute) and the
    node-side settings. On failure it raises; the pipeline deletes what the inventory
    recorded."""
    key_path, login_public = ensure_cluster_key(store.keys_dir(inv.name))
    inv.key_path = str(key_path)
    _node_side(inv, spec, plan.layout)
    layout = plan.layout  # its training_image is pulled by the nodes from boot on (bodies)
    _create_firewalls(clients, store, inv, layout)
    _create_data_networks(clients, store, inv, layout)
    placement.make_regional(clients, store, inv, layout)
    used, zone, instances = placement.place(clients, store, inv, layout, login_public, log)
    reached(inv, "nodes running", part_of="create call", detail=f"{len(instances)} node(s)")
    nodes = {inst.name: f"node-{rank}" for rank, inst in enumerate(instances)}
    keys = hostkeys.read_host_keys(clients, zone, nodes)
    inv.nodes = [node_record(rank, inst, zone, used.slots, keys[inst.name])
                 for rank, inst in enumerate(instances)]
    store.save(inv)
