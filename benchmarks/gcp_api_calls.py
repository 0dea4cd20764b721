"""Compute API requests made by `plan` + `up` + `down` of the GCP provider, for several cluster
sizes, against the local Compute fake (tests/providers/gcp/fake_compute.py) served over HTTP to
the real google-cloud-compute client.

    python benchmarks/gcp_api_calls.py [N ...]        (default: 2 8)
    MGPU_BENCH_CODE_ROOT=/path/to/other/checkout python benchmarks/gcp_api_calls.py
        (the same count for another version of the provider: the baseline)

Every VM publishes its host keys on the 2nd guest-attributes query (the fake's default: the
first query after the VM is made finds nothing). Prints one row per N and phase, by kind of
request; operation waits are counted apart. Only per-VM host-key reads may grow with N
(and `down`'s instance deletes and their waits: Compute has no batch delete; exit status 1 if
anything else does). No Google account is touched.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = Path(os.environ.get("MGPU_BENCH_CODE_ROOT", ROOT))
sys.path.insert(0, str(CODE))
sys.path.insert(0, str(ROOT / "tests" / "providers" / "gcp"))

# Compute has no batch form of these: one per VM (instances.delete, and its operation).
PER_VM = ("getGuestAttributes", "DELETE instances")


def kind(method: str, path: str) -> str:
    if path.endswith("/wait") or "/operations/" in path:
        return "operation waits"
    tail = path.rstrip("/").rsplit("/", 1)[-1]
    parts = path.split("/")
    noun = next((p for p in reversed(parts) if p.isalpha() and p not in ("projects",)), tail)
    return f"{method} {tail if tail in ('bulkInsert', 'getGuestAttributes') else noun}"


def run(nodes: int) -> dict[str, Counter[str]]:
    from fake_compute import FakeCompute

    fake = FakeCompute()
    fake.start()
    home = tempfile.mkdtemp(prefix="gcp-bench-")
    os.environ.update({"MGPU_CLOUD_GCP_ENDPOINT": fake.url, "MGPU_CLOUD_GCP_RETRY_BASE_S": "0",
                       "MGPU_CLOUD_GCP_POLL_S": "0", "MGPU_CLOUD_GCP_HOSTKEY_POLL_S": "0",
                       "MGPU_CLOUD_HOME": home, "MGPU_CLOUD_CALLER_IP": "198.51.100.7"})
    try:
        from provision.cluster import pipeline
        from provision.cluster.providers import get_provider
        from provision.model.inventory import InventoryStore
        from provision.model.spec import build_cluster_spec

        spec = build_cluster_spec({}, {"provider": "gcp", "name": "bench", "nodes": nodes,
                                       "ssh_cidr": "203.0.113.0/24",
                                       "gcp": {"project": "bench-proj",
                                               "zone": "us-central1-a"}})
        phases: dict[str, Counter[str]] = {}
        mark = 0

        def phase(name: str) -> None:
            nonlocal mark
            phases[name] = Counter(kind(r.method, r.path) for r in fake.requests[mark:])
            mark = len(fake.requests)

        get_provider("gcp").plan(spec)
        phase("plan")
        store = InventoryStore(Path(home))
        pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                    log=lambda msg: None)
        phase("up (plan + create)")
        pipeline.down("bench", store=store, log=lambda msg: None)
        phase("down")
        return phases
    finally:
        fake.stop()


def main(sizes: list[int]) -> int:
    results = {n: run(n) for n in sizes}
    bad = False
    for n, phases in results.items():
        for name, counts in phases.items():
            total = sum(counts.values())
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(f"N={n:<3} {name:<20} {total:>4} requests: {detail}")
    first, *rest = sizes
    for n in rest:
        for name in results[first]:
            a, b = results[first][name], results[n][name]
            grew = [k for k in b if b[k] > a.get(k, 0) and not k.endswith(PER_VM)
                    and not (name == "down" and k == "operation waits")]
            if grew:
                bad = True
                print(f"grows with N in {name}: {', '.join(grew)}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main([int(a) for a in sys.argv[1:]] or [2, 8]))
