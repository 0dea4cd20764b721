"""EC2 API calls made by `up` + `down` of the AWS provider, for several cluster sizes, under moto.

    python benchmarks/aws_api_calls.py [N ...]        (default: 2 8 64)

Uses the same moto fixtures and fakes as tests/providers/aws (placement-group fake, request
recorder, console output). Prints one row per N and egress mode (p4d.24xlarge: an Elastic IP
per node; with --private-ips: a NAT gateway). The only calls allowed to grow with N are the
Elastic IP ones (AllocateAddress / AssociateAddress / DisassociateAddress / ReleaseAddress) and
the host-key reads (GetConsoleOutput), which EC2 has no batch form of; everything else must
stay flat (exit status 1 if it does not). No AWS account is
touched: fake credentials, moto in-process.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _fakes_module():
    sys.path.insert(0, str(ROOT / "tests" / "providers" / "aws"))  # aws_fakes and its fakes
    import aws_fakes

    return aws_fakes


# EC2 has no batch form of these: each takes one address or one instance. GetConsoleOutput
# reads each new node's host key from its console (hostkeys.py): one call per node and poll
# (the fake shows the key at the first poll; on EC2 it appears after ~1-2 min of boot).
PER_NODE = ("AllocateAddress", "AssociateAddress", "DisassociateAddress", "ReleaseAddress",
            "GetConsoleOutput")


def measure(n: int, fakes_mod, private_ips: bool) -> tuple[Counter[str], float]:
    from moto import mock_aws

    from provision.cluster import pipeline
    from provision.cluster.providers.aws import clients, retry
    from provision.model.inventory import InventoryStore

    with tempfile.TemporaryDirectory() as home, mock_aws(), retry.using(retry.NO_WAIT):
        fakes = fakes_mod.AwsFakes()
        fakes.dlami = fakes_mod.register_dlami(fakes_mod.moto_client())
        fakes.eip_quota = 10_000  # the region's Elastic IP quota raised for the largest N
        remove = clients.add_client_hook(fakes.attach)
        try:
            store = InventoryStore(Path(home))
            spec = fakes_mod.make_spec(name=f"bench-{n}", nodes=n, private_ips=private_ips)
            start = time.perf_counter()
            pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False,
                        log=lambda m: None)
            pipeline.down(spec.name, store=store, log=lambda m: None)
            elapsed = time.perf_counter() - start
        finally:
            remove()
        return Counter(op for op in fakes.operations() if op != "GetParameter"), elapsed


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [2, 8, 64]
    for key, value in {
        "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1", "MGPU_CLOUD_CALLER_IP": "203.0.113.7",
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false", "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        os.environ[key] = value
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(var, None)
    fakes_mod = _fakes_module()
    writes = fakes_mod.WRITE_PREFIXES
    flat = True
    for private_ips in (False, True):
        mode = "NAT gateway (--private-ips)" if private_ips else "Elastic IP per node"
        rows = [(n, *measure(n, fakes_mod, private_ips)) for n in sizes]
        print(f"\n{mode}")
        print(f"{'N':>4} {'EC2 calls':>10} {'writes':>7} {'reads':>6} {'per-node':>9} "
              f"{'others':>7} {'RunInstances':>13} {'seconds':>8}")
        for n, ops, secs in rows:
            total = sum(ops.values())
            w = sum(c for op, c in ops.items() if op.startswith(writes))
            per_node = sum(ops[op] for op in PER_NODE)
            print(f"{n:>4} {total:>10} {w:>7} {total - w:>6} {per_node:>9} {total - per_node:>7} "
                  f"{ops['RunInstances']:>13} {secs:>8.2f}")
        print(f"per operation (N={rows[0][0]}):")
        for op, c in sorted(rows[0][1].items()):
            print(f"  {op:<34} {c}")
        others = {sum(c for op, c in ops.items() if op not in PER_NODE) for _, ops, _ in rows}
        flat = flat and len(others) == 1
    print("\ncalls other than the Elastic IPs and host-key reads independent of N:", "yes" if flat else "NO")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
