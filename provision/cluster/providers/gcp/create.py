"""Create a GCP cluster: placement policy, firewall rules, then N instances in one zone.

The N instances are ONE instances.bulkInsert with count = minCount = N: Compute makes all of
them or none ("If min_count instances cannot be created, then no instances will be created and
instances already created will be deleted", BulkInsertInstanceResource), like AWS's one
RunInstances; a stockout fails the whole call and the next zone is tried. One insert and one
operation instead of N of each.

All-or-nothing overall: on any failure the pipeline deletes everything recorded
(GcpProvider.destroy). Each resource is recorded in the inventory before its insert is sent
(its name, chosen here, is its id), so even an insert whose reply is lost is found by `down`.
Every insert carries a requestId that is reused by the retries of that insert, so a retry never
makes a second resource. A 409 on an insert means a name belongs to something that is not
ours: the records are dropped (rollback must not delete it) and the error names it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from provision.cluster.providers.gcp import gpudirect, teardown
from provision.cluster.providers.gcp.catalog import fabric_expectation
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.errors import OperationFailed, is_conflict, map_errors
from provision.cluster.providers.gcp.plan import NETWORK, GcpPlan, Layout
from provision.model.errors import CapacityError, ProvisionError
from provision.model.inventory import (
    CLUSTER_TAG,
    Inventory,
    InventoryStore,
    NodeRecord,
    PreemptionSource,
    ResourceRecord,
)
from provision.model.keys import KeyPair, ensure_cluster_key, generate_ed25519, host_key_only
from provision.model.render import parse_env_file, render
from provision.model.spec import ClusterSpec
from provision.nodes.container import DEFAULT_TRAINING_IMAGE

LOGIN_USER = "mgpu"
DISK_TYPE = "pd-balanced"
# Where a node reads preemption and maintenance notices (remote/preempt.py "gcp").
METADATA_URL = "http://metadata.google.internal"
Log = Callable[[str], None]


def _insert(clients: Clients, store: InventoryStore, inv: Inventory,
            recs: list[ResourceRecord], method: Any, request: Any) -> Any:
    """Record `recs`, send the insert (retried with the same requestId), return its Operation."""
    what = f"creating {recs[0].kind} {', '.join(str(r.name) for r in recs)}"
    for rec in recs:
        store.record(inv, rec)
    with map_errors(what):
        try:
            return clients.call(method, request)
        except Exception as exc:
            if is_conflict(exc):
                for rec in recs:
                    store.forget(inv, rec.kind, rec.id)
                raise ProvisionError(
                    f"{what}: a {recs[0].kind} of that name already exists in project "
                    f"{clients.project!r} and is not part of this cluster",
                    hint="if it is left from an earlier cluster of this name, list and remove "
                    f"it: mgpu-cloud gc --provider gcp --project {clients.project} --delete",
                ) from exc
            raise


def _wait(clients: Clients, op: Any, what: str) -> Any:
    with map_errors(what):
        return clients.wait(op, what)


def policy_body(layout: Layout) -> Any:
    from google.cloud import compute_v1

    group: dict[str, Any] = {"collocation": "COLLOCATED"}
    if layout.nodes >= 2:  # one node: no count (whether 1 is accepted is not documented)
        group["vm_count"] = layout.nodes
    return compute_v1.ResourcePolicy(
        name=layout.policy_name,
        description=f"{CLUSTER_TAG}={layout.cluster}",
        group_placement_policy=group,
    )


def firewall_bodies(layout: Layout) -> list[Any]:
    from google.cloud import compute_v1

    ssh_name, internal_name = layout.firewall_names
    common = {"network": NETWORK, "direction": "INGRESS", "priority": 1000,
              "target_tags": [layout.tag], "description": f"{CLUSTER_TAG}={layout.cluster}"}
    return [
        compute_v1.Firewall(name=ssh_name, source_ranges=[layout.ssh_cidr],
                            allowed=[{"I_p_protocol": "tcp", "ports": ["22"]}], **common),
        compute_v1.Firewall(name=internal_name, source_tags=[layout.tag],
                            allowed=[{"I_p_protocol": "all"}], **common),
    ]


def data_network_bodies(layout: Layout) -> tuple[list[Any], list[Any], list[Any]]:
    """The GPUDirect data networks, their subnets and firewall rules (gpudirect.py); three
    empty lists without GPUDirect."""
    from google.cloud import compute_v1

    tag = f"{CLUSTER_TAG}={layout.cluster}"
    nets = layout.data_networks
    networks = [compute_v1.Network(name=n.name, auto_create_subnetworks=False,
                                   mtu=gpudirect.DATA_MTU, description=tag) for n in nets]
    subnets = [compute_v1.Subnetwork(name=n.name, network=f"global/networks/{n.name}",
                                     ip_cidr_range=n.cidr, region=layout.region,
                                     description=tag) for n in nets]
    firewalls = [compute_v1.Firewall(
        name=n.firewall, network=f"global/networks/{n.name}", direction="INGRESS",
        priority=1000, source_ranges=[n.cidr], description=tag,
        allowed=[{"I_p_protocol": proto} for proto in ("tcp", "udp", "icmp")])
        for n in nets]
    return networks, subnets, firewalls


def _network_interfaces(layout: Layout) -> list[dict[str, Any]]:
    # nic0: the external address is how a node reaches the internet (image pulls, pip) and
    # how the controller reaches it: the default network has a route to the internet gateway,
    # and no Cloud NAT. GPUDirect data NICs: one per data network, internal only.
    nics: list[dict[str, Any]] = [{
        "network": NETWORK,
        "nic_type": "GVNIC",
        "access_configs": [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT",
                            "network_tier": "PREMIUM"}],
    }]
    nics += [{"network": f"global/networks/{n.name}",
              "subnetwork": f"regions/{layout.region}/subnetworks/{n.name}",
              "nic_type": "GVNIC"} for n in layout.data_networks]
    return nics


def startup_script(layout: Layout, host_key: KeyPair) -> str:
    stack = layout.gpu_direct
    return render(
        "gcp/startup.sh.j2", cluster=layout.cluster, user=LOGIN_USER,
        host_private_key=host_key.private_openssh.strip(),
        host_public_key=host_key_only(host_key.public_openssh),
        max_run_seconds=layout.max_run_seconds, gpudirect=stack,
        run_dir=gpudirect.RUN_DIR, done_marker=gpudirect.DONE_MARKER,
        status_file=gpudirect.STATUS_FILE, setup_log=gpudirect.SETUP_LOG,
        uds_path=gpudirect.TCPX_UDS_PATH, aperture_devices=gpudirect.APERTURE_DEVICES,
    )


def instance_properties(layout: Layout, login_public_key: str, host_key: KeyPair) -> Any:
    """What every node of the bulkInsert shares. InstanceProperties take names, not URLs, for
    machineType ("the request will result in an INTERNAL_ERROR" otherwise), resourcePolicies,
    the disk type and the accelerator type (InstanceProperties / AttachedDiskInitializeParams /
    AcceleratorConfig reference)."""
    from google.cloud import compute_v1

    labels = {CLUSTER_TAG: layout.cluster}
    startup = startup_script(layout, host_key)
    body: dict[str, Any] = {
        "description": f"{CLUSTER_TAG}={layout.cluster}",
        "machine_type": layout.machine_type,
        "labels": labels,
        "tags": {"items": [layout.tag]},
        "resource_policies": [layout.policy_name],
        "scheduling": {
            "on_host_maintenance": "TERMINATE",
            "automatic_restart": False,
            "provisioning_model": "SPOT" if layout.spot else "STANDARD",
            # One action for both: spot preemption and the end of maxRunDuration delete the VM.
            "instance_termination_action": "DELETE",
            "max_run_duration": {"seconds": layout.max_run_seconds},
        },
        "disks": [{
            "boot": True,
            "auto_delete": True,
            "type_": "PERSISTENT",
            "initialize_params": {
                "source_image": layout.image,
                "disk_size_gb": layout.disk_gb,
                "disk_type": DISK_TYPE,
                "labels": labels,
            },
        }],
        "network_interfaces": _network_interfaces(layout),
        "metadata": {"items": [
            {"key": "ssh-keys", "value": f"{LOGIN_USER}:{login_public_key}"},
            {"key": "enable-oslogin", "value": "FALSE"},
            {"key": "install-nvidia-driver", "value": "True"},
            {"key": "startup-script", "value": startup},
        ]},
    }
    if layout.accelerator_type:
        body["guest_accelerators"] = [{
            "accelerator_type": layout.accelerator_type,
            "accelerator_count": layout.gpus,
        }]
    return compute_v1.InstanceProperties(body)


def bulk_insert_body(layout: Layout, login_public_key: str, host_key: KeyPair,
                     names: list[str] | None = None) -> Any:
    """All N nodes (or the `names` given: a replacement), named, all or nothing
    (count = minCount = the number of names)."""
    from google.cloud import compute_v1

    names = names or [layout.instance_name(rank) for rank in range(layout.nodes)]
    return compute_v1.BulkInsertInstanceResource(
        count=len(names), min_count=len(names),
        per_instance_properties={n: compute_v1.BulkInsertInstanceResourcePerInstanceProperties()
                                 for n in names},
        instance_properties=instance_properties(layout, login_public_key, host_key),
    )


def _request_id() -> str:
    return str(uuid.uuid4())


def _create_policy(clients: Clients, store: InventoryStore, inv: Inventory,
                   layout: Layout) -> None:
    from google.cloud import compute_v1

    rec = teardown.policy_record(clients.project, layout.region, layout.policy_name)
    op = _insert(clients, store, inv, [rec], clients.resource_policies.insert_unary,
                 compute_v1.InsertResourcePolicyRequest(
                     project=clients.project, region=layout.region,
                     resource_policy_resource=policy_body(layout), request_id=_request_id()))
    _wait(clients, op, f"creating resource policy {layout.policy_name}")


def _create_firewalls(clients: Clients, store: InventoryStore, inv: Inventory,
                      layout: Layout) -> None:
    from google.cloud import compute_v1

    ops = []
    for body in firewall_bodies(layout):
        rec = teardown.firewall_record(clients.project, body.name)
        ops.append((body.name, _insert(
            clients, store, inv, [rec], clients.firewalls.insert_unary,
            compute_v1.InsertFirewallRequest(project=clients.project, firewall_resource=body,
                                             request_id=_request_id()))))
    for name, op in ops:
        _wait(clients, op, f"creating firewall rule {name}")


def _insert_all(clients: Clients, store: InventoryStore, inv: Inventory,
                inserts: list[tuple[ResourceRecord, Any, Any]]) -> None:
    """Send every (record, method, request) insert, then wait for all of them."""
    ops = [(rec, _insert(clients, store, inv, [rec], method, request))
           for rec, method, request in inserts]
    for rec, op in ops:
        _wait(clients, op, f"creating {rec.kind} {rec.name}")


def _create_data_networks(clients: Clients, store: InventoryStore, inv: Inventory,
                          layout: Layout) -> None:
    """GPUDirect: the data networks, then their subnets, then their firewall rules; the
    inserts of one kind are sent together, then waited for."""
    from google.cloud import compute_v1

    networks, subnets, firewalls = data_network_bodies(layout)
    project, region = clients.project, layout.region
    _insert_all(clients, store, inv, [
        (teardown.network_record(project, b.name), clients.networks.insert_unary,
         compute_v1.InsertNetworkRequest(project=project, network_resource=b,
                                         request_id=_request_id()))
        for b in networks])
    _insert_all(clients, store, inv, [
        (teardown.subnetwork_record(project, region, b.name), clients.subnetworks.insert_unary,
         compute_v1.InsertSubnetworkRequest(project=project, region=region,
                                            subnetwork_resource=b, request_id=_request_id()))
        for b in subnets])
    _insert_all(clients, store, inv, [
        (teardown.firewall_record(project, b.name), clients.firewalls.insert_unary,
         compute_v1.InsertFirewallRequest(project=project, firewall_resource=b,
                                          request_id=_request_id()))
        for b in firewalls])


def _delete_zone_attempt(clients: Clients, store: InventoryStore, inv: Inventory,
                         zone: str) -> None:
    recs = [r for r in inv.resources if r.kind == teardown.INSTANCE and r.zone == zone]
    failures = teardown.delete_records(clients, recs,
                                       on_deleted=lambda r: store.forget(inv, r.kind, r.id))
    if failures:
        raise ProvisionError(f"could not clean up zone {zone} before trying the next one: "
                             + "; ".join(failures))


def _create_instances(clients: Clients, store: InventoryStore, inv: Inventory, layout: Layout,
                      login_public_key: str, host_key: KeyPair,
                      log: Log) -> tuple[str, list[Any]]:
    """All N instances in one zone (one bulkInsert), failing over to the next zone on
    capacity errors."""
    from google.cloud import compute_v1

    body = bulk_insert_body(layout, login_public_key, host_key)
    names = [layout.instance_name(rank) for rank in range(layout.nodes)]
    tried: list[str] = []
    for zone in layout.zones:
        recs = [teardown.instance_record(clients.project, zone, n, layout.image) for n in names]
        what = f"creating {layout.nodes} x {layout.machine_type} in {zone}"
        op = _insert(clients, store, inv, recs, clients.instances.bulk_insert_unary,
                     compute_v1.BulkInsertInstanceRequest(
                         project=clients.project, zone=zone, request_id=_request_id(),
                         bulk_insert_instance_resource_resource=body))
        failed: OperationFailed | None = None
        with map_errors(what):
            try:
                clients.wait(op, what)
            except OperationFailed as exc:
                failed = exc
        if failed is None:
            return zone, _read_instances(clients, layout, zone, names)
        if not failed.zone_should_fail_over:
            hint = ("request more quota: https://console.cloud.google.com/iam-admin/quotas"
                    if failed.is_quota else None)
            raise ProvisionError(f"{failed}", hint=hint)
        tried.append(f"{zone} ({', '.join(sorted(set(failed.codes)))})")
        log(f"no capacity for {layout.nodes} x {layout.machine_type} in {zone}; "
            "removing what was made there and trying the next zone")
        _delete_zone_attempt(clients, store, inv, zone)
    raise CapacityError(
        f"no zone had capacity for {layout.nodes} x {layout.machine_type}"
        f"{' (spot)' if layout.spot else ''} under one compact placement policy; tried: "
        + "; ".join(tried),
        hint="try again later, with fewer --nodes, with --spot/--on-demand switched, or in "
        "another region (--zone)",
    )


def _read_instances(clients: Clients, layout: Layout, zone: str, names: list[str]) -> list[Any]:
    """The N new instances in rank order: one list call with the cluster label filter."""
    from google.cloud import compute_v1

    with map_errors(f"reading the instances in {zone}"):
        found = {i.name: i for i in clients.call(
            clients.instances.list, compute_v1.ListInstancesRequest(
                project=clients.project, zone=zone,
                filter=f'labels.{CLUSTER_TAG} = "{layout.cluster}"'))}
    missing = [n for n in names if n not in found]
    if missing:
        raise ProvisionError(f"the bulk insert in {zone} finished without {', '.join(missing)}")
    return [found[n] for n in names]


def _node_record(rank: int, inst: Any, zone: str, slots: int, host_public: str) -> NodeRecord:
    nic = inst.network_interfaces[0]
    external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
    if not external:
        raise ProvisionError(f"instance {inst.name} has no external address")
    return NodeRecord(
        name=f"node-{rank}", rank=rank, address=external, private_address=nic.network_i_p,
        user=LOGIN_USER, slots=slots, host_key=host_public, resource_id=inst.name, zone=zone,
    )


def nccl_env(layout: Layout) -> dict[str, str]:
    stack = layout.gpu_direct
    text = render(gpudirect.nccl_preset(stack), cluster=layout.cluster,
                  machine_type=layout.machine_type, socket_ifname="^lo,docker",
                  socket_nthreads=4, nsocks_perthread=4, stack=stack,
                  uds_path=gpudirect.TCPX_UDS_PATH, aperture_devices=gpudirect.APERTURE_DEVICES)
    return parse_env_file(text)


def create(spec: ClusterSpec, plan: GcpPlan, inv: Inventory, store: InventoryStore,
           clients: Clients, log: Log) -> None:
    """See the module docstring. Fills inv.nodes and the node-side settings. On failure it
    raises; the pipeline deletes what the inventory recorded."""
    layout = plan.layout
    key_path, login_public = ensure_cluster_key(store.keys_dir(inv.name))
    host_key = generate_ed25519(f"{inv.name}-host")
    inv.key_path = str(key_path)
    inv.wait_for_gpu = True
    inv.manage_etc_hosts = True
    inv.container_image = spec.image or DEFAULT_TRAINING_IMAGE
    inv.nccl_env = nccl_env(layout)  # saved with the first record below
    inv.container_args = gpudirect.container_args(layout.gpu_direct)
    inv.container_library_path = gpudirect.library_path(layout.gpu_direct)
    inv.fabric = fabric_expectation(layout.machine_type)
    # Every cluster watches the metadata server, spot or not: GPU VMs cannot live-migrate
    # (onHostMaintenance TERMINATE), so host maintenance ends them like a preemption, with
    # TERMINATE_ON_HOST_MAINTENANCE about 60 s ahead; spot VMs get `preempted` ~30 s ahead.
    inv.preemption = PreemptionSource(protocol="gcp", url=METADATA_URL)
    _create_policy(clients, store, inv, layout)
    _create_firewalls(clients, store, inv, layout)
    _create_data_networks(clients, store, inv, layout)
    zone, instances = _create_instances(clients, store, inv, layout, login_public, host_key,
                                        log)
    host_public = host_key_only(host_key.public_openssh)
    inv.nodes = [_node_record(rank, inst, zone, layout.slots, host_public)
                 for rank, inst in enumerate(instances)]
    store.save(inv)
