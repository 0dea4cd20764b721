"""The GCP controller VM (issue 18; docs/ARCHITECTURE.md, managed runs): the machine that
supervises managed runs, made at the cluster's first managed hand-off.

    identity      controller.py: the cluster's service account, custom role and conditional
                  bindings, made first, for the zone the nodes landed in (create's failover
                  decides it: one reason the controller is not made at `up`)
    VM            NAME-controller, ONE `GcpOptions.controller_machine_type` (e2-small: 2
                  shared vCPUs and 2 GB run the supervisor's python, the Compute client and an
                  SSH fan-out for ~$0.017/h), Debian 12 (python3.11 and Google's guest agent,
                  which publishes the host key), in node-0's zone on the default network with
                  the cluster's network tag (its firewall rules: SSH from the caller's range,
                  all traffic within the tag, so it reaches the nodes' private addresses),
                  NOT under the compact placement policy, running as the service account,
                  maxRunDuration = what is left of --max-hours (DELETE), the set-up of
                  controller_boot.py as its startup script; recorded (kind `instance`, extra
                  role=controller) before its insert is sent
    login         the controller's OWN key (keys.ensure_controller_key) in its ssh-keys
                  metadata, alone: the cluster key every node holds does not log in to it
    host key      its guest attribute hostkeys/ssh-ed25519, read through the API and pinned

From inside (its service account): `teardown_from_inside` deletes the cluster but itself,
`remove_self` deletes its own VM (the custom role names NAME-controller). The identity stays:
removing it needs the project's setIamPolicy, which would let the controller grant itself
anything; the user's next `jobs`/`logs` of the cluster runs `down` (client.forget_if_torn_down)
and `gc` finds it.
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.controller_boot import READY, setup_script
from provision.cluster.providers.gcp import hostkeys, teardown
from provision.cluster.providers.gcp.bodies import LOGIN_USER
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.layout import NETWORK
from provision.cluster.providers.gcp.writes import insert, request_id
from provision.model.errors import ProvisionError, TeardownError
from provision.model.inventory import (
    CLUSTER_TAG,
    Inventory,
    InventoryStore,
    NodeRecord,
    ResourceRecord,
)
from remote.store import parse_url

ROLE = "controller"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DISK_GB = 20
IDENTITY_KINDS = ("service-account", "iam-custom-role", "iam-binding")
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]  # the IAM grants limit it


def controller_name(cluster: str) -> str:
    return f"{cluster}-controller"


def is_controller(rec: ResourceRecord) -> bool:
    return rec.kind == teardown.INSTANCE and rec.extra.get("role") == ROLE


def instance_body(inv: Inventory, zone: str, email: str, login_public: str, machine_type: str,
                  seconds: int) -> Any:
    from google.cloud import compute_v1

    scheme = parse_url(inv.spec.store).scheme if inv.spec and inv.spec.store else None
    labels = {CLUSTER_TAG: inv.name}
    return compute_v1.Instance({
        "name": controller_name(inv.name),
        "description": f"{CLUSTER_TAG}={inv.name} (controller)",
        "machine_type": f"zones/{zone}/machineTypes/{machine_type}",
        "labels": labels,
        "tags": {"items": [f"mgpu-cloud-{inv.name}"]},  # layout.Layout.tag: the firewall rules
        "scheduling": {"provisioning_model": "STANDARD", "automatic_restart": False,
                       "on_host_maintenance": "MIGRATE", "instance_termination_action": "DELETE",
                       "max_run_duration": {"seconds": max(60, seconds)}},
        "disks": [{"boot": True, "auto_delete": True, "type_": "PERSISTENT",
                   "initialize_params": {"source_image": IMAGE, "disk_size_gb": DISK_GB,
                                         "labels": labels}}],
        "network_interfaces": [{"network": NETWORK, "access_configs": [
            {"name": "External NAT", "type_": "ONE_TO_ONE_NAT", "network_tier": "PREMIUM"}]}],
        "service_accounts": [{"email": email, "scopes": SCOPES}],
        "metadata": {"items": [
            {"key": "ssh-keys", "value": f"{LOGIN_USER}:{login_public}"},
            {"key": "enable-oslogin", "value": "FALSE"},
            {"key": "enable-guest-attributes", "value": "TRUE"},
            {"key": "startup-script", "value": setup_script(inv.name, "gcp", scheme)},
        ]},
    })


def _node_zone(inv: Inventory) -> str:
    zone = next((n.zone for n in inv.nodes if n.zone), None)
    if zone is None:
        raise ProvisionError(f"cluster {inv.name!r}: its inventory names no zone for its nodes")
    return zone


def create_controller(inv: Inventory, store: InventoryStore, clients: Clients) -> NodeRecord:
    """Identity, then the VM (each recorded before it is made), then its pinned host key.
    Raises without cleaning up: `down` deletes the records."""
    from google.cloud import compute_v1

    from provision.cluster.providers.gcp.controller import IamApi, create_identity
    from provision.cluster.providers.gcp.layout import DEFAULT_MAX_HOURS
    from provision.cluster.providers.gcp.options import GcpOptions
    from provision.cluster.providers.lifetime import remaining_seconds
    from provision.model.keys import ensure_controller_key

    assert inv.spec is not None
    zone, project, name = _node_zone(inv), clients.project, controller_name(inv.name)
    store_url = parse_url(inv.spec.store) if inv.spec.store else None
    email = create_identity(IamApi(), project, zone, inv.name, store_url,
                            lambda rec: store.record(inv, rec))
    _, login_public = ensure_controller_key(store.keys_dir(inv.name))
    left = remaining_seconds(inv, inv.spec.max_hours or DEFAULT_MAX_HOURS)
    body = instance_body(inv, zone, email, login_public,
                         inv.spec.options_as(GcpOptions).controller_machine_type, left)
    rec = teardown.instance_record(project, zone, name, IMAGE)
    rec.extra.update(role=ROLE, ready_file=READY)
    op = insert(clients, store, inv, [rec], clients.instances.insert_unary,
                compute_v1.InsertInstanceRequest(project=project, zone=zone,
                                                 instance_resource=body,
                                                 request_id=request_id()))
    clients.wait(op, f"creating the controller {name}")
    inst = clients.call(clients.instances.get, compute_v1.GetInstanceRequest(
        project=project, zone=zone, instance=name), f"looking up the controller {name}")
    key = hostkeys.read_host_keys(clients, zone, {name: "controller"})[name]
    nic = inst.network_interfaces[0]
    external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
    if not external:
        raise ProvisionError(f"the controller {name} has no external address")
    return NodeRecord(name="controller", rank=-1, address=external,
                      private_address=nic.network_i_p, user=LOGIN_USER, slots=0, host_key=key,
                      resource_id=name, zone=zone)


def teardown_from_inside(inv: Inventory, store: InventoryStore, clients: Clients) -> None:
    """Everything of the cluster but this VM and its identity. From the inventory alone: every
    VM is recorded before its insert is sent (writes.py), replacements by this controller
    too, and a label lookup would need instances.list, which a resource-name condition cannot
    scope. Idempotent; TeardownError naming what is left."""
    records = [r for r in inv.resources if not is_controller(r)
               and r.name != controller_name(inv.name) and r.kind not in IDENTITY_KINDS]
    failures = teardown.delete_records(clients, records,
                                       on_deleted=lambda r: store.forget(inv, r.kind, r.id),
                                       cluster=inv.name)
    if failures:
        raise TeardownError(f"could not delete every resource of cluster {inv.name!r} from "
                            "its controller: " + "; ".join(failures),
                            hint=f"run `mgpu-cloud down {inv.name}`")


def remove_self(inv: Inventory, clients: Clients) -> None:
    """Delete this VM (Compute stops it during the call: it may not return)."""
    own = [r for r in inv.resources if is_controller(r)]
    teardown.delete_records(clients, own, cluster=inv.name)
