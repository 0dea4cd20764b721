"""provision/job/gate/fabric.py: which network NCCL chose, read from real captured NCCL INFO logs
(tests/data/logs/SOURCES.md), and the providers' tables of what each type should deliver."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provision.cluster.providers.aws import catalog as aws_catalog
from provision.cluster.providers.gcp import catalog as gcp_catalog
from provision.job.gate.fabric import (
    FIXES,
    fix_for,
    matches,
    transport_name,
    transport_of,
)

LOGS = Path(__file__).resolve().parent / "data" / "logs"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "fabric-gate.md"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


@pytest.mark.parametrize(
    "log,transport,evidence",
    [
        ("nccl-efa-p5en.log", "efa", "Using network Libfabric"),
        ("nccl-efa-channels-old-plugin.log", "efa", "via NET/AWS Libfabric/0"),
        # OFI picked efa, then the plugin failed and NCCL fell back: sockets, on a p4d
        ("nccl-efa-fallback-socket-p4d.log", "socket", "NET/Socket : Using [0]eth0"),
        ("nccl-socket-gcp.log", "socket", "Using network Socket"),
        ("nccl-ib.log", "ib", "Using network IB"),
        ("nccl-ib-roce.log", "ib", "Using network IB"),
        ("nccl-tcpx.log", "tcpx", "NET/GPUDirectTCPX"),
    ],
)
def test_transport_from_real_logs(log: str, transport: str, evidence: str) -> None:
    found = transport_of(lines(log))
    assert found.name == transport
    assert evidence in found.evidence


def test_the_bootstrap_socket_is_not_the_transport() -> None:
    # every fabric prints NCCL's bootstrap socket; alone it says nothing about the data path
    bootstrap = [line for line in lines("nccl-ib.log") if "Bootstrap" in line]
    assert bootstrap and transport_of(bootstrap).name == "unknown"
    assert transport_of([]).name == "unknown"


def test_one_rank_on_sockets_marks_the_node() -> None:
    mixed = lines("nccl-ib.log") + lines("nccl-socket-gcp.log")
    assert transport_of(mixed).name == "socket"


def test_synthetic_plugin_lines() -> None:
    # SYNTHETIC lines, built from the plugins' format strings (no real INFO excerpt found)
    assert transport_of(["h:1:2 [0] NCCL INFO Using network FasTrak"]).name == "tcpxo"
    assert transport_of(["h:1:2 [0] NCCL INFO Using network gIB"]).name == "rdma"
    assert transport_of(["h:1:2 [0] NCCL INFO Using network GPUDirectTCPX_v7"]).name == "tcpx"
    # SYNTHETIC: aws-ofi-nccl on libfabric's tcp provider is TCP, not EFA
    ofi_tcp = ["h:1:2 [0] NCCL INFO NET/OFI Selected Provider is tcp (found 1 nics)",
               "h:1:2 [0] NCCL INFO Using network Libfabric"]
    assert transport_of(ofi_tcp).name == "socket"
    # SYNTHETIC: the TCPX plugin loaded with GPUDirect off moves data like plain sockets
    off = ["NCCL INFO NET/GPUDirectTCPX : GPUDirectTCPX enable: 0"]
    assert transport_of(off).name == "socket"


def test_transport_names() -> None:
    assert [transport_name(n) for n in ("Socket", "IB", "IBext_v8", "AWS Libfabric",
                                        "Libfabric", "GPUDirectTCPX_v7", "FasTrak", "gIB",
                                        "Something")] == [
        "socket", "ib", "ib", "efa", "efa", "tcpx", "tcpxo", "rdma", "unknown"]


def test_matches_and_fixes() -> None:
    assert matches("efa", "efa") and not matches("efa", "socket")
    assert matches("rdma", "ib") and matches("ib", "rdma")
    assert matches("socket", "efa")  # a type without a fabric: anything will do
    assert "fi_info -p efa" in fix_for("efa", "socket")
    assert "GPUDirectTCPX" in fix_for("tcpx", "socket")
    assert "NCCL_DEBUG_FILE" in fix_for("efa", "unknown")
    assert set(FIXES) == {"efa", "ib", "tcpx", "tcpxo", "rdma"}


EXPECTED = {**aws_catalog.FABRIC, **gcp_catalog.FABRIC}


def test_expectations_table() -> None:
    p4d = aws_catalog.fabric_expectation("p4d.24xlarge")
    assert p4d is not None and p4d.transport == "efa" and p4d.busbw_gbps == pytest.approx(77.35)
    a3 = gcp_catalog.fabric_expectation("a3-highgpu-8g")
    assert a3 is not None and a3.transport == "tcpx"
    assert gcp_catalog.fabric_expectation("a2-highgpu-8g") is None
    p4d.busbw_gbps = 1.0  # a copy: the table itself is unchanged
    assert EXPECTED["p4d.24xlarge"].busbw_gbps == pytest.approx(77.35)
    for row in EXPECTED.values():
        assert row.source and row.nominal


def test_docs_table_matches_the_code() -> None:
    """docs/fabric-gate.md lists every EXPECTED row with the same transport and figure."""
    text = DOCS.read_text()
    for itype, row in EXPECTED.items():
        match = re.search(rf"^\| `{re.escape(itype)}` \| (\w+) \| ([^|]+) \|", text, re.M)
        assert match, f"{itype} is missing from docs/fabric-gate.md"
        assert match[1] == row.transport
        figure = match[2].strip()
        assert figure == ("-" if row.busbw_gbps is None else f"{row.busbw_gbps:g}")
