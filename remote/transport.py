"""Which network NCCL chose, read from its INFO lines (pure, stdlib only).

    transport_of(lines)       -> Transport (efa | ib | tcpx | tcpxo | rdma | socket | unknown)
    matches(expected, found)  -> bool

Shared by the nodes (remote/injob.py judges the fabric gate inside the job's own processes)
and the controller (provision/job/gate/fabric.py re-exports these; provision/job/gate/judge.py judges the same
output), so both read the same lines the same way. The patterns were checked against real
captured logs: tests/data/logs/nccl-*.log (sources in tests/data/logs/SOURCES.md).

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


def relevant(line: str) -> bool:
    """Whether transport_of could read anything from `line` (nodes keep only these)."""
    return "NCCL" in line or "NET/" in line

