"""Time `mgpu-cloud exec NAME -- true` on N docker nodes (default 8) against the floor, in one run.

    floor    = OpenSSH to every node in parallel (`ssh -i KEY -p PORT root@127.0.0.1 true`, one
               process per node, new connections), the same nodes, keys and ports.
    exec     = the whole `mgpu-cloud exec` command: CLI start, inventory, an SSH session per node
               in parallel, the per-node output.

With `--against REV`, REV's CLI (a temporary worktree, benchmarks/revisions.py) is timed too:
each tree runs `exec` on a cluster it brought up itself (in a home of its own: an older tree may
not read a newer inventory), interleaved with this tree's, against the same floor.
Usage: python benchmarks/exec_time.py [--nodes 8] [--repeat 10] [--against REV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import Tree, interleaved, timed_command, trees  # noqa: E402


def cluster_of(tree: Tree) -> str:
    return f"bench-exec-{tree.label.replace(' ', '-')}"


@contextlib.contextmanager
def clusters(found: list[Tree], n: int, tmp: Path) -> Iterator[dict[str, Path]]:
    """Each tree's home, with a cluster of `n` nodes up in it; all brought down afterwards."""
    homes = {t.label: tmp / f"home-{t.label.replace(' ', '-')}" for t in found}
    try:
        for tree in found:
            home = homes[tree.label]
            res = subprocess.run([*tree.cli(), "up", "--nodes", str(n), "--name",
                                  cluster_of(tree)], capture_output=True, text=True,
                                 env=tree.env(MGPU_CLOUD_HOME=str(home)), cwd=tree.path)
            if res.returncode != 0:
                raise SystemExit(f"up failed [{tree.label}]: {res.stderr}")
        yield homes
    finally:
        for tree in found:
            subprocess.run([*tree.cli(), "down", cluster_of(tree)],
                           capture_output=True, env=tree.env(MGPU_CLOUD_HOME=str(homes[tree.label])),
                           cwd=tree.path)


def floor(inventory: Path) -> float:
    inv = yaml.safe_load(inventory.read_text())
    start = time.perf_counter()

    def one(node: dict[str, object]) -> None:
        subprocess.run(["ssh", "-i", str(inv["key_path"]), "-p", str(node["port"]),
                        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                        "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                        f"{node.get('user', 'root')}@{node['address']}", "true"],
                       capture_output=True, check=True)

    with ThreadPoolExecutor(max_workers=len(inv["nodes"])) as pool:
        list(pool.map(one, inv["nodes"]))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--against", metavar="REV", help="also time `exec` of git revision REV")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found, \
            clusters(found, args.nodes, Path(tmp)) as homes:
        first = found[0]
        inventory = homes[first.label] / "clusters" / f"{cluster_of(first)}.yaml"
        floors = [floor(inventory) for _ in range(args.repeat)]

        def exec_once(tree: Tree) -> float:
            home = homes[tree.label]
            return timed_command([*tree.cli(), "exec", cluster_of(tree), "--", "true"],
                                 env=tree.env(MGPU_CLOUD_HOME=str(home)), cwd=tree.path)

        execs = interleaved(found, args.repeat, exec_once)
    fl = statistics.median(floors)
    print(f"exec on {args.nodes} docker nodes; medians of {args.repeat}; {os.cpu_count()} CPUs; "
          f"load {os.getloadavg()[0]:.1f}; trees interleaved: {', '.join(execs)}")
    print(f"{'tree':>10} {'floor s':>8} {'exec s':>7} {'exec/floor':>11}")
    for label, value in execs.items():
        print(f"{label:>10} {fl:>8.2f} {value:>7.2f} {value / fl:>11.2f}")


if __name__ == "__main__":
    main()
