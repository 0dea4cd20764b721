"""`allreduce`: an all-reduce bandwidth sweep, run under torchrun on every node.

    torchrun --nnodes N --nproc-per-node G ... remote.pyz allreduce [--min-bytes 1M]
        [--max-bytes 1G] [--factor 2] [--iters 20] [--warmup 5]

Uses the env torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
Backend: nccl when CUDA is available, else gloo (CPU tensors). For each size (doubling, or x4
with --factor 4) it all-reduces a float32 tensor in place: `warmup` untimed calls, a barrier,
then `iters` timed calls. Like nccl-tests (doc/PERFORMANCE.md):

    algbw = bytes / time          busbw = algbw * 2 * (n - 1) / n

with time = the slowest rank's average per call (the collective is done when the last rank
is). Every rank's own time and host name are gathered (all_gather_object) so the controller
can name a rank that is far slower than the median. Rank 0 prints one JSON line per size and
a final line with "summary": true; other ranks print nothing. Exit 0, or 1 with an
{"error": ...} line on rank 0 (or on stderr elsewhere) when the run fails.

Caveat: inside a collective every rank waits for the slowest, so per-rank times converge;
they separate mostly when one rank's local work (its GPU, its PCIe link, a busy CPU) is slow.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """'1M' -> 1048576, '64K' -> 65536, '1G', '4096' (binary units, as nccl-tests' -b/-e)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1] if value and value[-1] in "KMG" else ""
    number = value[: len(value) - len(unit)]
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 65536, 64K, 1M, 1G)")
    return int(number) * _UNITS[unit]


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*factor, ... up to max inclusive; each rounded down to whole float32 elements."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError("need 4 <= min-bytes <= max-bytes and factor >= 2")
    out: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        out.append(size - size % 4)
        size *= factor
    return out


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (0 for a single rank's no-op)."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else 0.0


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


def run(args: argparse.Namespace) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=args.timeout_s), rank=rank, world_size=world
    )
    try:
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())

        def sync() -> None:
            if use_cuda:
                torch.cuda.synchronize(device)

        busbws: list[float] = []
        for size in sizes(args.min_bytes, args.max_bytes, args.factor):
            tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
            for _ in range(args.warmup):
                dist.all_reduce(tensor)
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(tensor)
            sync()
            mine = (time.perf_counter() - start) / args.iters
            times: list[Any] = [None] * world
            dist.all_gather_object(times, mine)
            del tensor
            slowest = max(float(t) for t in times)
            algbw = size / slowest / 1e9
            busbw = bus_bandwidth(algbw, world)
            busbws.append(busbw)
            if rank == 0:
                _emit(
                    {
                        "size_bytes": size,
                        "count": size // 4,
                        "dtype": "float32",
                        "backend": backend,
                        "world_size": world,
                        "time_us": round(slowest * 1e6, 2),
                        "algbw_gbps": round(algbw, 6),
                        "busbw_gbps": round(busbw, 6),
                        "rank_time_us": [round(float(t) * 1e6, 2) for t in times],
                    }
                )
        if rank == 0:
            _emit(
                {
                    "summary": True,
                    "backend": backend,
                    "world_size": world,
                    "hosts": [str(h) for h in hosts],
                    "sizes": len(busbws),
                    "avg_busbw_gbps": round(sum(busbws) / len(busbws), 6) if busbws else 0.0,
                    "max_busbw_gbps": round(max(busbws), 6) if busbws else 0.0,
                }
            )
    finally:
        dist.destroy_process_group()
    return 0


def main(cmd: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {cmd}", description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("1M"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--factor", type=int, choices=(2, 4), default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", choices=("auto", "gloo"), default="auto",
                        help="auto: nccl with CUDA, else gloo; gloo forces CPU tensors")  # fmt: skip
    parser.add_argument("--timeout-s", type=int, default=600, help="process-group timeout")
    try:
        args = parser.parse_args(argv)
        sizes(args.min_bytes, args.max_bytes, args.factor)
    except SystemExit as exc:
        return int(exc.code or 0)
    except ValueError as exc:
        print(f"remote.pyz {cmd}: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args)
    except Exception as exc:  # report, on rank 0's stdout as JSON, why the sweep stopped
        record = {"error": f"{type(exc).__name__}: {exc}", "rank": os.environ.get("RANK")}
        if os.environ.get("RANK", "0") == "0":
            _emit(record)
        else:
            print(json.dumps(record), file=sys.stderr, flush=True)
        return 1
