"""Name the likely cause of a failed launch from the nodes' output, and the fix.

`diagnose(lines)` scans `[node-i] `-prefixed output (as launch streams it) against a table of
known failure signatures: NCCL socket/IB errors, watchdog timeouts, CUDA OOM, rendezvous and
port problems, missing interfaces, version mismatches, full disks, missing modules. Each
signature appears once in the result, at the position of its first occurrence, with every node
that showed it. Pure: no I/O; the CLI prints the result under the error.

The patterns were checked against real log excerpts: tests/data/logs/ (sources in SOURCES.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_NODE_PREFIX = re.compile(r"^\[(?P<node>node-[\w.-]+)\] ?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Signature:
    id: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    generic: bool = False  # a wrapper/catch-all: listed after the specific signatures


@dataclass(frozen=True)
class Diagnosis:
    signature: str
    cause: str
    fix: str
    node: str | None  # first node that showed it (None: a line without a node prefix)
    line: str  # the first matching line, prefix stripped
    nodes: tuple[str, ...] = field(default=())  # every node that showed it, in order


def _rx(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


# Order matters only when one line matches several signatures: the first listed wins, so the
# specific ones come before the generic wrappers (ChildFailedError, ncclSystemError).
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "nccl-connect",
        _rx(
            r"WARN .*Connect(ion)? to \S+ failed",
            r"WARN Call to connect failed",
            r"NCCL WARN .*(Connection refused|No route to host|Network is unreachable)",
        ),
        "NCCL could not open a TCP connection to another rank: it picked an interface the peer "
        "cannot reach, or a firewall/security group drops the ports NCCL opens between nodes.",
        "Set NCCL_SOCKET_IFNAME to the private interface every node shares (e.g. "
        "NCCL_SOCKET_IFNAME=eth0 or ens5), allow all TCP between the cluster's nodes in the "
        "security group/firewall (NCCL uses ephemeral ports), then run `mgpu-cloud check NAME`.",
    ),
    Signature(
        "iface-not-found",
        _rx(
            r"no socket interface found",
            r"(NCCL|GLOO)_SOCKET_IFNAME.*(not found|no interface)",
            r"Unable to find address for",
            r"ncclSocketInit: connecting to address .* is neither AF_INET",
            r"(gloo|socket|NCCL).*Bad address",
        ),
        "The network interface named for NCCL/Gloo does not exist (or has no address) on this "
        "node, so no bootstrap address could be chosen.",
        "Run `ip -br addr` on every node and set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to an "
        "interface present on all of them (e.g. eth0; a prefix like `ens` matches ens5 too), or "
        "unset both to let NCCL choose.",
    ),
    Signature(
        "ib-verbs",
        _rx(
            r"NCCL WARN .*\bibv_\w+",
            r"\bibv_\w+\(?\)? failed",
            r"NET/IB\s*:.*(error|failed|[Ee]rror \d+)",
            r"NCCL WARN NET/OFI",
        ),
        "An RDMA (InfiniBand/RoCE/EFA) verbs call failed: usually the locked-memory limit is too "
        "low, the RDMA devices are not visible in the container, or the fabric reported an error.",
        "Run the container with `--ulimit memlock=-1 --device=/dev/infiniband --cap-add IPC_LOCK` "
        "(or `ulimit -l unlimited` on the host); on EFA install aws-ofi-nccl and set "
        "FI_PROVIDER=efa; to confirm it is RDMA, retry with NCCL_IB_DISABLE=1 (TCP, slower).",
    ),
    Signature(
        "nccl-timeout",
        _rx(
            r"Watchdog caught collective operation timeout",
            r"NCCL watchdog thread terminated",
            r"ProcessGroupNCCL.*(timed out|[Tt]imeout\()",
            r"ncclRemoteError",
        ),
        "A collective did not finish within the process-group timeout: one rank hung, crashed, "
        "called a different collective, or the network between nodes stalled.",
        "Find the first rank that failed in the output above (the others only time out waiting "
        "for it); rerun with NCCL_DEBUG=INFO; measure the links with `mgpu-cloud check NAME "
        "--bandwidth`; raise init_process_group(timeout=...) only for a known slow step.",
    ),
    Signature(
        "cuda-oom",
        _rx(
            r"CUDA out of memory",
            r"torch\.(cuda\.)?OutOfMemoryError",
            r"CUDA error: out of memory",
            r"CUBLAS_STATUS_ALLOC_FAILED",
        ),
        "A GPU ran out of memory.",
        "Lower the per-GPU batch size (keep the global batch with gradient accumulation), enable "
        "activation checkpointing, shard with DeepSpeed ZeRO-2/3 or FSDP, train in bf16; for "
        "fragmentation set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    ),
    Signature(
        "rendezvous-timeout",
        _rx(
            r"RendezvousTimeoutError",
            r"RendezvousConnectionError",
            r"The client socket has timed out",
            r"Timed out after \d+ seconds? waiting for clients",
            r"[Ss]ocket [Tt]imeout",
        ),
        "The nodes could not meet at MASTER_ADDR:MASTER_PORT: a node did not start, the master "
        "address is wrong (public instead of private), or the port is blocked.",
        "Use the master's private address, open --master-port to the cluster's subnet in the "
        "security group/firewall, make sure every node was launched with the same --nnodes, and "
        "run `mgpu-cloud check NAME` to test the port from every node.",
    ),
    Signature(
        "address-in-use",
        _rx(r"Address already in use", r"EADDRINUSE", r"errno: 98\b"),
        "The master port is already taken on the master node (a previous run still holds it, "
        "or two jobs share the port).",
        "Pick another --master-port (e.g. 29501), or stop the previous run holding it "
        "(`ss -ltnp | grep PORT` on the master shows its pid).",
    ),
    Signature(
        "driver-too-old",
        _rx(
            r"CUDA driver version is insufficient",
            r"The NVIDIA driver on your system is too old",
        ),
        "The node's NVIDIA driver is older than the CUDA runtime torch was built with.",
        "Install a torch built for an older CUDA (e.g. the cu121 wheel) or upgrade the driver; "
        "`mgpu-cloud check NAME` shows each node's driver and CUDA version.",
    ),
    Signature(
        "version-mismatch",
        _rx(
            r"NCCL version mismatch",
            r"NCCL WARN .*\b[Vv]ersion\b",
            r"[Vv]ersion mismatch",
            r"collective mismatch error",
        ),
        "The ranks run different NCCL/torch builds (or configurations), so their wire formats "
        "or collectives disagree.",
        "Run every node from the same image or lockfile (same torch and NCCL); compare the "
        "versions with `mgpu-cloud check NAME` and reinstall the odd node.",
    ),
    Signature(
        "shm",
        _rx(
            r"unable to allocate shared memory",
            r"Error while creating shared memory segment",
            r"shm_open|/dev/shm.*(No space|full)",
            r"bus error.*shared memory|insufficient shared memory",
        ),
        "Shared memory (/dev/shm) is too small: Docker gives containers 64 MB by default.",
        "Start the container with `--ipc=host` (or `--shm-size=16g`).",
    ),
    Signature(
        "gloo-reset",
        _rx(
            r"gloo.*Connection (reset|closed) by peer",
            r"pair\.cc.*(Connection (reset|closed) by peer|Read error)",
            r"Gloo connectFullMesh failed",
        ),
        "A Gloo peer dropped its connection: the process on the other side died (its own error "
        "is in that node's output) or the network between the nodes broke.",
        "Look for the first error on the other nodes above; set GLOO_SOCKET_IFNAME to the "
        "private interface (e.g. GLOO_SOCKET_IFNAME=eth0) if the nodes have several.",
    ),
    Signature(
        "no-space",
        _rx(r"No space left on device", r"Errno 28\b", r"Disk quota exceeded", r"StorageFull"),
        "A disk filled up (checkpoints, datasets or caches), or /dev/shm in a container.",
        "Free space or write checkpoints to a larger volume (raise the root volume size); for "
        "/dev/shm in Docker use `--ipc=host`; `mgpu-cloud check NAME` shows free disk per node.",
    ),
    Signature(
        "host-oom",
        _rx(r"exitcode\s*:\s*-9\b", r"Out of memory: Killed process", r"signal 9 \(SIGKILL\)"),
        "A worker was killed with SIGKILL, most often by the kernel's OOM killer (host RAM, "
        "not GPU memory).",
        "Lower DataLoader num_workers / prefetch, avoid loading the dataset in every rank, "
        "use an instance with more RAM; `dmesg | grep -i kill` on the node confirms it.",
    ),
    Signature(
        "module-not-found",
        _rx(r"ModuleNotFoundError: No module named"),
        "The training script imports a package that is not installed in the node's python.",
        "Install it on every node (`pip install PACKAGE`, or add it to the image / "
        "requirements.txt of the workdir) and launch with the same python.",
    ),
    Signature(
        "nccl-system-error",
        _rx(r"unhandled system error", r"ncclSystemError", r"ncclInternalError"),
        "NCCL failed in a system call (socket, shared memory, RDMA) without a clearer message.",
        "Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and read the first `NCCL WARN` line.",
        generic=True,
    ),
    Signature(
        "child-failed",
        _rx(r"ChildFailedError"),
        "torchrun reports that a worker process exited with an error; it is the wrapper, not the "
        "cause.",
        "Read the 'Root Cause (first observed failure)' block and the first traceback of that "
        "rank above; exitcode -9 means it was killed (often host out-of-memory).",
        generic=True,
    ),
)


def split_node(line: str) -> tuple[str | None, str]:
    """'[node-1] text' -> ('node-1', 'text'); no prefix -> (None, line). ANSI colours removed."""
    clean = _ANSI.sub("", line.rstrip("\r\n"))
    match = _NODE_PREFIX.match(clean)
    if match:
        return match.group("node"), clean[match.end() :]
    return None, clean


def match_line(text: str) -> Signature | None:
    """The first signature whose pattern occurs in text, or None."""
    for signature in SIGNATURES:
        if any(p.search(text) for p in signature.patterns):
            return signature
    return None


def diagnose(lines: Iterable[str]) -> list[Diagnosis]:
    """One Diagnosis per signature seen, with every node that showed it.

    Ordered by first occurrence, except that generic wrappers (ChildFailedError, a bare
    ncclSystemError) come after the specific causes, whose fix is the one that helps.
    """
    first: dict[str, tuple[str | None, str]] = {}
    nodes: dict[str, list[str]] = {}
    order: list[Signature] = []
    for raw in lines:
        node, text = split_node(raw)
        signature = match_line(text)
        if signature is None:
            continue
        if signature.id not in first:
            first[signature.id] = (node, text.strip())
            nodes[signature.id] = []
            order.append(signature)
        if node is not None and node not in nodes[signature.id]:
            nodes[signature.id].append(node)
    return [
        Diagnosis(
            signature=s.id,
            cause=s.cause,
            fix=s.fix,
            node=first[s.id][0],
            line=first[s.id][1],
            nodes=tuple(nodes[s.id]),
        )
        for s in sorted(order, key=lambda sig: sig.generic)  # stable: keeps first-seen order
    ]
