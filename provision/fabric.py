"""Which network NCCL chose, read from its INFO lines, and what each instance type should have.

    transport_of(lines)            -> Transport (efa | ib | tcpx | tcpxo | rdma | socket | unknown)
    matches(expected, found)       -> bool
    fix_for(expected, found)       -> the likely fix when NCCL did not use the expected fabric
    expectation_for(instance_type) -> FabricExpectation | None (EXPECTED: the table, sourced)

Pure: no I/O. The gate (provision/gate.py) runs the all-reduce with NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,NET and hands each node's lines here. The line parsing (rules, the real
captured logs it was checked against) lives in remote/transport.py, because the nodes judge
the gate with it too (remote/injob.py); it is re-exported here.
"""

from __future__ import annotations

from provision.inventory import FabricExpectation
from remote.transport import (
    TRANSPORTS,
    UNKNOWN,
    Transport,
    matches,
    transport_name,
    transport_of,
)

__all__ = ["TRANSPORTS", "UNKNOWN", "Transport", "matches", "transport_name", "transport_of",
           "FIXES", "UNKNOWN_FIX", "fix_for", "EXPECTED", "expectation_for"]


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


# ---------------------------------------------------------------------------------------------
# What each instance type's network should deliver between nodes. busbw_gbps: a published
# nccl-tests all_reduce_perf figure (2 nodes x 8 GPUs, 1-2 GB messages); None where no such
# figure was found (the gate then judges the transport and the pairs only). The same table,
# with links, is in docs/fabric-gate.md (a test keeps the two equal).
_AWESOME = ("aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md "
            "(commit 7217859f, 2026-02-21)")
EXPECTED: dict[str, FabricExpectation] = {
    "p4d.24xlarge": FabricExpectation(
        transport="efa", busbw_gbps=77.35, nominal="4 x 100 Gb/s EFA",
        source="SkyPilot EFA example, 2 x p4d: 77.35 GB/s at 2 GB (non-EFA: 4.13)"),
    "p4de.24xlarge": FabricExpectation(
        transport="efa", busbw_gbps=78.33, nominal="4 x 100 Gb/s EFA",
        source=f"{_AWESOME}: 78.33 GB/s at 2 GB"),
    "p5.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=443.7, nominal="32 x 100 Gb/s EFA",
        source=f"{_AWESOME}: 443.7 GB/s at 2 GB (487.1 at 16 GB)"),
    "p5e.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=None, nominal="32 x 100 Gb/s EFA",
        source="no published 2-node figure found; same EFA as p5"),
    "p5en.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=None, nominal="16 x 200 Gb/s EFA (v3, unconfirmed)",
        source="no published 2-node figure found"),
    "p6-b200.48xlarge": FabricExpectation(
        transport="efa", busbw_gbps=None, nominal="8 x 400 Gb/s EFA (v4, unconfirmed)",
        source="no published 2-node figure found"),
    "a3-highgpu-8g": FabricExpectation(
        transport="tcpx", busbw_gbps=88.18, nominal="4 x 200 Gb/s GPUDirect-TCPX",
        source="GoogleCloudPlatform/ai-infra-cluster-provisioning sample_workloads/nccltest/"
               "a3/README.md: 88.18 GB/s at 2 GB; SkyPilot examples/gcp_gpu_direct_tcpx "
               "(commit 9a3aa4d9): 65.72 with TCPX, 19.39 without"),
    "a3-megagpu-8g": FabricExpectation(
        transport="tcpxo", busbw_gbps=None, nominal="8 x 200 Gb/s GPUDirect-TCPXO",
        source="no sourced 2-node figure (a lab guide of unknown origin: 317.84 GB/s)"),
    "a3-ultragpu-8g": FabricExpectation(
        transport="rdma", busbw_gbps=None, nominal="8 x 400 Gb/s GPUDirect RDMA (RoCE)",
        source="no published 2-node figure found"),
}


def expectation_for(instance_type: str) -> FabricExpectation | None:
    """The table's row for an instance type (a copy), or None for a type without a fabric
    worth gating (a2, single-GPU shapes, unknown types)."""
    row = EXPECTED.get(instance_type)
    return row.model_copy() if row is not None else None
