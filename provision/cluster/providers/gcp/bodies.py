"""The request bodies the gcp provider sends (pure: a Layout in, compute_v1 messages out), apart
from the calls that send them (create.py, placement.py, replace.py), so a test reads exactly
what `up` would send.

Sources of the shapes:
    InstanceProperties take names, not URLs, for machineType ("the request will result in an
        INTERNAL_ERROR" otherwise), resourcePolicies, the disk type and the accelerator type
        (InstanceProperties / AttachedDiskInitializeParams / AcceleratorConfig reference).
    Host keys: no key is sent. The guest agent makes the VM's own host keys at first boot and,
        with metadata `enable-guest-attributes=TRUE`, publishes the public halves as guest
        attributes `hostkeys/<type>` ("Set and query guest attributes",
        https://cloud.google.com/compute/docs/metadata/manage-guest-attributes;
        GoogleCloudPlatform/guest-agent instance_setup.go generateSSHKeys); hostkeys.py reads
        them through the authenticated API.
    Scheduling per provisioning model (Layout.provisioning_model):
        STANDARD / SPOT: maxRunDuration + DELETE ("Limit the run time of a VM"; "Create and use
            Spot VMs": a SPOT VM states its termination action);
        FLEX_START: maxRunDuration (<= 7 days) + a termination action, onHostMaintenance
            TERMINATE, reservationAffinity NO_RESERVATION ("About Flex-start VMs" /
            "Create a Flex-start VM", https://cloud.google.com/compute/docs/instances/
            create-flex-start-vm);
        RESERVATION_BOUND (a3-ultra / a4 from a future reservation): SPECIFIC_RESERVATION, the
            reservation's end stops or deletes the VMs per the termination action ("About
            reservation-bound instances",
            https://cloud.google.com/compute/docs/instances/about-reservation-bound-instances).
    reservationAffinity SPECIFIC_RESERVATION: key compute.googleapis.com/reservation-name,
        values [NAME or projects/P/reservations/NAME] ("ReservationAffinity", Compute API
        reference; "Consume reservations",
        https://cloud.google.com/compute/docs/instances/reservations-consume).
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.gcp import gpudirect
from provision.cluster.providers.gcp.layout import NETWORK, Layout
from provision.model.inventory import CLUSTER_TAG
from provision.model.render import render

LOGIN_USER = "mgpu"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


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
    """The GPUDirect data networks, their subnets (in layout.region) and firewall rules
    (gpudirect.py); three empty lists without GPUDirect."""
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


def startup_script(layout: Layout) -> str:
    """The nodes' startup script: the login user in the docker group, GPUDirect's set-up
    where the machine has it, and the pull of the training image started at boot (bootstrap
    finds it done or under way)."""
    from provision.nodes.bootstrap import boot_pull

    stack = layout.gpu_direct
    return render(
        "gcp/startup.sh.j2", cluster=layout.cluster, user=LOGIN_USER,
        max_run_seconds=layout.max_run_seconds, gpudirect=stack,
        run_dir=gpudirect.RUN_DIR, done_marker=gpudirect.DONE_MARKER,
        status_file=gpudirect.STATUS_FILE, setup_log=gpudirect.SETUP_LOG,
        nics_env=gpudirect.NICS_ENV, nic_wait_s=gpudirect.NIC_WAIT_S,
        uds_path=gpudirect.TCPX_UDS_PATH,
        aperture_devices=gpudirect.APERTURE_DEVICES, **boot_pull(layout.training_image),
    )


def scheduling(layout: Layout) -> dict[str, Any]:
    """One termination action for every model: spot preemption, the end of maxRunDuration
    and the end of a reservation delete the VM (a stopped GPU VM keeps its disk billed)."""
    model = layout.provisioning_model
    sched: dict[str, Any] = {
        "on_host_maintenance": "TERMINATE",
        "automatic_restart": False,
        "provisioning_model": model,
        "instance_termination_action": "DELETE",
    }
    if model != "RESERVATION_BOUND":  # the reservation's end ends those VMs
        sched["max_run_duration"] = {"seconds": layout.max_run_seconds}
    return sched


def reservation_affinity(layout: Layout) -> dict[str, Any] | None:
    if layout.reservation:
        return {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY,
                "values": [layout.reservation]}
    if layout.flex_start:
        return {"consume_reservation_type": "NO_RESERVATION"}
    return None  # the default: any matching reservation the project has


def instance_properties(layout: Layout, login_public_key: str) -> Any:
    """What every node of the bulkInsert shares (names, not URLs: see the module docstring)."""
    from google.cloud import compute_v1

    labels = {CLUSTER_TAG: layout.cluster}
    body: dict[str, Any] = {
        "description": f"{CLUSTER_TAG}={layout.cluster}",
        "machine_type": layout.machine_type,
        "labels": labels,
        "tags": {"items": [layout.tag]},
        "scheduling": scheduling(layout),
        "disks": [{
            "boot": True,
            "auto_delete": True,
            "type_": "PERSISTENT",
            "initialize_params": {
                "source_image": layout.image,
                "disk_size_gb": layout.disk_gb,
                "disk_type": layout.disk_type,
                "labels": labels,
            },
        }],
        "network_interfaces": _network_interfaces(layout),
        "metadata": {"items": [
            {"key": "ssh-keys", "value": f"{LOGIN_USER}:{login_public_key}"},
            {"key": "enable-oslogin", "value": "FALSE"},
            {"key": "enable-guest-attributes", "value": "TRUE"},
            {"key": "install-nvidia-driver", "value": "True"},
            {"key": "startup-script", "value": startup_script(layout)},
        ]},
    }
    if layout.placement_policy:
        body["resource_policies"] = [layout.policy_name]
    affinity = reservation_affinity(layout)
    if affinity is not None:
        body["reservation_affinity"] = affinity
    if layout.accelerator_type:
        body["guest_accelerators"] = [{
            "accelerator_type": layout.accelerator_type,
            "accelerator_count": layout.gpus,
        }]
    return compute_v1.InstanceProperties(body)


def bulk_insert_body(layout: Layout, login_public_key: str,
                     names: list[str] | None = None) -> Any:
    """All N nodes (or the `names` given: a replacement), named, all or nothing
    (count = minCount = the number of names)."""
    from google.cloud import compute_v1

    names = names or [layout.instance_name(rank) for rank in range(layout.nodes)]
    return compute_v1.BulkInsertInstanceResource(
        count=len(names), min_count=len(names),
        per_instance_properties={n: compute_v1.BulkInsertInstanceResourcePerInstanceProperties()
                                 for n in names},
        instance_properties=instance_properties(layout, login_public_key),
    )


def instance_body(layout: Layout, login_public_key: str, name: str, zone: str) -> Any:
    """ONE VM for instances.insert (a replacement): `up`'s InstanceProperties with the URLs
    the Instance resource takes ("Instance", Compute API reference: machineType, diskType,
    acceleratorType and resourcePolicies are full or partial URLs there, names in
    InstanceProperties). A single insert names the VM it makes (projects/P/zones/Z/instances/
    NAME), so the controller's resource-name condition can allow it; a bulkInsert names only
    the zone's collection."""
    from google.cloud import compute_v1

    body = compute_v1.InstanceProperties.to_dict(
        instance_properties(layout, login_public_key), preserving_proto_field_name=True,
        use_integers_for_enums=False, always_print_fields_with_no_presence=False)
    body["name"] = name
    body["machine_type"] = f"zones/{zone}/machineTypes/{layout.machine_type}"
    for disk in body.get("disks", []):
        params = disk.get("initialize_params") or {}
        if params.get("disk_type"):
            params["disk_type"] = f"zones/{zone}/diskTypes/{params['disk_type']}"
    for acc in body.get("guest_accelerators", []):
        acc["accelerator_type"] = f"zones/{zone}/acceleratorTypes/{acc['accelerator_type']}"
    body["resource_policies"] = [f"regions/{layout.region}/resourcePolicies/{p}"
                                 for p in body.get("resource_policies", [])]
    return compute_v1.Instance(body)
