"""Rank 0's outputs copied back (`fetch_outputs`, what `run` does after every job, and the
checkpoint keeper's copy) and one file copied (a job's log, jobs.save_logs), over a link with
a round-trip time, beside REV in the same run.

A docker node answers in well under a millisecond; a cloud node seen from a laptop is 20-100 ms
away, and every exchange of a copy waits that long. This runs the copy through a local TCP
relay that holds each chunk for half the round trip in each direction (the kernel here has no
netem), so the exchanges a copy makes show up as time.

    python benchmarks/outputs_back.py [--rtt-ms 0,50] [--repeat 7] [--against REV]

One docker node is made (`up`), its outputs folder gets 3 files (1 MiB), and each tree's
code runs in its own process; each copy gets a fresh connection, opened and used for one
command before the clock starts, as `run`'s connection is after the job (the copy alone is
timed). The cluster is removed at the end, also after a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import trees  # noqa: E402

NAME = "bench-outputs"
# Run in each tree's process: the inventory's node reached through the relay, a connection
# opened, then fetch_outputs timed REPEAT times; prints the times as JSON.
PROBE = """
import json, sys, tempfile, time
from pathlib import Path
import provision.nodes as nodes
from provision.job.collect import fetch_outputs
from provision.model.inventory import InventoryStore
from provision.model.keys import known_hosts_line, write_known_hosts
inv = InventoryStore().load(sys.argv[1])
node = inv.nodes[0]
node.port = int(sys.argv[2])  # the relay (in memory only: the inventory is not saved)
inv.known_hosts_path = str(Path(tempfile.mkdtemp()) / "known_hosts")  # pinned there
write_known_hosts(Path(inv.known_hosts_path), [known_hosts_line([node.address], node.port,
                                                                node.host_key)])

def copy_one(conn, local):  # how the tree copies a job's log (jobs.save_logs)
    if hasattr(nodes, "get_file"):
        nodes.get_file(conn, ".mgpu-cloud/outputs/metrics.json", local)
    else:
        conn.get(".mgpu-cloud/outputs/metrics.json", local)

times = {"outputs": [], "one file": []}
with tempfile.TemporaryDirectory() as tmp:
    for i in range(int(sys.argv[3])):
        for what in times:
            # a connection already open and used, as `run`'s is after the job
            with nodes.NodeGroup(inv) as group:
                conn = group.connection(node)
                conn.run("true")
                t0 = time.perf_counter()
                if what == "outputs":
                    fetch_outputs(inv, Path(tmp) / str(i), log=lambda line: None, group=group)
                else:
                    copy_one(conn, Path(tmp) / f"{i}.json")
                times[what].append(time.perf_counter() - t0)
print(json.dumps(times))
"""

class Relay:
    """127.0.0.1:port -> target, each chunk held rtt/2 in each direction (order kept)."""

    def __init__(self, target: int, rtt_s: float) -> None:
        self.target, self.half = target, rtt_s / 2
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, server), (server, client)):
                a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        import queue

        held: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def send() -> None:
            while True:
                due, data = held.get()
                time.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=send, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            held.put((time.monotonic() + self.half, data))
            if not data:
                return

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def one_node(home: Path) -> Iterator[int]:
    """A 1-node docker cluster with 3 output files; its SSH port."""
    env = {**os.environ, "MGPU_CLOUD_HOME": str(home)}
    cli = [sys.executable, "-m", "provision.cli"]
    up = subprocess.run([*cli, "up", "--nodes", "1", "--name", NAME, "-y"], env=env,
                        capture_output=True, text=True)
    try:
        if up.returncode != 0:
            raise SystemExit(f"up failed:\n{up.stderr[-2000:]}")
        made = subprocess.run(
            [*cli, "exec", NAME, "--", "cd ~/.mgpu-cloud/outputs && head -c 1000000 "
             "/dev/urandom > model.pt && echo '{\"loss\": 1}' > metrics.json && "
             "mkdir -p logs && echo done > logs/train.log"], env=env, capture_output=True,
            text=True)
        if made.returncode != 0:
            raise SystemExit(f"writing the outputs failed:\n{made.stdout}{made.stderr}")
        inv = json.loads(subprocess.run([*cli, "status", "--json"], env=env, check=True,
                                        capture_output=True, text=True).stdout)
        yield int(next(r for r in inv if r["name"] == NAME)["nodes"][0]["port"])
    finally:
        subprocess.run([*cli, "down", NAME], env=env, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", default="0,50", help="round-trip times to add (ms)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--against", metavar="REV")
    args = parser.parse_args()
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found, \
            one_node(Path(tmp) / "home") as port:
        print(f"from 1 docker node, medians of {args.repeat}, load average "
              f"{os.getloadavg()[0]:.1f}: outputs = fetch_outputs of 3 files (1 MiB), "
              "one file = a 12-byte file")
        for rtt in rtts:
            relay = Relay(port, rtt / 1000)
            try:
                rows: dict[str, list[str]] = {"outputs": [], "one file": []}
                for tree in found:
                    env = tree.env(MGPU_CLOUD_HOME=str(Path(tmp) / "home"))
                    out = subprocess.run([sys.executable, "-c", PROBE, NAME, str(relay.port),
                                          str(args.repeat)], env=env, capture_output=True,
                                         text=True, cwd=tmp)
                    if out.returncode != 0:
                        raise SystemExit(f"{tree.label}: {out.stderr[-2000:]}")
                    for what, times in json.loads(out.stdout).items():
                        rows[what].append(f"[{tree.label}] {statistics.median(times):.3f} s")
                for what, row in rows.items():
                    print(f"  rtt {rtt:3.0f} ms  {what:<9} " + "   ".join(row))
            finally:
                relay.close()


if __name__ == "__main__":
    main()
