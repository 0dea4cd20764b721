"""GCP provider: GPU VMs (a2-ultragpu-8g, a2-highgpu-*, a3-highgpu-8g, or N1 + guest GPUs) in
one zone under a COLLOCATED (compact) placement policy.

Per cluster NAME, in the project and the zone's region (with --regions, the first region
that has capacity):
    resource policy  NAME-compact    groupPlacementPolicy COLLOCATED, vmCount N; attached to
                                     every instance (not with --flex-start or --reservation:
                                     DWS and reservations place the VMs themselves)
    firewall         NAME-ssh        tcp:22 from --ssh-cidr only (default: caller's address /32)
    firewall         NAME-internal   all protocols between instances tagged mgpu-cloud-NAME
    instances        NAME-node-R     ONE bulkInsert, count = minCount = N (all or none);
                                     onHostMaintenance TERMINATE, automaticRestart false,
                                     maxRunDuration --max-hours (default 8 h) -> DELETE;
                                     provisioningModel STANDARD, SPOT, FLEX_START or (a3-ultra
                                     / a4 from a reservation) RESERVATION_BOUND (layout.py),
                                     gVNIC, an external IPv4 (egress), boot image from a
                                     current Deep Learning VM family (images.py, with
                                     fallbacks), login key in ssh-keys,
                                     enable-guest-attributes: the VM's own host keys are read
                                     from Compute (hostkeys.py); no private key is sent
    multi-node a3-highgpu-8g / a3-megagpu-8g (GPUDirect-TCPX / TCPXO, gpudirect.py):
    networks         NAME-gpunet-K   K = 0..3 / 0..7, MTU 8244, each with one subnet (same
    subnetworks      NAME-gpunet-K   name, a /20 of 10.0.0.0/9) and one firewall rule
    firewalls        NAME-gpunet-K-internal  (tcp/udp/icmp from the subnet); the VMs get one
                                     gVNIC data NIC in each
Instances and their boot disks carry the label mgpu-cloud-cluster=NAME; resource policies,
firewall rules, networks and subnets have no labels in the Compute API, so they carry it as
their description (`mgpu-cloud-cluster=NAME`), which is what `gc` matches.

Module map: layout.py (Layout, purchase rules) <- resolve.py (read-only calls) -> plan.py
(printable plan); bodies.py (request bodies) <- create.py / placement.py (zone and region
failover) / replace.py; writes.py (record-then-insert); hostkeys.py; teardown.py, discovery.py;
clients.py + errors.py: the one boundary where google errors become mgpu-cloud errors.

Recovery (replace.py, contract.Recoverable): node_alive reads the VM's status; replace deletes
the lost VM, then makes one with the same name under the same policy.

Credentials: Application Default Credentials (google.auth.default()); never written anywhere.

Seams (for tests and local fakes; all read from the environment at call time):
    MGPU_CLOUD_GCP_ENDPOINT=http://127.0.0.1:PORT
        every client is built with ClientOptions(api_endpoint=...) and AnonymousCredentials;
        ADC is not consulted. Unset: the real endpoint with ADC.
    MGPU_CLOUD_GCP_RETRY_BASE_S=0   no wait between retries of 429/5xx (default 1.0 s base)
    MGPU_CLOUD_GCP_POLL_S=0         no pause between operation waits (default 2.0 s)
    MGPU_CLOUD_GCP_HOSTKEY_POLL_S / _DEADLINE_S   polling for the VMs' published host keys
                                    (default 5 s / 600 s)

google.cloud.compute_v1 costs ~1.4 s to import: it is imported only inside functions.
"""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="gcp",
    summary="Compute Engine GPU VMs under a COLLOCATED placement policy",
    options="provision.cluster.providers.gcp.options:GcpOptions",
    implementation="provision.cluster.providers.gcp.provider:GcpProvider",
    costs_money=True,
    machine_type="machine_type",
    # A guest shutdown only STOPS a VM (its boot disk stays billed); deleting it needs the
    # Compute API and credentials, which nodes never get. maxRunDuration still DELETEs it.
    self_stop="sudo -n shutdown -h now",
    self_stop_note="each VM powers off: its GPUs and vCPUs stop being billed, its boot disk "
                   "does not until `down` (or --max-hours) deletes it",
    flags=(
        Flag("--project", "project", help="project id", gc=True),
        Flag("--zone", "zone", help="zone", gc=True),
        Flag("--machine-type", "machine_type", help="e.g. a2-ultragpu-8g"),
        Flag("--image-family", "image_family", help="boot image family"),
        Flag("--image-project", "image_project", help="project of --image-family"),
        Flag("--accelerator-type", "accelerator_type",
             help="guest GPU for N1 types, e.g. nvidia-tesla-t4"),
        Flag("--accelerator-count", "accelerator_count", int, help="guest GPUs per node"),
        Flag("--disk-gb", "disk_gb", int, help="boot disk size"),
        Flag("--reservation", "reservation",
             help="consume this reservation (NAME, or projects/P/reservations/NAME)"),
        Flag("--flex-start", "flex_start", bool,
             help="DWS flex-start VMs (discounted, start when capacity is found, <= 7 days)"),
        Flag("--regions", "regions",
             help="regions to fail over to, in order (comma-separated), or `any`"),
    ),
)
