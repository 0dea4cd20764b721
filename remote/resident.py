"""Resident ranks (issue 44): after a node is replaced, the other nodes' ranks keep their
processes (torch imported, model and data pipeline built) and re-enter the training function
with the newcomer, instead of every rank being started again.

    from remote.resident import World, run     # remote.pyz is on every job's PYTHONPATH

    def train(world: World) -> None:           # the default process group is formed
        ...                                    # load the newest checkpoint, train, save

    run(train)                                 # fn's result, once it returned

In each rank's process `run` loops:
    form     the default process group of generation G: init_process_group through a
             TCPStore that global rank 0's process hosts (its node's address, port
             MGPU_RESIDENT_PORT), keys under "mgpu/G"; then the line
             MGPU-EVENT {"event": "resident", "phase": "formed", "gen": G, "rank": R, ...}
    call     fn(world); its result is returned (phase "done")
    on error fn raised (a peer's node was lost: the collective failed): the traceback is
             printed, phase "interrupted", the group is destroyed, and the rank waits for the
             controller's word, DIR/resident.json {"gen": G2, "master": ADDR} written by
             `remote.pyz resident reform` once the lost node's replacement is ready and the
             checkpoint is back on every node; then it forms generation G2 with the newcomer
             (same ranks; the store on rank 0's node, maybe a new address) and calls fn again.
             No word within MGPU_RESIDENT_WAIT_S (the controller chose to relaunch the job
             and stops it, or is gone): the error is raised as without `run`.
    cut      a word of this generation naming the cluster's addresses ({"gen": G, "cut":
             [...]}, written as soon as the controller knows a node is lost) makes a thread
             of each rank shut down the process's established TCP connections to them (the
             group is over; the ranks' store is left alone: its next generation connects
             anew): a collective waiting on a peer that vanished without closing its
             connections (a powered-off host, a container whose teardown outran its FIN),
             or on a healthy peer that waits itself (a ring's next rank: gloo connects only
             the pairs an algorithm uses, and a failed rank's group lives on while its
             traceback holds it), fails at once instead of at the
             group's timeout (gloo's ops cannot be aborted otherwise: torch 2.13's
             abort/shutdown/destroy leave a waiting all_reduce waiting).
A newcomer's ranks start with MGPU_RESIDENT_GEN, MGPU_RESIDENT_MASTER, MGPU_RESIDENT_BASE
(its first global rank; rank = BASE + LOCAL_RANK) and MGPU_RESIDENT_WORLD.
Without MGPU_RESIDENT_DIR (torchrun by hand, outside mgpu-cloud) `run` forms the group from
torchrun's variables and calls fn once.

Like nvidia-resiliency-ext's inprocess.Wrapper the function is re-entered in the same
process and the new group's members meet in a store; unlike it (0.4: the world is fixed at
the first call, a replacement only from spare ranks already running, the store in rank 0's
process of the first world) a newcomer's process joins, and the store moves with rank 0.
The lines are read by provision/job/resident.py. Standard library only at import: torch is
imported by the functions that use it (the training script has imported it already).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from remote.files import write_atomic

EVENT_PREFIX = "MGPU-EVENT "  # remote/supervise.py's: the controller reads one stream
CONTROL = "resident.json"  # in MGPU_RESIDENT_DIR: the controller's word
POLL_S = 0.05
WAIT_S = 900.0  # a cloud replacement takes minutes; the controller stops a job it relaunches
STORE_TIMEOUT_S = 300.0
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """Who this process is in the current generation's group."""

    rank: int
    size: int
    local_rank: int
    generation: int  # 0, then one more after each re-formation with a newcomer
    resident: bool  # False: run by hand (no controller to re-form the group): fn runs once


@dataclass
class _Where:
    gen: int
    master: str
    port: int


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else default


def _say(phase: str, world: World, **extra: object) -> None:
    event = {"event": "resident", "phase": phase, "gen": world.generation, "rank": world.rank,
             "world": world.size, "local_rank": world.local_rank, "pid": os.getpid(), **extra}
    sys.stdout.write(EVENT_PREFIX + json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def read_control(folder: str) -> dict[str, Any] | None:
    """The controller's last word in `folder`, or None (none yet, or unreadable)."""
    try:
        with open(os.path.join(folder, CONTROL)) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("gen"), int) \
        and isinstance(data.get("master"), str)
    return data if ok else None


class _Stores:
    """The store of each generation: global rank 0's process hosts one for its life (a later
    generation with the same rank 0 reuses it); every other rank connects anew each
    generation (a replaced node 0 may come back at the same address: an old connection
    would lead to the lost process)."""

    def __init__(self) -> None:
        self.hosted: Any = None

    def get(self, where: _Where, rank: int) -> Any:
        from torch._C._distributed_c10d import TCPStore

        timeout = timedelta(seconds=STORE_TIMEOUT_S)
        if rank != 0:
            return TCPStore(where.master, where.port, is_master=False, timeout=timeout)
        if self.hosted is None:
            self.hosted = TCPStore(where.master, where.port, is_master=True,
                                   wait_for_workers=False, timeout=timeout)
        return self.hosted


def _form(stores: _Stores, where: _Where, world: World, backend: str | None) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore

    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    store = PrefixStore(f"mgpu/{where.gen}", stores.get(where, world.rank))
    dist.init_process_group(chosen, store=store, rank=world.rank, world_size=world.size)


def _drop_group() -> None:
    """Destroy the default group after a failure (NCCL: aborted first, so nothing waits on
    a lost peer); best effort, whatever state the failure left it in."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
    except Exception:  # noqa: BLE001, S110 - the destroy below is what matters
        pass
    try:
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"mgpu-cloud resident: destroying the failed group: {exc}\n")


def _wait_for_word(folder: str, after: int, wait_s: float) -> dict[str, Any] | None:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        word = read_control(folder)
        if word is not None and word["gen"] > after:
            return word
        time.sleep(POLL_S)
    return None


def _addresses(names: list[str]) -> set[str]:
    """The IP addresses of `names` (addresses or host names: as this node resolves them)."""
    found: set[str] = set()
    for name in names:
        try:
            found |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    return found


def _remote_ip(field: str) -> str:
    """/proc/net/tcp{,6}'s remote address field (hex, the kernel's byte order) as text."""
    raw = bytes.fromhex(field.split(":")[0])
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    if words[:12] == b"\0" * 10 + b"\xff" * 2:  # an IPv4-mapped IPv6 address
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def cut_connections(hosts: list[str], spare_port: int = 0) -> int:
    """Shut down this process's established TCP connections to `hosts` (listening sockets,
    every other connection and those of `spare_port` at either end, the ranks' store,
    untouched); how many. A thread blocked reading one sees it closed at once."""
    ips = _addresses(hosts)
    fds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            fds[link[8:-1]] = int(fd)
    cut = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        for row in rows:  # sl local remote state ... inode; state 01: ESTABLISHED
            if len(row) < 10 or row[3] != "01" or row[9] not in fds:
                continue
            ports = {int(row[1].split(":")[1], 16), int(row[2].split(":")[1], 16)}
            if spare_port not in ports and _remote_ip(row[2]) in ips:
                try:  # the fd may be closed (or reused) since it was listed
                    sock = socket.socket(fileno=fds[row[9]])
                except OSError:
                    continue
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
                except OSError:
                    pass
                finally:
                    sock.detach()  # the fd stays the library's
    return cut


def _watch(folder: str, generation: Callable[[], int], port: int) -> None:
    """The cutting thread (module doc): each word naming hosts to cut acted on once, when it
    is of the rank's current generation."""
    done: set[tuple[int, tuple[str, ...]]] = set()
    while True:
        word = read_control(folder)
        hosts = word.get("cut") if word is not None else None
        if word is not None and isinstance(hosts, list) and hosts \
                and word["gen"] == generation():
            key = (int(word["gen"]), tuple(str(x) for x in hosts))
            if key not in done:
                done.add(key)
                try:
                    cut = cut_connections(list(key[1]), spare_port=port)
                except Exception as exc:  # noqa: BLE001 - the thread goes on watching
                    sys.stderr.write(f"mgpu-cloud resident: cutting the group: {exc}\n")
                    continue
                sys.stderr.write(f"mgpu-cloud resident: generation {key[0]} is over: {cut} "
                                 "connection(s) of its group shut down\n")
        time.sleep(POLL_S)


def _first(env: dict[str, str]) -> tuple[World, _Where]:
    """This process's identity at its start: a newcomer's from MGPU_RESIDENT_*, else
    torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR)."""
    local = _env_int("LOCAL_RANK", 0)
    resident = bool(env.get("MGPU_RESIDENT_DIR"))
    port = _env_int("MGPU_RESIDENT_PORT", 0)
    if "MGPU_RESIDENT_GEN" in env:
        gen = _env_int("MGPU_RESIDENT_GEN", 0)
        world = World(_env_int("MGPU_RESIDENT_BASE", 0) + local,
                      _env_int("MGPU_RESIDENT_WORLD", 1), local, gen, resident)
        return world, _Where(gen, env.get("MGPU_RESIDENT_MASTER", "127.0.0.1"), port)
    world = World(_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), local, 0, resident)
    return world, _Where(0, env.get("MASTER_ADDR", "127.0.0.1"), port)


def run(fn: Callable[[World], T], *, backend: str | None = None) -> T:
    """Form the group, call fn(world), and re-enter it after a node is replaced (the module
    doc). Returns fn's result; raises fn's error when no re-formation comes."""
    import torch.distributed as dist

    world, where = _first(dict(os.environ))
    if not world.resident or not where.port:
        dist.init_process_group(backend or None)
        return fn(World(dist.get_rank(), dist.get_world_size(), world.local_rank, 0, False))
    folder = os.environ["MGPU_RESIDENT_DIR"]
    wait_s = float(os.environ.get("MGPU_RESIDENT_WAIT_S") or WAIT_S)
    stores = _Stores()
    threading.Thread(target=_watch, args=(folder, lambda: world.generation, where.port),
                     daemon=True, name="mgpu-resident-watch").start()
    while True:
        try:  # a failure while forming (a newcomer lost again) waits for the next word too
            _form(stores, where, world, backend)
            _say("formed", world, master=where.master)
            result = fn(world)
        except Exception as exc:
            traceback.print_exc()
            _say("interrupted", world, error=f"{type(exc).__name__}: {exc}"[:300])
            # fn's locals (a DDP wrapper holding the group) let go: the group's connections
            # close now, and its peers waiting on this rank fail too
            traceback.clear_frames(exc.__traceback__)
            gc.collect()
            _drop_group()
            word = _wait_for_word(folder, world.generation, wait_s)
            if word is None:
                raise
            where = _Where(int(word["gen"]), str(word["master"]), where.port)
            world = World(world.rank, world.size, world.local_rank, where.gen, True)
            continue
        _say("done", world)
        return result


def main(command: str, argv: list[str]) -> int:
    """`resident reform --dir D --gen G [--master ADDR] [--cut HOST ...]`: the controller's
    word to the resident ranks of this node (written atomically; they poll it): a later
    generation to form, or the hosts to cut the current one's connections to. (A newcomer's
    ranks start as every forked rank does: `remote.pyz script -- SCRIPT ARGS`.)"""
    ap = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    sub = ap.add_subparsers(dest="action", required=True)
    reform = sub.add_parser("reform", help="tell this node's resident ranks to re-form")
    reform.add_argument("--dir", required=True)
    reform.add_argument("--gen", type=int, required=True)
    reform.add_argument("--master", default="")
    reform.add_argument("--cut", nargs="*", default=[])
    args = ap.parse_args(argv)
    folder = os.path.expanduser(args.dir)
    os.makedirs(folder, exist_ok=True)
    word: dict[str, object] = {"gen": args.gen, "master": args.master}
    if args.cut:
        word["cut"] = args.cut
    write_atomic(os.path.join(folder, CONTROL), json.dumps(word), mode=0o644, fsync=False)
    print(json.dumps({"reformed": args.gen}))
    return 0
