"""`preflight`: what this node brings to a distributed job (stdlib only; torch is probed in a child).

    python3 remote.pyz preflight [--json] [--workdir DIR] [--master-addr A --master-port P]

Reports GPUs (`nvidia-smi --query-gpu`), the GPU/NIC topology (`nvidia-smi topo -m`), the
torch/CUDA/NCCL versions seen by the node's python, free disk in the workdir, host name,
addresses and interfaces, and whether MASTER_ADDR:MASTER_PORT can be reached.

Contract: never fails because something is missing. A node without nvidia-smi reports
`gpus: []` and `gpu_error: "nvidia-smi not found"`; a python without torch reports
`torch: null`. Exit code 0 unless the arguments are wrong (2). `--json` prints ONE object.
The parsing functions are pure and tested on captured outputs (tests/data/nvidia-smi/).
"""

from __future__ import annotations

import argparse
import csv
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

QUERY_FIELDS = ("index", "name", "memory.total", "memory.used", "driver_version")
QUERY_ARGS = [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]

# torch is imported by the node's own python in a child process, so this module stays stdlib-only
# and a broken torch install (segfault, CUDA init hang) cannot take preflight down with it.
TORCH_PROBE = r"""
import json
try:
    import torch
except Exception as exc:  # ImportError, or a broken install
    print(json.dumps({"torch": None, "error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False,
       "device_count": 0, "nccl": None,
       "gloo": bool(torch.distributed.is_available() and torch.distributed.is_gloo_available())}
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""

Runner = Callable[[Sequence[str], float], tuple[int, str, str]]


# ----------------------------------------------------------------------------- pure parsers

_NA = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


def _field_key(header_cell: str) -> str:
    """'memory.total [MiB]' -> 'memory.total' (the header form of `--format=csv`)."""
    return header_cell.split(" [", 1)[0].strip().lower()


def _number(value: str | None) -> int | None:
    """'81920 MiB' / '81920' -> 81920; N/A and garbage -> None."""
    if value is None or value.strip().lower() in _NA:
        return None
    match = re.match(r"\s*(-?\d+(?:\.\d+)?)", value)
    return int(float(match.group(1))) if match else None


def _text(value: str | None) -> str | None:
    if value is None or value.strip().lower() in _NA:
        return None
    return value.strip()


def parse_query_gpu(csv_text: str) -> list[dict[str, Any]]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` output.

    With a header line the columns are found by name (any order, extra columns ignored);
    without one they are assumed to be QUERY_FIELDS in order. Units ("MiB") and "[N/A]"
    are accepted. Each GPU becomes {index, name, memory_total_mib, memory_used_mib,
    driver_version}; a value that is absent or N/A is None.
    """
    lines = [ln for ln in csv_text.splitlines() if ln.strip()]
    if not lines:
        return []
    rows = list(csv.reader(lines, skipinitialspace=True))
    fields: list[str] = list(QUERY_FIELDS)
    first = [_field_key(c) for c in rows[0]]
    if any(cell in ("index", "name", "memory.total", "driver_version") for cell in first):
        fields, rows = first, rows[1:]
    gpus: list[dict[str, Any]] = []
    for row in rows:
        cells = dict(zip(fields, (c.strip() for c in row), strict=False))
        gpus.append(
            {
                "index": _number(cells.get("index")),
                "name": _text(cells.get("name")),
                "memory_total_mib": _number(cells.get("memory.total")),
                "memory_used_mib": _number(cells.get("memory.used")),
                "driver_version": _text(cells.get("driver_version")),
            }
        )
    for position, gpu in enumerate(gpus):
        if gpu["index"] is None:
            gpu["index"] = position
    return gpus


_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\w+|[a-z]+\d*_\w+)$")
_NV = re.compile(r"^NV(\d+)$")


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """Parse `nvidia-smi topo -m` into a link matrix.

    Returns {gpus, nics, links, nic_names, nvlink_pairs, pcie_pairs, nvlink_min, summary}:
    - links[a][b]: the link kind between devices a and b ('NV12', 'NV18', 'PIX', 'PXB',
      'PHB', 'NODE', 'SYS'); rows for NICs are included when present.
    - summary: 'nvlink' when every GPU pair is NV#, 'pcie' when at least one pair is not
      (a pair-bridged PCIe box is 'pcie': an 8-way all-reduce runs at PCIe speed),
      'none' with fewer than two GPUs or no matrix.
    - nvlink_min: the smallest NV# among GPU pairs (12 on A100 SXM, 18 on H100 SXM), or None.
    Tolerates tabs or spaces, a missing CPU Affinity cell, truncated rows and missing NIC rows.
    """
    lines = text.splitlines()
    header_at = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"]), None)
    empty: dict[str, Any] = {
        "gpus": [], "nics": [], "links": {}, "nic_names": {},
        "nvlink_pairs": 0, "pcie_pairs": 0, "nvlink_min": None, "summary": "none",
    }  # fmt: skip
    if header_at is None:
        return empty
    columns: list[str] = []
    for token in lines[header_at].split():
        if not _DEVICE.match(token):
            break  # 'CPU Affinity' and what follows are not devices
        columns.append(token)
    links: dict[str, dict[str, str]] = {}
    nic_names: dict[str, str] = {}
    for line in lines[header_at + 1 :]:
        stripped = line.strip()
        if stripped.startswith("Legend"):
            continue
        legend = re.match(r"^(NIC\d+):\s*(\S+)$", stripped)
        if legend:
            nic_names[legend.group(1)] = legend.group(2)
            continue
        tokens = stripped.split()
        if not tokens or tokens[0] not in columns:
            continue
        row = tokens[0]
        values = tokens[1 : 1 + len(columns)]
        links[row] = {col: val for col, val in zip(columns, values, strict=False) if col != row}
    gpus = [c for c in columns if c.startswith("GPU")]
    nics = [c for c in columns if not c.startswith("GPU")]
    nv_counts: list[int] = []
    pcie_pairs = 0
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            kind = links.get(a, {}).get(b) or links.get(b, {}).get(a)
            if kind is None:
                continue
            match = _NV.match(kind)
            if match:
                nv_counts.append(int(match.group(1)))
            else:
                pcie_pairs += 1
    if len(gpus) < 2 or (not nv_counts and not pcie_pairs):
        summary = "none"
    elif pcie_pairs:
        summary = "pcie"
    else:
        summary = "nvlink"
    return {
        "gpus": gpus,
        "nics": nics,
        "links": links,
        "nic_names": nic_names,
        "nvlink_pairs": len(nv_counts),
        "pcie_pairs": pcie_pairs,
        "nvlink_min": min(nv_counts) if nv_counts else None,
        "summary": summary,
    }


# ----------------------------------------------------------------------------- side effects


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run argv; (returncode, stdout, stderr). A missing program is rc 127, a timeout rc 124."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)  # noqa: S603
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:g}s"
    return done.returncode, done.stdout, done.stderr


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _gpus(run: Runner, which: Callable[[str], str | None], timeout: float) -> dict[str, Any]:
    smi = which("nvidia-smi")
    if smi is None:
        return {"gpus": [], "gpu_error": "nvidia-smi not found", "topology": None}
    rc, out, err = run([smi, *QUERY_ARGS], timeout)
    if rc != 0:
        # e.g. "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        reason = _last_line(err) or _last_line(out) or f"exit code {rc}"
        return {"gpus": [], "gpu_error": f"nvidia-smi failed: {reason}", "topology": None}
    gpus = parse_query_gpu(out)
    topology: dict[str, Any] | None = None
    if len(gpus) > 1:
        rc, out, err = run([smi, "topo", "-m"], timeout)
        topology = parse_topo_matrix(out) if rc == 0 else {"error": _last_line(err) or f"rc {rc}"}
    return {"gpus": gpus, "gpu_error": None, "topology": topology}


def _torch(run: Runner, python: str, timeout: float) -> dict[str, Any]:
    rc, out, err = run([python, "-c", TORCH_PROBE], timeout)
    try:
        probe: dict[str, Any] = json.loads(_last_line(out))
    except ValueError:
        reason = _last_line(err) or f"exit code {rc}"
        # not finished in time (run_command's 124; the probe itself always exits 0): a busy
        # node, or torch read for the first time from a cold disk, not a missing torch
        return {"torch": None, "torch_error": f"{python}: {reason}", "torch_timed_out": rc == 124}
    error = probe.pop("error", None)
    if probe.get("torch") is None:
        return {"torch": None, "torch_error": error}
    return {"torch": probe, "torch_error": error}


def _disk(workdir: str) -> dict[str, Any]:
    path = os.path.abspath(os.path.expanduser(workdir))
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)  # the workdir may not exist yet: measure where it will be
    usage = shutil.disk_usage(probe)
    return {
        "path": path,
        "measured_at": probe,
        "free_bytes": usage.free,
        "total_bytes": usage.total,
    }


def _addresses(master_addr: str | None) -> dict[str, Any]:
    host = socket.gethostname()
    addresses: set[str] = set()
    try:
        for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP):
            addresses.add(str(info[4][0]))
    except OSError:
        pass
    route_source = None
    if master_addr:
        # A UDP connect sends nothing; it asks the kernel which local address routes to the master.
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master_addr, 9))
                route_source = str(probe.getsockname()[0])
                addresses.add(route_source)
        except OSError:
            pass
    try:
        interfaces = sorted(name for _, name in socket.if_nameindex())
    except OSError:
        interfaces = []
    return {
        "host": host,
        "addresses": sorted(addresses),
        "route_to_master_from": route_source,
        "interfaces": interfaces,
    }


def probe_port(
    addr: str, port: int, timeout: float, local_addresses: Sequence[str] = ()
) -> dict[str, Any]:
    """Can this node open TCP to addr:port?

    status: 'open' (something listens), 'refused' (the host answered: packets pass, nothing
    listens yet, which is normal before launch), 'timeout' (dropped: a firewall or security
    group), 'unresolvable', or 'error'. reachable = status in (open, refused).
    On the master itself (addr is one of local_addresses) also reports `bindable`: False means
    the port is taken and torchrun will fail with EADDRINUSE.
    """
    out: dict[str, Any] = {"addr": addr, "port": port}
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            out["status"] = "open"
    except TimeoutError:
        out["status"] = "timeout"
    except socket.gaierror as exc:
        out["status"], out["error"] = "unresolvable", str(exc)
    except ConnectionRefusedError:
        out["status"] = "refused"
    except OSError as exc:
        out["status"], out["error"] = "error", str(exc)
    out["reachable"] = out["status"] in ("open", "refused")
    if addr in local_addresses or addr in ("localhost", "127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
            try:
                sock.bind(("0.0.0.0", port))
                out["bindable"] = True
            except OSError as exc:
                out["bindable"] = exc.errno != errno.EADDRINUSE
    return out


def collect(
    workdir: str = ".",
    master_addr: str | None = None,
    master_port: int | None = None,
    python: str | None = None,
    timeout: float = 20.0,
    run: Runner = run_command,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, Any]:
    """Gather this node's report (one JSON-able dict). Never raises for a missing tool."""
    report: dict[str, Any] = {"schema": 1}
    report.update(_addresses(master_addr))
    report.update(_gpus(run, which, timeout))
    report.update(_torch(run, python or sys.executable, timeout * 3))
    report["python"] = python or sys.executable
    report["disk"] = _disk(workdir)
    if master_addr and master_port:
        report["master_port"] = probe_port(
            master_addr, master_port, min(timeout, 5.0), report["addresses"]
        )
    else:
        report["master_port"] = None
    return report


def render_text(report: dict[str, Any]) -> str:
    """A short human summary of `collect()`'s report."""
    out = [f"host      {report['host']}  {' '.join(report['addresses'])}"]
    gpus = report["gpus"]
    if gpus:
        names = sorted({str(g["name"]) for g in gpus})
        out.append(
            f"gpus      {len(gpus)} x {', '.join(names)}  driver {gpus[0]['driver_version']}"
        )
    else:
        out.append(f"gpus      none ({report['gpu_error']})")
    topo = report.get("topology")
    if topo and "summary" in topo:
        out.append(
            f"topology  {topo['summary']} (nvlink pairs {topo['nvlink_pairs']}, pcie pairs {topo['pcie_pairs']})"
        )
    torch = report.get("torch")
    if torch:
        out.append(f"torch     {torch['torch']}  cuda {torch['cuda']}  nccl {torch['nccl']}")
    else:
        out.append(f"torch     not importable ({report.get('torch_error')})")
    disk = report["disk"]
    out.append(f"disk      {disk['free_bytes'] / 2**30:.1f} GiB free at {disk['path']}")
    port = report.get("master_port")
    if port:
        out.append(f"master    {port['addr']}:{port['port']} {port['status']}")
    return "\n".join(out)


def main(cmd: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {cmd}", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--workdir", default=".", help="where the job writes (free disk is measured here)"
    )
    parser.add_argument("--master-addr", default=None)
    parser.add_argument("--master-port", type=int, default=None)
    parser.add_argument("--python", default=None, help="the python that will run training")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per probe")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    report = collect(args.workdir, args.master_addr, args.master_port, args.python, args.timeout)
    print(json.dumps(report, sort_keys=True) if args.json else render_text(report))
    return 0
