"""What the training container needs to use EFA (Inventory.container_args), and nothing else.

Without it NCCL inside `docker run` finds no EFA device and silently falls back to TCP sockets
(aws-ofi-nccl issue #1020: `fi_getinfo -61` on p5 with an NGC image and no /dev/infiniband;
issue #803: "Selected Provider is tcp").

- Devices: one `--device /dev/infiniband/uverbsN` per EFA interface of the type (p4d 4, p5/p5e
  32, p5en 16, p6-b200 8), as the aws-ofi-nccl maintainers run it (issue #803:
  `docker run ... --ulimit memlock=-1:-1 --device {efa-devices}`) and AWS Batch's p5 job
  definition does (awsome-distributed-training: uverbs0..31). Each EFA interface, `efa-only`
  ones included, is one uverbs device.
- Libraries: the host's (the Deep Learning Base AMI's) libfabric and aws-ofi-nccl, mounted
  read-only at the same paths, so the container uses the versions that match the host's EFA
  driver: /opt/amazon/efa (libfabric) and /opt/amazon/ofi-nccl (the NCCL net plugin; on the
  Ubuntu DLAMI under lib/x86_64-linux-gnu), put first on the image's own LD_LIBRARY_PATH
  inside the container (Inventory.container_library_path; cloud-facts 2.1).
- memlock unlimited (`--ulimit memlock=-1`, else "Libfabric error: (-12) Cannot allocate
  memory") is already in provision.nodes.container.RUN_FLAGS, as are --network host and --ipc host.
"""

from __future__ import annotations

EFA_DIR = "/opt/amazon/efa"
OFI_NCCL_DIR = "/opt/amazon/ofi-nccl"
EFA_LIBRARY_DIRS = (
    f"{OFI_NCCL_DIR}/lib/x86_64-linux-gnu",  # Ubuntu DLAMI packaging
    f"{OFI_NCCL_DIR}/lib",
    f"{EFA_DIR}/lib",
)
def uverbs_devices(efa_interfaces: int) -> list[str]:
    return [f"/dev/infiniband/uverbs{i}" for i in range(efa_interfaces)]


def container_args(efa_interfaces: int) -> list[str]:
    """`docker run` words giving the training container the node's EFA: [] without EFA."""
    if efa_interfaces < 1:
        return []
    args: list[str] = []
    for device in uverbs_devices(efa_interfaces):
        args += ["--device", device]
    for directory in (EFA_DIR, OFI_NCCL_DIR):
        args += ["-v", f"{directory}:{directory}:ro"]
    return args


def library_path(efa_interfaces: int) -> list[str]:
    """Folders put first on LD_LIBRARY_PATH inside the container: [] without EFA."""
    return list(EFA_LIBRARY_DIRS) if efa_interfaces > 0 else []
