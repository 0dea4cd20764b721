"""Which network NCCL chose, read from its INFO lines (the expected one per instance type is in
the providers' catalogs: aws/catalog.py and gcp/catalog.py FABRIC, Inventory.fabric).

    transport_of(lines)            -> Transport (efa | ib | tcpx | tcpxo | rdma | socket | unknown)
    matches(expected, found)       -> bool
    fix_for(expected, found)       -> the likely fix when NCCL did not use the expected fabric

Pure: no I/O. The gate (provision/job/gate/) runs the all-reduce with NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,NET and hands each node's lines here. The line parsing (rules, the real
captured logs it was checked against) lives in remote/transport.py, because the nodes judge
the gate with it too (remote/injob.py); it is re-exported here.
"""

from __future__ import annotations

from remote.transport import (
    TRANSPORTS,
    UNKNOWN,
    Transport,
    matches,
    transport_name,
    transport_of,
)

__all__ = ["TRANSPORTS", "UNKNOWN", "Transport", "matches", "transport_name", "transport_of",
           "FIXES", "UNKNOWN_FIX", "fix_for"]


FIXES: dict[str, str] = {
    "efa": (
        "NCCL did not use EFA. On a node (inside the training container when there is one): "
        "`fi_info -p efa` must list the EFA devices; the container needs "
        "`--device /dev/infiniband --ulimit memlock=-1`; the aws-ofi-nccl plugin must be on "
        "LD_LIBRARY_PATH (/opt/amazon/ofi-nccl/lib or /opt/aws-ofi-nccl/lib) with "
        "NCCL_NET_PLUGIN=ofi; the security group must allow all traffic to and from itself. "
        "NCCL_NET=Libfabric makes NCCL fail instead of falling back to sockets."
    ),
    "ib": (
        "NCCL did not use InfiniBand/RoCE. On a node: `ibv_devinfo` must list the HCAs; the "
        "container needs `--device /dev/infiniband --ulimit memlock=-1 --cap-add IPC_LOCK`; "
        "unset NCCL_IB_DISABLE and set NCCL_IB_HCA to the HCAs. NCCL_NET=IB makes NCCL fail "
        "instead of falling back to sockets."
    ),
    "tcpx": (
        "NCCL did not use GPUDirect-TCPX. Every node needs the receive-datapath-manager "
        "running, the plugin (/var/lib/tcpx/lib64) on LD_LIBRARY_PATH and mounted into the "
        "container with /run/tcpx, NCCL_NET=GPUDirectTCPX_v7 and the "
        "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME / _CTRL_DEV interface variables (Google's A3 "
        "GPUDirect-TCPX set-up)."
    ),
    "tcpxo": (
        "NCCL did not use GPUDirect-TCPXO. Every node needs the receive-datapath-manager "
        "running, the FasTrak plugin (/var/lib/tcpxo/lib64, its nccl-env-profile.sh sourced) "
        "on LD_LIBRARY_PATH and mounted into the container with /dev/aperture_devices, and "
        "NCCL_FASTRAK_CTRL_DEV / NCCL_FASTRAK_IFNAME set (Google's A3 Mega set-up)."
    ),
    "rdma": (
        "NCCL did not use GPUDirect RDMA. Install Google's gIB plugin (/usr/local/gib), "
        "`source /usr/local/gib/scripts/set_nccl_env.sh`, set NCCL_NET=gIB and "
        "LD_LIBRARY_PATH=/usr/local/gib/lib64, and expose /dev/infiniband to the container."
    ),
}
UNKNOWN_FIX = (
    "No NCCL line said which network it used: make sure NCCL_DEBUG_FILE is not set for the "
    "job (the gate reads NCCL's INFO lines from the output), and that the job runs on GPUs."
)


def fix_for(expected: str, found: str) -> str:
    """The likely fix when NCCL chose `found` where `expected` was due."""
    if found == UNKNOWN:
        return UNKNOWN_FIX
    return FIXES.get(expected, f"NCCL used {found} where {expected} was expected.")
