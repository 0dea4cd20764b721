"""`mgpu-cloud check`: compare every node's preflight and judge an all-reduce sweep (pure).

Input is what the nodes print: `remote.pyz preflight --json` (one dict per node) and the JSON
lines of `remote.pyz allreduce`. Nothing here runs commands or prints; the CLI renders the rows.

Severity: 'error' (the job will fail or be badly slow), 'warning' (worth a look), 'info'.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provision.model.nodetext import shown

GiB = 2**30
LOW_DISK_WARN = 20 * GiB
LOW_DISK_ERROR = 2 * GiB
SLOW_RANK_RATIO = 1.5  # a rank slower than 1.5x the median rank time is named
BANDWIDTH_OK_FRACTION = 0.7  # measured busbw below 70% of the reference floor is "slow"


@dataclass(frozen=True)
class Finding:
    severity: str  # 'error' | 'warning' | 'info'
    check: str  # short id: 'torch-version', 'gpu-model', 'gpu-count', 'master-port', ...
    message: str
    nodes: tuple[str, ...] = ()
    hint: str | None = None


# ----------------------------------------------------------------------------- preflight


def _versions(report: Mapping[str, Any]) -> dict[str, str | None]:
    torch = report.get("torch") or {}
    gpus = report.get("gpus") or []
    drivers = sorted({str(g.get("driver_version")) for g in gpus if g.get("driver_version")})
    return {
        "torch": torch.get("torch"),
        "CUDA": torch.get("cuda"),
        "NCCL": torch.get("nccl") if gpus else None,  # NCCL is irrelevant on a CPU node
        "driver": ",".join(drivers) or None,
    }


def _fmt_by_node(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{node}={value}" for node, value in values.items())


@dataclass(frozen=True)
class Nodes:
    """What every preflight rule reads: the reports of the nodes whose preflight ran (node
    name -> report) and what the user asked for."""

    reports: Mapping[str, Mapping[str, Any]]
    expected_gpus: int | None
    min_free_disk: int

    def counts(self) -> dict[str, int]:
        return {n: len(r.get("gpus") or []) for n, r in self.reports.items()}

    def ports(self) -> dict[str, Mapping[str, Any]]:
        return {n: p for n, r in self.reports.items() if (p := r.get("master_port") or {})}


Rule = Callable[[Nodes], list[Finding]]


def _one(severity: str, check: str, message: str, nodes: Sequence[str],
         hint: str | None = None) -> list[Finding]:
    return [Finding(severity, check, message, tuple(nodes), hint)]


def no_torch(ns: Nodes) -> list[Finding]:
    """A missing or broken torch fails its import at once: an error, each node's reason shown.
    An import past the probe's time (a busy node; a cold disk's first read): a warning."""
    absent = [n for n, r in ns.reports.items() if not r.get("torch")]
    slow = [n for n in absent if ns.reports[n].get("torch_timed_out") is True]
    out: list[Finding] = []
    for severity, nodes, message, hint in (
            ("error", [n for n in absent if n not in slow], "torch cannot be imported by the "
             "node's python", "install torch on these nodes (or run in the training image)"),
            ("warning", slow, "torch's import did not finish in the probe's time: not checked",
             "a busy node, or a first read from a cold disk; without torch, the launch fails")):
        why = "; ".join(f"{n}: {shown(str(err))[:200]}" for n in nodes
                        if (err := ns.reports[n].get("torch_error")))
        out += _one(severity, "torch", f"{message} ({why})" if why else message, nodes, hint)
    return [f for f in out if f.nodes]


def same_versions(ns: Nodes) -> list[Finding]:
    out: list[Finding] = []
    for key in ("torch", "CUDA", "NCCL", "driver"):
        values = {n: v for n, r in ns.reports.items() if (v := _versions(r)[key]) is not None}
        if len(set(values.values())) > 1:
            out += _one("error", f"{key.lower()}-version",
                        f"different {key} versions: {_fmt_by_node(values)}", list(values),
                        "run every node from the same image / lockfile")
    return out


def one_gpu_model(ns: Nodes) -> list[Finding]:
    models = {n: " + ".join(names) for n, r in ns.reports.items()
              if (names := sorted({str(g.get("name")) for g in r.get("gpus") or []}))}
    if len({m for names in models.values() for m in names.split(" + ")}) <= 1:
        return []
    return _one("error", "gpu-model", f"different GPU models in one job: {_fmt_by_node(models)}",
                list(models), "use one instance type; the slowest GPU sets the pace and memory "
                "limits differ")


def gpu_count(ns: Nodes) -> list[Finding]:
    counts, asked = ns.counts(), ns.expected_gpus
    if asked:
        short = {n: c for n, c in counts.items() if c < asked}
        return _one("error", "gpu-count", f"fewer GPUs than the {asked} asked per node: "
                    f"{_fmt_by_node(short)}", list(short), "check `nvidia-smi` on those nodes "
                    "(driver, a failed GPU) or lower --gpus-per-node") if short else []
    if len(set(counts.values())) > 1:
        return _one("warning", "gpu-count", f"nodes have different GPU counts: "
                    f"{_fmt_by_node(counts)}", list(counts), "set nproc-per-node to the smallest "
                    "count")
    return []


def nvidia_smi_works(ns: Nodes) -> list[Finding]:
    return [Finding("error", "nvidia-smi", str(error), (n,),
                    "reboot or reinstall the NVIDIA driver on the node")
            for n, r in ns.reports.items()
            if (error := r.get("gpu_error")) and error != "nvidia-smi not found"]


def no_gpu(ns: Nodes) -> list[Finding]:
    none = [n for n, c in ns.counts().items() if c == 0 and not ns.expected_gpus]
    return _one("info", "no-gpu", "no GPU: the job runs on CPU with gloo", none) if none else []


def master_port_free(ns: Nodes) -> list[Finding]:
    return [Finding("error", "master-port", f"port {p.get('port')} is already in use on the "
                    "master", (n,), "pick another --master-port or stop the process holding it")
            for n, p in ns.ports().items() if p.get("bindable") is False]


def master_port_reachable(ns: Nodes) -> list[Finding]:
    blocked = {n: p for n, p in ns.ports().items() if not p.get("reachable", True)}
    if not blocked:
        return []
    some = next(iter(blocked.values()))
    return _one("error", "master-port", f"master {some.get('addr')}:{some.get('port')} "
                f"unreachable: {_fmt_by_node({n: p.get('status') for n, p in blocked.items()})}",
                list(blocked), "open the port to the cluster's private subnet in the "
                "security group/firewall, and use the master's private address")


def one_topology(ns: Nodes) -> list[Finding]:
    counts = ns.counts()
    topologies = {n: t for n, r in ns.reports.items()
                  if (t := (r.get("topology") or {}).get("summary")) and counts.get(n, 0) > 1}
    if len(set(topologies.values())) <= 1:
        return []
    return _one("warning", "topology", f"different GPU interconnects: "
                f"{_fmt_by_node(topologies)}", list(topologies),
                "PCIe nodes will hold back NVLink nodes in every all-reduce")


def disk_space(ns: Nodes) -> list[Finding]:
    out = []
    for n, r in ns.reports.items():
        free = (r.get("disk") or {}).get("free_bytes")
        if free is not None and free < LOW_DISK_ERROR:
            out.append(Finding("error", "disk", f"{free / GiB:.1f} GiB free in the workdir",
                               (n,), "free space or use a larger volume"))
        elif free is not None and free < ns.min_free_disk:
            out.append(Finding("warning", "disk", f"{free / GiB:.1f} GiB free in the workdir",
                               (n,), "checkpoints may not fit"))
    return out


# Every rule over the nodes whose preflight ran, in the order their findings are listed
# (within one severity). A rule is small, pure and independent of the others.
PREFLIGHT_RULES: tuple[Rule, ...] = (
    no_torch, same_versions, one_gpu_model, gpu_count, nvidia_smi_works, no_gpu,
    master_port_free, master_port_reachable, one_topology, disk_space,
)
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def compare_preflights(
    reports: Mapping[str, Mapping[str, Any]],
    expected_gpus_per_node: int | None,
    min_free_disk_bytes: int = LOW_DISK_WARN,
) -> list[Finding]:
    """Findings over all nodes' preflight reports (node name -> report), errors first: a
    node whose preflight did not run, then every PREFLIGHT_RULES rule over the others (torch
    missing, different torch/CUDA/NCCL/driver versions, mixed GPU models, fewer GPUs than
    expected or different counts, nvidia-smi failing, no GPU at all (info: CPU with gloo), a
    master port taken on the master or unreachable, mixed topologies, low disk)."""
    findings = [Finding("error", "preflight", f"preflight did not run: {r['error']}", (n,),
                        "check SSH to the node and that python3 exists there")
                for n, r in reports.items() if r.get("error") and "gpus" not in r]
    ran = {n: r for n, r in reports.items() if not (r.get("error") and "gpus" not in r)}
    nodes = Nodes(ran, expected_gpus_per_node, min_free_disk_bytes)
    for rule in PREFLIGHT_RULES:
        findings += rule(nodes)
    return sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 3))


def port_text(port: Mapping[str, Any]) -> str:
    """The master port column: `refused` is the healthy state before a job (the master
    answered, nothing listens there yet), so the table says so."""
    status = str(port.get("status", "-"))
    return {"refused": "refused (ok: reachable, free)",
            "open": "open (something listens)"}.get(status, status)


def preflight_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """One row per node for the CLI table: node, GPUs, driver, torch, CUDA, NCCL, topology,
    free disk, master port."""
    rows: list[tuple[str, ...]] = [
        ("node", "gpus", "driver", "torch", "cuda", "nccl", "topology", "disk free", "master port")
    ]
    for node, report in reports.items():
        if "gpus" not in report:
            rows.append((node, f"error: {report.get('error')}", "", "", "", "", "", "", ""))
            continue
        gpus = report.get("gpus") or []
        names = sorted({str(g.get("name")) for g in gpus})
        versions = _versions(report)
        topo = (report.get("topology") or {}).get("summary") or "-"
        free = (report.get("disk") or {}).get("free_bytes")
        port = report.get("master_port") or {}
        rows.append(
            (
                node,
                f"{len(gpus)} x {' + '.join(names)}"
                if gpus
                else f"0 ({report.get('gpu_error') or 'none'})",
                versions["driver"] or "-",
                versions["torch"] or "-",
                versions["CUDA"] or "-",
                versions["NCCL"] or "-",
                topo,
                f"{free / GiB:.0f} GiB" if free is not None else "-",
                port_text(port),
            )
        )
    return rows


def render_findings_table(findings: Sequence[Finding]) -> list[tuple[str, str, str, str]]:
    """Rows (severity, check, nodes, message [+ hint]) with a header row first; empty findings
    give one 'ok' row so the table is never blank."""
    rows = [("severity", "check", "nodes", "finding")]
    if not findings:
        rows.append(("ok", "all", "all", "no mismatch found"))
    for f in findings:
        text = f.message if not f.hint else f"{f.message}\n→ {f.hint}"
        rows.append((f.severity, f.check, ", ".join(f.nodes) or "-", text))
    return rows


# ----------------------------------------------------------------------------- bandwidth

# Expected all-reduce bus bandwidth (GB/s = 1e9 B/s, as nccl-tests) for large messages.
# (low, high). These are rules of thumb, not guarantees; sources:
# - nvlink3: 8x A100 SXM4 on 3rd-gen NVLink/NVSwitch (600 GB/s per GPU bidirectional); NVIDIA
#   quotes ~230 GB/s busbw for nccl-tests all_reduce on DGX A100; NVIDIA/nccl-tests#100
#   ("HGX A100 can not reach peak bandwidth on 2nd Gen NVSwitch") discusses the same ceiling.
# - nvlink4: 8x H100 SXM5, 4th-gen NVLink (900 GB/s per GPU); ~360 GB/s with ring/tree and up
#   to ~480 GB/s with NVLS (NVLink SHARP) in NCCL >= 2.17 (NVIDIA DGX H100 / NCCL release notes).
# - pcie4: PCIe 4.0 x16 is 32 GB/s per direction raw; all-reduce busbw ~ 20 GB/s in practice.
# - pcie3: half of PCIe 4 (16 GB/s raw), ~ 10 GB/s busbw.
# - efa-p4d: AWS p4d.24xlarge, 4x100 Gbps EFA = 400 Gbps = 50 GB/s; ~40-45 GB/s busbw across
#   nodes (AWS EFA/aws-ofi-nccl performance notes).
# - efa-p5: AWS p5.48xlarge, 32x100 Gbps EFA = 3200 Gbps = 400 GB/s line rate; the range below
#   assumes 65-85% of line rate (derived, not a published figure).
# - ib-hdr / ib-ndr: per 200 / 400 Gb/s HCA (25 / 50 GB/s line rate); nccl-tests reaches
#   ~92% of line rate on one rail (~23 / ~46 GB/s). Multiply by the rails in use.
# - eth-10/25/100: TCP sockets reach ~80-90% of line rate (1.25 / 3.1 / 12.5 GB/s raw).
REFERENCE_BUSBW_GBPS: dict[str, tuple[float, float]] = {
    "nvlink3": (200.0, 240.0),
    "nvlink4": (360.0, 480.0),
    "pcie4": (18.0, 22.0),
    "pcie3": (9.0, 11.0),
    "efa-p4d": (40.0, 45.0),
    "efa-p5": (260.0, 340.0),
    "ib-hdr": (21.0, 23.5),
    "ib-ndr": (42.0, 47.0),
    "eth-10": (1.0, 1.15),
    "eth-25": (2.5, 2.9),
    "eth-100": (9.0, 11.5),
}


@dataclass(frozen=True)
class SlowRank:
    rank: int
    host: str | None
    ratio: float  # its time / the median rank time, worst over the sizes where it was slow
    sizes_slow: int  # at how many message sizes it crossed SLOW_RANK_RATIO


@dataclass(frozen=True)
class BandwidthSummary:
    interconnect: str
    peak_busbw_gbps: float
    expected_busbw_gbps: tuple[float, float] | None
    fraction_of_expected: float | None  # peak / expected low bound
    verdict: str  # 'ok' | 'slow' | 'unknown'
    slow_ranks: tuple[SlowRank, ...] = ()
    findings: tuple[Finding, ...] = field(default=())


def _host_of(rank: int, hosts: Sequence[str]) -> str | None:
    return hosts[rank] if rank < len(hosts) else None


def summarize_bandwidth(
    results: Sequence[Mapping[str, Any]], interconnect: str
) -> BandwidthSummary:
    """Judge an allreduce sweep (its JSON lines, summary line included or not).

    Peak busbw over sizes is compared with REFERENCE_BUSBW_GBPS[interconnect]: below
    BANDWIDTH_OK_FRACTION of the low bound is 'slow'; an unknown interconnect is 'unknown'.
    A rank whose time exceeds SLOW_RANK_RATIO x the median at some size is named, with its host.
    """
    per_size = [r for r in results if "busbw_gbps" in r]
    summary = next((r for r in results if r.get("summary")), {})
    hosts = [str(h) for h in summary.get("hosts", [])]
    findings: list[Finding] = []
    errors = [str(r["error"]) for r in results if "error" in r]
    findings += [Finding("error", "bandwidth", f"benchmark failed: {error}") for error in errors]
    peak = max((float(r["busbw_gbps"]) for r in per_size), default=0.0)

    slow: dict[int, tuple[float, int]] = {}
    for r in per_size:
        times = [float(t) for t in r.get("rank_time_us", [])]
        if len(times) < 2:
            continue
        median = statistics.median(times)
        for rank, t in enumerate(times):
            if median > 0 and t > SLOW_RANK_RATIO * median:
                ratio, count = slow.get(rank, (0.0, 0))
                slow[rank] = (max(ratio, t / median), count + 1)
    slow_ranks = tuple(
        SlowRank(rank, _host_of(rank, hosts), round(ratio, 2), count)
        for rank, (ratio, count) in sorted(slow.items(), key=lambda kv: -kv[1][0])
    )
    for s in slow_ranks:
        where = f" on {s.host}" if s.host else ""
        findings.append(Finding(
            "warning", "slow-rank", f"rank {s.rank}{where} took {s.ratio:.1f}x the median time "
            f"at {s.sizes_slow} of {len(per_size)} sizes", (s.host,) if s.host else (),
            "compare that node's GPUs/links in `mgpu-cloud check NAME` (PCIe width, "
            "a throttled GPU, another job on it)"))

    expected = REFERENCE_BUSBW_GBPS.get(interconnect)
    if expected is None or not per_size:
        verdict, fraction = "unknown", None
    else:
        fraction = round(peak / expected[0], 3)
        verdict = "ok" if fraction >= BANDWIDTH_OK_FRACTION else "slow"
        if verdict == "slow":
            culprit = (f"; slowest: rank {slow_ranks[0].rank} on {slow_ranks[0].host}"
                       if slow_ranks else "")
            findings.append(Finding(
                "error", "bandwidth", f"peak busbw {peak:.1f} GB/s is {fraction:.0%} of the "
                f"{expected[0]:g}-{expected[1]:g} GB/s expected for {interconnect}{culprit}",
                tuple(hosts), "check NCCL_DEBUG=INFO for 'via NET/Socket' where IB/EFA was "
                "expected, NCCL_SOCKET_IFNAME, and the instance's network settings"))
    return BandwidthSummary(
        interconnect, peak, expected, fraction, verdict, slow_ranks, tuple(findings)
    )


def bandwidth_rows(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """nccl-tests-like rows: size, count, time (us), algbw, busbw (GB/s); header first."""
    rows: list[tuple[str, ...]] = [
        ("size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)")]
    rows += [(str(r["size_bytes"]), str(r["count"]), f"{float(r['time_us']):.1f}",
              f"{float(r['algbw_gbps']):.2f}", f"{float(r['busbw_gbps']):.2f}")
             for r in results if "busbw_gbps" in r]
    return rows


def guess_interconnect(report: Mapping[str, Any], nodes: int) -> str | None:
    """A reference key for a job on `nodes` such nodes, from one preflight report; None when
    the fabric between nodes is unknown (the CLI then asks for --interconnect)."""
    if nodes > 1:
        return None  # EFA / IB / Ethernet cannot be told from nvidia-smi
    topo = report.get("topology") or {}
    if topo.get("summary") == "nvlink":
        lanes = topo.get("nvlink_min") or 0
        return "nvlink4" if lanes >= 18 else "nvlink3" if lanes >= 12 else None
    if topo.get("summary") == "pcie":
        return "pcie4"
    return None
