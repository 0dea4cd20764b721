"""provision/job/diagnose.py on real log excerpts (tests/data/logs/, sources in SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.job.diagnose import SIGNATURES, diagnose, split_node

LOGS = Path(__file__).resolve().parent / "data" / "logs"


def as_node(node: int, name: str) -> list[str]:
    """The file's lines as `launch` streams them: '[node-N] ' + line."""
    return [f"[node-{node}] {line}" for line in (LOGS / name).read_text().splitlines()]


@pytest.mark.parametrize(
    ("log", "signature"),
    [
        ("nccl-connect.log", "nccl-connect"),
        ("nccl-connect-refused-old.log", "nccl-connect"),
        ("watchdog-timeout.log", "nccl-timeout"),
        ("watchdog-timeout-new-format.log", "nccl-timeout"),
        ("ibv.log", "ib-verbs"),
        ("efa-ofi.log", "ib-verbs"),
        ("cuda-oom.log", "cuda-oom"),
        ("rendezvous.log", "rendezvous-timeout"),
        ("address-in-use.log", "address-in-use"),
        ("address-in-use-wrapped.log", "address-in-use"),
        ("iface-not-found.log", "iface-not-found"),
        ("gloo-reset.log", "gloo-reset"),
        ("child-failed.log", "host-oom"),
        ("no-space.log", "no-space"),
        ("driver-too-old.log", "driver-too-old"),
    ],
)
def test_real_excerpt_is_recognised_first(log: str, signature: str) -> None:
    found = diagnose(as_node(1, log))
    assert found, f"{log}: nothing recognised"
    assert found[0].signature == signature
    assert found[0].node == "node-1" and found[0].nodes == ("node-1",)
    assert not found[0].line.startswith("[node-")


@pytest.mark.parametrize(
    ("line", "signature"),
    [
        # synthetic: no real excerpt of these was found (see data/logs/SOURCES.md)
        ("NCCL WARN NCCL version mismatch: rank 3 has 2.18.1, rank 0 has 2.21.5", "version-mismatch"),
        ("ModuleNotFoundError: No module named 'deepspeed'", "module-not-found"),
        ("RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:83] ifa != nullptr. Unable to find address for: eth9", "iface-not-found"),
        ("Bootstrap : no socket interface found", "iface-not-found"),
        ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.", "rendezvous-timeout"),
        ("node1:1:1 [0] NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)", "shm"),
    ],
)  # fmt: skip
def test_synthetic_lines(line: str, signature: str) -> None:
    assert [d.signature for d in diagnose([line])] == [signature]


def test_dedup_order_and_nodes_across_a_whole_job() -> None:
    lines = (
        ["[node-0] step 10 loss 2.31"]
        + as_node(1, "cuda-oom.log")
        + as_node(0, "watchdog-timeout.log")
        + as_node(2, "watchdog-timeout-new-format.log")
        + as_node(1, "child-failed.log")
        + ["[node-0] torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
    )
    found = diagnose(lines)
    assert [d.signature for d in found] == ["cuda-oom", "nccl-timeout", "host-oom", "child-failed"]
    timeout = found[1]
    assert timeout.node == "node-0" and timeout.nodes == ("node-0", "node-2")
    assert "Watchdog caught collective operation timeout" in timeout.line
    assert found[3].nodes == ("node-1", "node-0")


def test_generic_wrappers_come_after_the_specific_cause() -> None:
    found = diagnose(as_node(0, "iface-not-found.log"))  # ncclInternalError line comes first
    assert [d.signature for d in found] == ["iface-not-found", "nccl-system-error"]


def test_unprefixed_and_coloured_lines() -> None:
    assert split_node("\x1b[31m[node-3] boom\x1b[0m") == ("node-3", "boom")
    assert split_node("[rank0]:[E321 02:07:08] x") == (None, "[rank0]:[E321 02:07:08] x")
    (only,) = diagnose(["OSError: [Errno 28] No space left on device"])
    assert only.node is None and only.nodes == ()


def test_quiet_output_gives_nothing() -> None:
    healthy = [
        "[node-0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ibs3:10.252.0.211<0>",
        "[node-1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
        "[node-0] NCCL version 2.20.5+cuda12.4",
        "[node-0] epoch 1 done",
    ]
    assert diagnose(healthy) == []


def test_every_signature_has_a_concrete_fix() -> None:
    ids = [s.id for s in SIGNATURES]
    assert len(ids) == len(set(ids))
    for s in SIGNATURES:
        assert s.cause.endswith(".") and len(s.fix) > 30, s.id
