"""Checkpoint save and restore throughput to the store, for 1, 2 and 4 docker nodes.

    python benchmarks/checkpoint_store.py [--mb 256] [--files 4] [--nodes 1 2 4]

A 4-node docker cluster is made once. Every node holds the same kind of checkpoint in
$MGPU_CHECKPOINT_DIR (--files shards, --mb in all, random bytes). For each N the first N nodes
run what a managed run runs (`remote.pyz store push`, then `store pull`: the node's own boto3,
parallel files, multipart parts) at the same time, each to its own prefix of an S3 bucket
served by moto's server (a real S3 HTTP API on this machine's docker0 address). Printed per N:
MB/s per node and aggregate, for save (push) and restore (pull).

Baselines in the same table, same run, same bytes: one process on this machine uploading the
same files one after another with boto3's `upload_file` (defaults), the plain way, and
downloading them back with `download_file` (the restore baseline); and node-0 running the same
push/pull with --threads 1 (files one after another, parts still parallel).

moto's server is one Python process on the 2 cores the nodes share: the absolute figures are
this machine's, the ratios are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
CLI = [sys.executable, "-m", "provision.cli"]
NAME = "bench-ckpt"


def main() -> int:
    from moto.server import ThreadedMotoServer
    from storekit import FAKE_CREDENTIALS, container_reachable_host, free_port

    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=256, help="checkpoint size per node")
    p.add_argument("--files", type=int, default=4, help="shards per node")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    host = container_reachable_host()
    server = ThreadedMotoServer(ip_address=host, port=free_port(host), verbose=False)
    server.start()
    h, port = server.get_host_and_port()
    env = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": f"http://{h}:{port}"}
    os.environ.update(env)
    import boto3

    bucket = f"bench-{secrets.token_hex(3)}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    home = tempfile.mkdtemp(prefix="bench-ckpt-home-")
    os.environ["MGPU_CLOUD_HOME"] = home
    biggest = max(args.nodes)
    subprocess.run([*CLI, "up", "--nodes", str(biggest), "--name", NAME], check=True,
                   capture_output=True)
    try:
        rows, one_thread = measure(args, bucket, env, biggest)
        base = baseline(args, bucket)
    finally:
        subprocess.run([*CLI, "down", NAME], capture_output=True)
        server.stop()
    print(f"checkpoint of {args.mb} MB per node in {args.files} file(s), S3 (moto server)")
    print(f"{'':<44} {'save MB/s/node':>15} {'save aggr':>10} {'restore MB/s/node':>18} "
          f"{'restore aggr':>13}")

    def row(label: str, n: int, save: float, restore: float) -> None:
        print(f"{label:<44} {save:>15.1f} {save * n:>10.1f} {restore:>18.1f} "
              f"{restore * n:>13.1f}")

    for n, save, restore in rows:
        row(f"{n} node(s): remote.pyz store push / pull", n, save, restore)
    row("1 node: store push / pull --threads 1", 1, *one_thread)
    row("baseline: 1 process here, boto3 upload_file", 1, *base)
    print("(baseline restore: download_file; both one file after another, boto3 defaults)")
    return 0


def measure(args: argparse.Namespace, bucket: str, env: dict[str, str],
            biggest: int) -> tuple[list[tuple[int, float, float]], tuple[float, float]]:
    from provision.model.inventory import InventoryStore
    from provision.nodes import NodeGroup

    inv = InventoryStore().load(NAME)
    each = args.mb // args.files
    rows = []
    with NodeGroup(inv) as group:
        layout = group.layout
        group.run(f"mkdir -p {layout.checkpoints} && cd {layout.checkpoints} && for i in "
                  f"$(seq 1 {args.files}); do head -c {each}M /dev/urandom > shard_$i.pt; done"
                  ).raise_for("writing checkpoints")
        stdin = json.dumps(env).encode()
        for n in args.nodes:
            nodes = group.nodes[:n]

            def cmd(action: str, n: int = n) -> object:
                return lambda node: layout.remote_command(
                    "store", action, "--url", f"s3://{bucket}/n{n}/{node.name}", "--root",
                    layout.checkpoints if action == "push" else layout.path("restored"),
                    "--env-stdin")

            t0 = time.monotonic()
            group.run(cmd("push"), stdin=stdin, nodes=nodes).raise_for("push")  # type: ignore[arg-type]
            save = args.mb / (time.monotonic() - t0)
            t0 = time.monotonic()
            group.run(cmd("pull"), stdin=stdin, nodes=nodes).raise_for("pull")  # type: ignore[arg-type]
            restore = args.mb / (time.monotonic() - t0)
            rows.append((n, save, restore))
        one_thread = []
        for action, root in (("push", layout.checkpoints), ("pull", layout.path("restored"))):
            t0 = time.monotonic()
            group.run(layout.remote_command("store", action, "--url", f"s3://{bucket}/one-thread",
                                            "--root", root, "--env-stdin", "--threads", "1"),
                      stdin=stdin, nodes=group.nodes[:1]).raise_for(action)
            one_thread.append(args.mb / (time.monotonic() - t0))
    return rows, (one_thread[0], one_thread[1])


def baseline(args: argparse.Namespace, bucket: str) -> tuple[float, float]:
    """(upload MB/s, download MB/s): one process, boto3's upload_file / download_file."""
    import boto3

    client = boto3.client("s3")
    each = args.mb // args.files
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(args.files):
            path = Path(tmp) / f"shard_{i}.pt"
            path.write_bytes(os.urandom(each * 1024 * 1024))
            paths.append(path)
        t0 = time.monotonic()
        for path in paths:
            client.upload_file(str(path), bucket, f"baseline/{path.name}")
        up = args.mb / (time.monotonic() - t0)
        t0 = time.monotonic()
        for path in paths:
            client.download_file(bucket, f"baseline/{path.name}", str(path) + ".back")
        return up, args.mb / (time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main())
