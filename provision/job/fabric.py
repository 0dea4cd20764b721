"""Which network NCCL chose, read from its INFO lines (the expected one per instance type is in
the providers' catalogs: aws/catalog.py and gcp/catalog.py FABRIC, Inventory.fabric).

    transport_of(lines)            -> Transport (efa | ib | tcpx | tcpxo | rdma | socket | unknown)
    matches(expected, found)       -> bool
    fix_for(expected, found)       -> the likely fix when NCCL did not use the expected fabric

Pure: no I/O. The gate (provision/job/gate.py) runs the all-reduce with NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,NET and hands each node's lines here. The patterns were checked against
real captured logs: tests/data/logs/nccl-*.log (sources in tests/data/logs/SOURCES.md).

How the transport is read, strongest evidence first (the strongest kind present wins; among
lines of that kind, the worst transport wins, so one rank on sockets marks the node):
  1. `Using network <name>`                 NCCL's own choice (Socket, IB, Libfabric, ...)
  2. `via NET/<name>/<dev>`                 a channel's connection
  3. `NET/IB : Using [0]...`, `NET/Socket : Using [0]...`, `NET/GPUDirectTCPX ...`,
     `NET/FasTrak ...`                      a network plugin that initialised
  4. `NET/OFI Selected [Pp]rovider is <p>`  libfabric's provider (efa; tcp = not EFA)
An OFI provider other than efa turns an EFA reading into socket: aws-ofi-nccl on libfabric's
tcp provider is TCP (aws/aws-ofi-nccl#803). `Bootstrap : Using ...` is NCCL's bootstrap
socket, present on every fabric, and is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

TRANSPORTS = ("efa", "ib", "tcpx", "tcpxo", "rdma", "socket")
UNKNOWN = "unknown"
# worst first: when ranks of one node disagree, the node is as good as its worst rank
_RANK = {"socket": 0, "unknown": 1, "tcpx": 2, "tcpxo": 3, "efa": 4, "ib": 5, "rdma": 6}

_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>\S+(?: Libfabric)?)")
_VIA_NET = re.compile(r"via NET/(?P<name>[A-Za-z][\w ]*?)/\d+")
_PLUGIN_UP = re.compile(
    r"NET/(?P<name>IB|Socket)\s*:\s*Using \[|NET/(?P<plugin>GPUDirectTCPX|FasTrak)\b(?P<rest>.*)"
)
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w;-]+)")


def transport_name(name: str) -> str:
    """NCCL's network name -> one of TRANSPORTS (or 'unknown')."""
    n = name.strip().lower()
    if n == "socket":
        return "socket"
    if n.startswith("ib"):  # IB, IBext, IBext_v8: NCCL's verbs transport (IB and RoCE)
        return "ib"
    if n.endswith("libfabric"):  # Libfabric, "AWS Libfabric" (older aws-ofi-nccl)
        return "efa"
    if n.startswith("gpudirecttcpx"):  # GPUDirectTCPX_v7
        return "tcpx"
    if n.startswith("fastrak"):
        return "tcpxo"
    if n == "gib":
        return "rdma"
    return UNKNOWN


@dataclass(frozen=True)
class Transport:
    name: str  # one of TRANSPORTS or 'unknown'
    evidence: str = ""  # the line it was read from (stripped)


def transport_of(lines: Iterable[str]) -> Transport:
    """The network one node's ranks used, from their NCCL INFO/WARN lines (any prefix)."""
    found: dict[int, list[Transport]] = {}
    ofi: list[Transport] = []
    for raw in lines:
        line = raw.strip()
        if "NCCL" not in line and "NET/" not in line:
            continue
        if m := _USING_NETWORK.search(line):
            found.setdefault(1, []).append(Transport(transport_name(m["name"]), line))
        elif m := _VIA_NET.search(line):
            found.setdefault(2, []).append(Transport(transport_name(m["name"]), line))
        elif m := _PLUGIN_UP.search(line):
            if m["name"]:
                found.setdefault(3, []).append(Transport(transport_name(m["name"]), line))
            else:
                name = transport_name(m["plugin"])
                # "GPUDirectTCPX enable: 0": the plugin is loaded but moves data through the
                # host like plain sockets (SkyPilot's USE_GPU_DIRECT=false runs)
                if re.search(r"enable:\s*0\b", m["rest"]):
                    name = "socket"
                found.setdefault(3, []).append(Transport(name, line))
        elif m := _OFI_PROVIDER.search(line):
            provider = m["provider"].split(";")[0].lower()
            ofi.append(Transport("efa" if provider == "efa" else "socket", line))
    if found:
        best = found[min(found)]
        result = min(best, key=lambda t: _RANK.get(t.name, 1))
    elif ofi:
        result = min(ofi, key=lambda t: _RANK[t.name])
    else:
        return Transport(UNKNOWN)
    tcp_ofi = next((t for t in ofi if t.name == "socket"), None)
    if result.name == "efa" and tcp_ofi is not None:
        return tcp_ofi
    return result


# expected -> transports that count as delivering it
_ACCEPTS = {"rdma": {"rdma", "ib"}, "ib": {"ib", "rdma"}}


def matches(expected: str, found: str) -> bool:
    """Whether `found` delivers the `expected` fabric ('socket' expected: anything does)."""
    if expected == "socket":
        return True
    return found in _ACCEPTS.get(expected, {expected})


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
