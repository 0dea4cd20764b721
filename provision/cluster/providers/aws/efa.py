"""What the training container needs to use EFA (Inventory.container_args), and nothing else.

Without it NCCL inside `docker run` finds no EFA device and silently falls back to TCP sockets
(aws-ofi-nccl issue #1020: `fi_getinfo -61` on p5 with an NGC image and no /dev/infiniband;
issue #803: "Selected Provider is tcp").

- Devices: every `/dev/infiniband/uverbsN` whose kernel driver is `efa`, picked on the node
  when the job starts (`--device @by-driver:infiniband_verbs:efa`, remote/devices.py), not
  uverbs0..N-1 by count: B200 nodes can carry mlx5 uverbs devices beside the EFA ones, and
  handing those to the container makes libfabric's EFA provider fail to open them
  (`fi_getinfo -61`, NCCL on TCP: aws-samples/aws-do-eks PR #63). Each EFA interface,
  `efa-only` ones included, is one uverbs device; aws-ofi-nccl's maintainers run
  `docker run ... --device {efa-devices}` (issue #803).
- Libraries: the host's (the Deep Learning Base AMI's) libfabric and aws-ofi-nccl, mounted
  read-only at the same paths, so the container uses the versions that match the host's EFA
  driver: /opt/amazon/efa (libfabric) and /opt/amazon/ofi-nccl (the NCCL net plugin; on the
  Ubuntu DLAMI under lib/x86_64-linux-gnu). Also the host's rdma-core userspace that
  libfabric's EFA provider links against (libibverbs.so.1 and the libefa.so.1 provider,
  installed by the EFA installer in the system library folder): NGC images ship HPC-X's
  rdma-core, whose libibverbs lacks the private symbol version the host's libefa needs
  ("version `IBVERBS_PRIVATE_34' not found", NCCL then silently on sockets: NVIDIA-NeMo
  Megatron-Bridge issue #2824). The two files are mounted into a folder of their own (never
  over the image's copies, which other libraries of the image may need) with `--mount`, which
  fails loudly where a file is missing instead of making an empty folder as `-v` would. All
  of these folders are put first on the image's own LD_LIBRARY_PATH inside the container
  (Inventory.container_library_path; cloud-facts 2.1).
- memlock unlimited (`--ulimit memlock=-1`, else "Libfabric error: (-12) Cannot allocate
  memory") is already in provision.nodes.container.RUN_FLAGS, as are --network host and --ipc host.
"""

from __future__ import annotations

from typing import Any

from provision.nodes.container import by_driver

EFA_DIR = "/opt/amazon/efa"
OFI_NCCL_DIR = "/opt/amazon/ofi-nccl"
HOST_LIB_DIR = "/usr/lib/x86_64-linux-gnu"  # Ubuntu's multiarch folder (the default DLAMI)
HOST_RDMA_DIR = "/opt/mgpu-cloud/host-rdma"  # inside the container only
HOST_RDMA_LIBS = ("libibverbs.so.1", "libefa.so.1")
EFA_UVERBS = by_driver("infiniband_verbs", "efa")
EFA_LIBRARY_DIRS = (
    HOST_RDMA_DIR,
    f"{OFI_NCCL_DIR}/lib/x86_64-linux-gnu",  # Ubuntu DLAMI packaging
    f"{OFI_NCCL_DIR}/lib",
    f"{EFA_DIR}/lib",
)


def container_args(efa_interfaces: int) -> list[str]:
    """`docker run` words giving the training container the node's EFA: [] without EFA."""
    if efa_interfaces < 1:
        return []
    args = ["--device", EFA_UVERBS]
    for directory in (EFA_DIR, OFI_NCCL_DIR):
        args += ["-v", f"{directory}:{directory}:ro"]
    for lib in HOST_RDMA_LIBS:
        args += ["--mount", f"type=bind,source={HOST_LIB_DIR}/{lib},"
                            f"target={HOST_RDMA_DIR}/{lib},readonly"]
    return args


def library_path(efa_interfaces: int) -> list[str]:
    """Folders put first on LD_LIBRARY_PATH inside the container: [] without EFA."""
    return list(EFA_LIBRARY_DIRS) if efa_interfaces > 0 else []


def network_interfaces(efa_cards: list[int], subnet: str, sg: str, *,
                       public: bool) -> list[dict[str, Any]]:
    """RunInstances' NetworkInterfaces: one EFA interface per card of the type's layout
    (catalog.card_layout). The primary (card 0, device 0, carries the IP) is 'efa' when card 0
    has EFA, else a plain ENA 'interface' (p6-b300: card 0 is ENA-only); the other cards get
    'efa-only' at device index 1 ("Maximize network bandwidth on accelerated instance types",
    EC2 User Guide; dstack does the same). Plain ENA without EFA. A public IP is asked for
    only with ONE interface: EC2 refuses AssociatePublicIpAddress with several
    ("InvalidParameterCombination")."""
    base = {"SubnetId": subnet, "Groups": [sg], "DeleteOnTermination": True}
    if not efa_cards:
        return [{"DeviceIndex": 0, **base, "AssociatePublicIpAddress": public}]
    primary: dict[str, Any] = {"NetworkCardIndex": 0, "DeviceIndex": 0,
                               "InterfaceType": "efa" if 0 in efa_cards else "interface", **base}
    out = [primary] + [
        {"NetworkCardIndex": card, "DeviceIndex": 1, "InterfaceType": "efa-only", **base}
        for card in efa_cards if card != 0
    ]
    if len(out) == 1:
        primary["AssociatePublicIpAddress"] = public
    return out
