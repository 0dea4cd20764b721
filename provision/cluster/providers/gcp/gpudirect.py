"""GPUDirect-TCPX (a3-highgpu-8g) and GPUDirect-TCPXO (a3-megagpu-8g) on Compute Engine VMs:
what the cluster, each node and the training container need, following Google's published A3
set-up. Pure data and small functions; create.py makes the resources, the node's startup
script (templates/gcp/gpudirect-*.sh.j2) sets up the node.

Per cluster of >= 2 nodes of such a type (a single node has no traffic between nodes):
    k data VPC networks NAME-gpunet-0..k-1 (a3-high k = 4, a3-mega k = 8), MTU 8244, no
        automatic subnets; one subnet each in the cluster's region, a /20 of 10.0.0.0/9; one
        firewall rule each allowing tcp/udp/icmp from that subnet (cluster-toolkit
        examples/machine-learning/a3-highgpu-8g and a3-megagpu-8g blueprints: multivpc with
        network_count 4 / 8, global_ip_address_range 10.0.0.0/9, subnetwork_cidr_suffix 20,
        mtu 8244; "allowed: internal");
    every VM: nic0 on the default network (SSH, egress), nic1..k one per data network, all
        gVNIC, data NICs without external addresses.
Per node (startup script, on every boot): find the control and data NICs by PCI address and wait
for their addresses (templates/gcp/gpudirect-nics.sh.j2: the PCI addresses are the hardware's,
the names are the image's: enp6s0 on Ubuntu 22.04 images, enp6s0f0 on current 24.04 accelerator
images), write the NCCL variables that name them to NICS_ENV, install the NCCL plugin (and
its NCCL) from Google's installer image into LIB_DIR, start the receive-datapath manager
(RxDM) and wait until it is up (slurm-gcp tools/prologs-epilogs/receive-data-path-manager and
-mega; for TCPXO also container-engine-accelerators gpudirect-tcpxo/nccl-tcpxo-installer.yaml:
`modprobe import-helper`, /dev/aperture_devices). It then writes DONE_MARKER, whatever the
outcome, and the outcome to STATUS_FILE.
Per job container: NICS_ENV as an --env-file (the NIC names this node found), LIB_DIR mounted
read-only and put first on LD_LIBRARY_PATH (Inventory.container_library_path), TCPX's RxDM
socket folder, TCPXO's aperture devices, and
DONE_MARKER bind-mounted with `--mount` (docker refuses to start the container while the
node's set-up has not finished, naming the file, instead of letting NCCL fall back to sockets).

Not verified without the real cloud (the plan says so): that the boot image has a guest kernel
with GPUDirect-TCPX support (Google's VM set-ups build one: Cluster Toolkit installs
`linux-gcp-tcpx` from a private Canonical PPA, or use Container-Optimized OS) and, for TCPXO,
the `import-helper` module; that the PCI addresses below are where A3 VMs put their gVNICs
(derived from the interface names of Google's VM scripts, control NIC enp0s12, data NICs below:
enpBsS is PCI bus B, slot S); the image tags below.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

DATA_MTU = 8244  # Google's A3 set-up; a VPC allows 1300..8896 ("Maximum transmission unit")
DATA_RANGE = "10.0.0.0/9"  # cluster-toolkit's global_ip_address_range for the gpunets
DATA_SUBNET_PREFIX = 20
RUN_DIR = "/run/mgpu-cloud"
DONE_MARKER = f"{RUN_DIR}/gpudirect.done"
STATUS_FILE = f"{RUN_DIR}/gpudirect.status"
SETUP_LOG = "/var/log/mgpu-cloud-gpudirect.log"
NICS_ENV = f"{RUN_DIR}/gpudirect-nics.env"  # NCCL variables naming this node's NICs
NIC_WAIT_S = 120
TCPX_UDS_PATH = "/run/tcpx"  # where the RxDM's socket is; NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX
APERTURE_DEVICES = "/dev/aperture_devices"  # TCPXO's LLCM devices


@dataclass(frozen=True)
class Stack:
    """One GPUDirect flavour on one machine type."""

    name: Literal["tcpx", "tcpxo"]
    machine_type: str
    ctrl_dev: str  # the primary gVNIC's name on Google's Ubuntu 22.04 set-up (documentation)
    data_nics: tuple[str, ...]  # NIC 1..k's names on that set-up, in NIC order (documentation)
    plugin_image: str  # NCCL plugin installer: `install --install-nccl` into lib_dir
    rxdm_image: str  # receive-datapath manager
    lib_dir: str
    source: str
    # TCPX: NCCL_GPUDIRECTTCPX_TX/RX_BINDINGS, per data NIC (CPUs of the NIC's NUMA node)
    tx_cpus: tuple[str, ...] = ()
    rx_cpus: tuple[str, ...] = ()
    # TCPX: per data NIC (in NIC order), the two GPUs whose receive queues it serves (the
    # RxDM's gpu_rxq_configuration.textproto)
    nic_gpus: tuple[tuple[str, str], ...] = ()

    @property
    def nic_count(self) -> int:
        return len(self.data_nics)

    @property
    def ctrl_pci(self) -> str:
        return pci_of(self.ctrl_dev)

    @property
    def data_pcis(self) -> tuple[str, ...]:
        """The data NICs' PCI addresses, in NIC order: how the node finds them."""
        return tuple(pci_of(n) for n in self.data_nics)


_PREDICTABLE = re.compile(r"^enp(\d+)s(\d+)(?:f(\d+))?$")


def pci_of(ifname: str) -> str:
    """The PCI address a systemd predictable name stands for: enpBsS[fF] is domain 0, bus B,
    slot S, function F (default 0), in decimal ("Predictable Network Interface Names")."""
    match = _PREDICTABLE.match(ifname)
    if match is None:
        raise ValueError(f"{ifname!r} is not a PCI-path interface name")
    bus, slot, func = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    return f"0000:{bus:02x}:{slot:02x}.{func}"


TCPX = Stack(
    name="tcpx", machine_type="a3-highgpu-8g", ctrl_dev="enp0s12",
    data_nics=("enp6s0", "enp12s0", "enp134s0", "enp140s0"),
    plugin_image="us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/nccl-plugin-gpudirecttcpx-dev:v3.1.12",
    rxdm_image="us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.15",
    lib_dir="/var/lib/tcpx/lib64",
    source="GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpx/README.md "
           "(release of 2026-06-22: plugin v3.1.12, RxDM v2.0.15, NCCL configs); interface "
           "names, bindings and the NIC/GPU map: cluster-toolkit a3-highgpu-8g blueprint and "
           "run-nccl-tests.sh",
    tx_cpus=("8-21,112-125", "8-21,112-125", "60-73,164-177", "60-73,164-177"),
    rx_cpus=("22-35,126-139", "22-35,126-139", "74-87,178-191", "74-87,178-191"),
    nic_gpus=(("0000:04:00.0", "0000:05:00.0"), ("0000:0a:00.0", "0000:0b:00.0"),
              ("0000:84:00.0", "0000:85:00.0"), ("0000:8a:00.0", "0000:8b:00.0")),
)
TCPXO = Stack(
    name="tcpxo", machine_type="a3-megagpu-8g", ctrl_dev="enp0s12",
    data_nics=("enp6s0", "enp7s0", "enp13s0", "enp14s0", "enp134s0", "enp135s0", "enp141s0",
               "enp142s0"),
    plugin_image="us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.17",
    rxdm_image="us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23",
    lib_dir="/var/lib/tcpxo/lib64",
    source="GoogleCloudPlatform/slurm-gcp tools/prologs-epilogs/receive-data-path-manager-mega "
           "(13fd92b6, 2026-08-06: plugin v1.0.17, RxDM v1.0.23); NCCL settings: "
           "google/nccl-plugin-gpudirect-tcpxo README and Google's A3 Mega sample scripts",
)
STACKS: dict[str, Stack] = {s.machine_type: s for s in (TCPX, TCPXO)}


def stack_for(machine_type: str, nodes: int) -> Stack | None:
    """The GPUDirect stack a cluster of `nodes` x `machine_type` gets (None: plain TCP)."""
    return STACKS.get(machine_type) if nodes >= 2 else None


@dataclass(frozen=True)
class DataNetwork:
    """One data NIC's VPC network, its subnet (same name) and its firewall rule."""

    name: str
    cidr: str
    firewall: str


def data_networks(cluster: str, stack: Stack) -> list[DataNetwork]:
    blocks = ipaddress.ip_network(DATA_RANGE).subnets(new_prefix=DATA_SUBNET_PREFIX)
    out = []
    for k, block in zip(range(stack.nic_count), blocks, strict=False):
        name = f"{cluster}-gpunet-{k}"
        out.append(DataNetwork(name=name, cidr=str(block), firewall=f"{name}-internal"))
    return out


def container_args(stack: Stack | None) -> list[str]:
    """`docker run` words the training container needs for the stack ([] without one)."""
    if stack is None:
        return []
    args = ["--env-file", NICS_ENV,
            "-v", f"{stack.lib_dir}:{stack.lib_dir}:ro", "--cap-add", "IPC_LOCK",
            "--mount", f"type=bind,source={DONE_MARKER},target={DONE_MARKER},readonly"]
    if stack.name == "tcpx":
        args += ["-v", f"{TCPX_UDS_PATH}:{TCPX_UDS_PATH}"]
    else:
        args += ["-v", f"{APERTURE_DEVICES}:{APERTURE_DEVICES}"]
    return args


def library_path(stack: Stack | None) -> list[str]:
    """Folders put first on LD_LIBRARY_PATH inside the container: the plugin and its NCCL."""
    return [stack.lib_dir] if stack is not None else []


def nccl_preset(stack: Stack | None) -> str:
    return f"nccl/gcp-{stack.name}.env.j2" if stack is not None else "nccl/gcp-tcp.env.j2"
