"""Measure how the controller reaches a pod (docs/kubernetes.md, "Transport"): SSH through
the API server's port-forward (what the provider does) against SSH straight to the pod's IP
(what a flat network would allow), on the stand-in with the docker kubelet; the same pod,
key and commands. Not a test: run it by hand,

    .venv/bin/python tests/providers/k8s/measure_transport.py [REPEATS]

It prints medians: a connection opened + `true`, `true` on an open connection, and 64 MiB
sent to the pod on stdin (the path of uploads).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(repeats: int) -> None:
    from standin import Standin

    from provision.cluster import pipeline
    from provision.cluster.providers.docker.images import ensure_node_image
    from provision.cluster.providers.docker.options import DockerOptions
    from provision.cluster.providers.k8s.transport import connector
    from provision.model.inventory import InventoryStore
    from provision.model.spec import build_cluster_spec
    from provision.nodes.transport import SshConnection

    folder = Path(tempfile.mkdtemp())
    s = Standin(folder, docker=True, image=ensure_node_image(DockerOptions(), log=print))
    os.environ.update(s.env(), MGPU_CLOUD_HOME=str(folder / "home"))
    store = InventoryStore(folder / "home")
    spec = build_cluster_spec({}, {"provider": "k8s", "name": "measure", "nodes": 1})
    try:
        inv = pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False,
                          log=lambda m: None)
        assert inv is not None
        from provision.nodes.sshconn import write_cluster_known_hosts

        node = inv.nodes[0]
        direct = node.model_copy(update={"address": node.private_address})
        write_cluster_known_hosts(inv.model_copy(update={"nodes": [node, direct]}), store)
        inv = store.load("measure")
        ways = {"port-forward": lambda: connector(inv)(inv, node),
                "direct": lambda: SshConnection(inv, direct)}
        payload = os.urandom(16 << 20)
        for way, make in ways.items():
            opened, again, upload = [], [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                conn = make()
                conn.open()
                assert conn.run("true").ok
                t1 = time.perf_counter()
                assert conn.run("true").ok
                t2 = time.perf_counter()
                assert conn.run("cat > /dev/null", stdin=payload).ok
                t3 = time.perf_counter()
                conn.close()
                opened.append(t1 - t0)
                again.append(t2 - t1)
                upload.append(t3 - t2)
            print(f"{way:>13}: open+true {statistics.median(opened) * 1000:6.0f} ms, "
                  f"true {statistics.median(again) * 1000:5.0f} ms, 16 MiB on stdin "
                  f"{16 / statistics.median(upload):6.1f} MiB/s  (medians of {repeats})")
        pipeline.down("measure", store=store, log=lambda m: None)
    finally:
        s.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
