"""Time `mgpu-cloud up --provider docker` for N = 1, 2, 4, 8 against the floor, in one run.

    floor(N) = `docker run` N containers of the same node image in parallel, each generating
               its ed25519 host key, then wait until every sshd accepts a key login.
    up(N)    = the whole `mgpu-cloud up` command (CLI start, plan, network, containers,
               bootstrap: SSH wait, remote.pyz, hostfile, node-to-node SSH), then `down`
               (not timed).

    imports  = a fresh interpreter importing what `up` needs before its first engine call (CLI,
               spec/pydantic, inventory, docker SDK): the part of up(N) - floor(N) that does
               not depend on N and that the floor, which starts no Python, never pays.

Targets: up(8)/up(1) <= 1.5 and up(N) <= 1.3 x floor(N). With `--against REV`, `up` of git
revision REV (a temporary worktree, benchmarks/revisions.py) is timed too, interleaved with
this tree's, against the same floor.
Usage: python benchmarks/up_time.py [--repeat 3] [--nodes 1 2 4 8] [--against REV]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import Tree, current, interleaved, trees  # noqa: E402


def node_image() -> str:
    from provision.cluster.providers.docker.images import ensure_node_image
    from provision.cluster.providers.docker.options import DockerOptions

    return ensure_node_image(DockerOptions(), log=lambda m: None)


def floor(n: int, image: str, keydir: Path) -> float:
    key = keydir / "id_ed25519"
    names = [f"bench-floor-{i}" for i in range(n)]
    start = time.perf_counter()

    def one(name: str) -> None:
        cid = subprocess.run(
            ["docker", "run", "-d", "--name", name, "-p", "127.0.0.1::22",
             "-v", f"{key}.pub:/root/.ssh/authorized_keys:ro", image, "sh", "-c",
             "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && "
             "exec /usr/sbin/sshd -D -e"],
            capture_output=True, text=True, check=True).stdout.strip()
        port = subprocess.run(["docker", "port", cid, "22"], capture_output=True, text=True,
                              check=True).stdout.split(":")[-1].strip()
        while subprocess.run(
            ["ssh", "-i", str(key), "-p", port, "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=2", "root@127.0.0.1", "true"],
            capture_output=True).returncode != 0:
            time.sleep(0.05)

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(one, names))
        return time.perf_counter() - start
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


IMPORTS = ("import provision.cli, provision.cluster.pipeline, provision.cluster.providers.docker.provider, "
           "docker")


def imports() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, env=current().env())
    return time.perf_counter() - start


def up(n: int, home: str, tree: Tree) -> float:
    env = tree.env(MGPU_CLOUD_HOME=home)
    name = f"bench-up-{n}"
    start = time.perf_counter()
    res = subprocess.run([*tree.cli(), "up", "--nodes", str(n), "--name", name],
                         capture_output=True, text=True, env=env, cwd=tree.path)
    elapsed = time.perf_counter() - start
    subprocess.run([*tree.cli(), "down", name], capture_output=True, env=env, cwd=tree.path)
    if res.returncode != 0:
        raise SystemExit(f"up failed [{tree.label}]: {res.stderr}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--against", metavar="REV", help="also time `up` of git revision REV (a "
                    "temporary worktree), interleaved with this tree")
    args = ap.parse_args()
    image = node_image()
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        f"{tmp}/id_ed25519"], check=True)
        os.chmod(f"{tmp}/id_ed25519.pub", 0o644)
        rows = []
        for n in args.nodes:
            floors = [floor(n, image, Path(tmp)) for _ in range(args.repeat)]
            ups = interleaved(found, args.repeat,
                              lambda t, n=n: up(n, f"{tmp}/home-{t.label.replace(' ', '-')}", t))
            rows.append((n, statistics.median(floors), ups))
    fixed = statistics.median(imports() for _ in range(max(3, args.repeat)))
    labels = [t.label for t in found]
    print(f"image {image}; medians of {args.repeat} runs; {os.cpu_count()} CPUs; "
          f"trees interleaved: {', '.join(labels)}")
    print(f"imports before the first engine call (fresh interpreter, this tree): {fixed:.2f} s")
    print(f"{'N':>3} {'tree':>10} {'floor s':>8} {'up s':>7} {'up/floor':>9} {'up/up(1)':>9} "
          f"{'(up-imports)/floor':>19}")
    for n, fl, ups in rows:
        for label in labels:
            u, up1 = ups[label], rows[0][2][label]
            print(f"{n:>3} {label:>10} {fl:>8.2f} {u:>7.2f} {u / fl:>9.2f} {u / up1:>9.2f} "
                  f"{(u - fixed) / fl:>19.2f}")
    print("targets: up/floor <= 1.30, up(8)/up(1) <= 1.50")


if __name__ == "__main__":
    main()
