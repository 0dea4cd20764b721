"""`injob`: the fabric gate inside the job's own processes, then the job's script in them.

    <launcher> ... remote.pyz injob [GATE OPTIONS] -- SCRIPT [ARGS...]

The launcher (torchrun, accelerate launch, DeepSpeed's per-node launcher) starts every rank
with this instead of the script, so the gate costs no second interpreter, `import torch`,
launcher start or rendezvous. In each process:
  1. the gate's process group, from the launcher's own rendezvous (env://: RANK, WORLD_SIZE,
     MASTER_ADDR, MASTER_PORT; torchrun's agent store or, without an agent, the TCPStore that
     rank 0 serves), with its keys under "mgpu-gate/" so the job's own group never meets them;
  2. the measuring of remote/allreduce.py (`gate_measure`): the all-reduce over every GPU rank
     (one rank per node on CPU/gloo: they share the node's one network path), then the
     pairwise rounds; rank 0 prints the same JSON lines as `remote.pyz allreduce --gate`;
  3. on GPUs, each rank's NCCL INFO lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET for the
     gate, the job's own values put back after it) are read from its stdout as they pass;
  4. rank 0 judges with remote.gatejudge (what the controller's provision.job.gate.evaluate also
     uses on the same output), prints {"verdict": ...}, and broadcasts the verdict;
  5. the gate's process group is destroyed (the job calls init_process_group itself, as
     always; rank 0 keeps serving the rendezvous store so that the job's init finds it),
     the device, CUDA cache and environment are as before, and the lowest rank of each node
     prints one `MGPU-GATE {...}` line: on the node's output, everything before it is the
     gate's, everything after it the job's (the node's other ranks wait for that line);
  6. pass (or --allow-slow): SCRIPT runs in this process with runpy, as `python SCRIPT ARGS`
     would run it (sys.argv, __main__, sys.path[0] = the script's folder). Fail: exit 8, the
     script never starts on any rank. A gate that cannot finish (an exception, a timeout)
     prints {"error": ...} and exits 1, the script not started either.
A process torchrun's agent forked (`--run_path --start_method fork`: torch is imported
already) is first made to look like a new interpreter and ends like one (`forked`,
`as_a_new_process`, `run_script_forked`).
Launcher words between the program and its arguments (DeepSpeed's `--local_rank=N`) reach
the script in the same place (remote/cli.py hands them over).

The node rank comes from MGPU_NODE_RANK (the controller sets it per node), else GROUP_RANK.
Stdlib only at import; torch is imported when the gate runs.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import sys
import threading
import time
from typing import Any

from remote.allreduce import Mesh, emit, gate_measure, resolve
from remote.gatejudge import judge, merge_pairs
from remote.script import made_new
from remote.transport import Transport, relevant, transport_of

EXIT_GATE_FAILED = 8  # the controller's launch-error code: the job was not started
MARKER = "MGPU-GATE "  # one line per node: the gate's output ends here
GATE_PREFIX = "mgpu-gate/"  # the gate's keys in the launcher's rendezvous store
NCCL_GATE_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
_STARTED = time.monotonic()
_KEEP: list[Any] = []  # the rendezvous store: rank 0 may be its server for the job's init


def parser(cmd: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"remote.pyz {cmd}", description=__doc__.splitlines()[0])
    p.add_argument("--expect-transport", default=None,
                   help="the network NCCL must use (efa, ib, tcpx, ...); default: any")
    p.add_argument("--busbw-below", type=float, default=None,
                   help="fail when the whole cluster's peak busbw is below this (GB/s)")
    p.add_argument("--pairwise-below", type=float, default=float("inf"),
                   help="measure node pairs when the peak busbw is below this (default: always)")
    p.add_argument("--pair-rounds", type=int, default=None, help="at most this many rounds")
    p.add_argument("--pair-fraction", type=float, default=0.5,
                   help="a pair below this fraction of the reference pair (twice) is slow")
    p.add_argument("--allow-slow", action="store_true",
                   help="start the script even when the gate fails (after saying so)")
    p.add_argument("--backend", choices=("auto", "gloo"), default="auto")
    p.add_argument("--timeout-s", type=int, default=None, help="the gate's collectives' limit")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(gate options, SCRIPT ARGS...): split at the first `--`; launcher words given before
    `injob` (remote/cli.py puts them first, marked by a leading `--local_rank=`) go right
    after the script, where the launcher meant them."""
    lead = []
    while argv and argv[0].startswith("--local_rank="):
        lead.append(argv.pop(0))
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    script = argv[cut + 1:]
    return argv[:cut], script[:1] + lead + script[1:]


class StdoutTee:
    """fd 1 through a pipe while the gate runs: every byte still reaches the real stdout, in
    order, and the lines NCCL writes there (from C, past sys.stdout) are kept."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self.saved = os.dup(1)
        read, write = os.pipe()
        os.dup2(write, 1)
        os.close(write)
        self.read = read
        self.kept: list[str] = []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        rest = b""
        while chunk := os.read(self.read, 65536):
            view = memoryview(chunk)
            while view:
                view = view[os.write(self.saved, view):]
            *lines, rest = (rest + chunk).split(b"\n")
            self.kept.extend(s for s in (b.decode(errors="replace") for b in lines)
                             if relevant(s))

    def stop(self) -> list[str]:
        """Put fd 1 back (C's and Python's buffers flushed first); the kept lines."""
        try:
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
        sys.stdout.flush()
        os.dup2(self.saved, 1)  # the pipe's last writer closes: the pump sees its end
        self.thread.join(timeout=10)
        os.close(self.read)
        os.close(self.saved)
        return self.kept


def node_rank() -> int:
    for key in ("MGPU_NODE_RANK", "GROUP_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    raise RuntimeError("cannot tell this process's node: neither MGPU_NODE_RANK nor GROUP_RANK")


def _gate_args(args: argparse.Namespace) -> argparse.Namespace:
    """The measuring's options: allreduce's --gate defaults plus ours."""
    return argparse.Namespace(
        gate=True, min_bytes=None, max_bytes=None, factor=None, iters=None, warmup=None,
        budget_s=None, timeout_s=args.timeout_s, backend=args.backend,
        pairwise_below=args.pairwise_below, pair_rounds=args.pair_rounds,
        pair_fraction=args.pair_fraction)


def _import_torch() -> None:
    """`import torch` (and torch.distributed) without the collector, then its objects (some
    165,000) to the collector's permanent generation: they live as long as the process
    anyway, and every collection after this (the gate's, the job's, the interpreter's at
    exit) stops walking them. One process on a docker node here: the import 0.77 -> 0.67 s,
    the exit after a torch script 0.52 -> 0.11 s (medians of 5). The import's own garbage
    (some 7,000 objects) stays with them; what the gate and the script create is collected
    as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        import torch.distributed  # noqa: F401
    finally:
        if enabled:
            gc.enable()
    gc.freeze()


def gate(args: argparse.Namespace) -> dict[str, Any]:
    """Measure and judge in this job's processes (see the module doc); the verdict, the same
    on every rank. Raises when the gate cannot finish."""
    _import_torch()
    import torch
    import torch.distributed

    dist: Any = torch.distributed  # (rendezvous, PrefixStore: not in its typed exports)
    imported = time.monotonic()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    measure = _gate_args(args)
    resolve(measure, "nccl" if use_cuda else "gloo")
    timeout = datetime.timedelta(seconds=measure.timeout_s)
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    _KEEP.append(store)
    saved_env = {k: os.environ.get(k) for k in (*NCCL_GATE_ENV, "NCCL_DEBUG_FILE")}
    tee = previous_device = None
    if use_cuda:
        previous_device = torch.cuda.current_device()
        torch.cuda.set_device(local_rank)
        os.environ.pop("NCCL_DEBUG_FILE", None)
        os.environ.update(NCCL_GATE_ENV)
        tee = StdoutTee()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout, rank=rank,
                            world_size=world, store=dist.PrefixStore(GATE_PREFIX, store))
    try:
        mesh = Mesh(torch, dist, rank, node_rank(), "nccl" if use_cuda else "gloo", device)
        mesh.gather_places()
        met = time.monotonic()
        firsts = sorted({mesh.node_of_rank.index(n) for n in set(mesh.node_of_rank)})
        mesh.measuring = list(range(world)) if use_cuda else firsts
        if len(mesh.measuring) < world:
            mesh.group = dist.new_group(mesh.measuring)
        summary, measured = gate_measure(measure, mesh)
        lines = tee.stop() if tee is not None else []
        tee = None
        verdict = _judged(args, mesh, summary, measured, lines)
        now = time.monotonic()
        # where the gate's time went, from the entry on: torch's import, the process
        # group's set-up, the measuring (sweep + pairs) and judging
        verdict.update(seconds=round(now - _STARTED, 2), import_s=round(imported - _STARTED, 2),
                       group_s=round(met - imported, 2), measure_s=round(now - met, 2))
        if rank == 0:
            emit(verdict)
        shared = [verdict]
        dist.broadcast_object_list(shared, src=0)
        verdict = shared[0]
    finally:
        if tee is not None:
            tee.stop()
        dist.destroy_process_group()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if use_cuda:
            torch.cuda.empty_cache()
            torch.cuda.set_device(previous_device)
    _mark_node(store, mesh, verdict)
    return verdict


def _judged(args: argparse.Namespace, mesh: Mesh, summary: dict[str, Any],
            measured: list[tuple[tuple[int, int], float]], lines: list[str]) -> dict[str, Any]:
    """Rank 0's verdict (every rank calls: the NCCL lines are gathered); {} elsewhere."""
    everyone: list[Any] = [None] * mesh.dist.get_world_size()
    mesh.dist.all_gather_object(everyone, lines)
    if mesh.rank != 0:
        return {}
    transports: dict[int, str] = {}
    for node in sorted(set(mesh.node_of_rank)):
        if mesh.backend == "gloo":
            transports[node] = "socket"
        else:
            found: Transport = transport_of(
                line for r, part in enumerate(everyone) if mesh.node_of_rank[r] == node
                for line in part)
            transports[node] = found.name
    peak = float(summary["max_busbw_gbps"])
    verdict = judge(finished=True, peak_gbps=peak, threshold_gbps=args.busbw_below,
                    expected_transport=args.expect_transport,
                    transports=transports, pairs=merge_pairs(measured),
                    fraction=args.pair_fraction, backend=mesh.backend)
    return {"verdict": "pass" if verdict.passed else "fail", "transports": transports,
            "slow_nodes": verdict.slow_nodes, "slow_links": [list(p) for p in verdict.slow_links],
            "wrong_transport": verdict.wrong_transport,
            "below_threshold": verdict.below_threshold, "max_busbw_gbps": peak}


def _mark_node(store: Any, mesh: Mesh, verdict: dict[str, Any]) -> None:
    """The node's lowest rank prints the MARKER line; its other ranks wait until it has."""
    import torch.distributed

    dist: Any = torch.distributed
    keys = dist.PrefixStore(GATE_PREFIX, store)
    key = f"printed/{mesh.node}"
    if mesh.rank == mesh.node_of_rank.index(mesh.node):
        print(MARKER + json.dumps({"verdict": verdict["verdict"], "node": mesh.node,
                                   "seconds": verdict["seconds"]}, sort_keys=True), flush=True)
        keys.set(key, "1")
    else:
        keys.wait([key])


def main(cmd: str, argv: list[str]) -> int:
    options, script = split_argv(list(argv))
    try:
        args = parser(cmd).parse_args(options)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not script:
        print(f"remote.pyz {cmd}: no script after `--`", file=sys.stderr)
        return 2
    run = made_new()
    try:
        verdict = gate(args)
    except Exception as exc:  # the gate could not finish: the job does not start
        record = {"error": f"{type(exc).__name__}: {exc}", "rank": os.environ.get("RANK")}
        print(json.dumps(record), file=sys.stdout if record["rank"] == "0" else sys.stderr,
              flush=True)
        return 1
    if verdict["verdict"] != "pass" and not args.allow_slow:
        return EXIT_GATE_FAILED
    run(script)
    return 0

