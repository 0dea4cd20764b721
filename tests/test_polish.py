"""`status` at 80 columns, per-node progress."""

from __future__ import annotations

import io
from pathlib import Path

from fake_nodes import FakeConnector

from provision.cluster.progress import NodeProgress, ReportingStore, bootstrap_group
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.operations.status import status_rows, status_text


def _inv(name: str = "llama-finetune-prod", n: int = 4) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address=f"203.0.113.{100 + r}",
                        port=22, private_address=f"10.20.30.{40 + r}", user="ubuntu")
             for r in range(n)]
    return Inventory(name=name, provider="aws", nodes=nodes, status="ready",
                     created_at="2025-06-01T12:34:56+00:00", hourly_cost_usd=131.04)


def test_status_fits_80_columns_and_cuts_nothing() -> None:
    text = status_text(status_rows([_inv(), _inv("b", 2)]))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "2025-06-01 12:34Z" in text and "131.04" in text
    assert lines[2] == "  NODE    SSH                      PRIVATE"  # the node lines' header
    for r in range(4):
        assert f"  node-{r}  ubuntu@203.0.113.{100 + r}:22  10.20.30.{40 + r}" in lines
    assert "…" not in text and "..." not in text


def test_status_counts_warm_spares_apart_and_names_them() -> None:
    inv = _inv("sp", 2)
    inv.spares = [NodeRecord(name="node-2", rank=2, address="203.0.113.102", port=22,
                             private_address="10.20.30.42", user="ubuntu")]
    text = status_text(status_rows([inv]))
    lines = text.splitlines()
    assert lines[1].split()[3] == "2+1", text  # NODES: the ranks' nodes + the spares
    assert "  node-2 (spare, idle)  ubuntu@203.0.113.102:22  10.20.30.42" in lines, text
    assert status_rows([inv])[0]["spares"][0]["name"] == "node-2"  # --json too
    assert max(len(line) for line in lines) <= 80, text


def test_progress_plain_lines_for_created_resources_and_bootstrap(mgpu_home: Path) -> None:
    out = io.StringIO()
    progress = NodeProgress(out, live=False)
    store = ReportingStore(progress)
    inv = _inv("p", 2)
    store.create(inv)
    store.record(inv, ResourceRecord(kind="instance", id="i-1", name="p-node-0"))
    fake = FakeConnector()
    with bootstrap_group(inv, store, fake) as group:
        assert group is not None
        group.wait_until_reachable()
        group.upload(b"archive", ["tar -xzf -"])
    lines = out.getvalue().splitlines()
    assert "  p-node-0: instance created" in lines
    for node in ("node-0", "node-1"):
        assert lines.index(f"  {node}: waiting for ssh") < lines.index(f"  {node}: ssh answers") \
            < lines.index(f"  {node}: files in place")


def test_no_progress_group_for_a_plain_store(mgpu_home: Path) -> None:
    with bootstrap_group(_inv("q", 1), InventoryStore()) as group:
        assert group is None


def _rolled_back(store: ReportingStore, inv: Inventory) -> None:
    """What pipeline.destroy_cluster does to the store during a rollback."""
    inv.status = "destroying"
    store.save(inv)
    store.delete(inv.name)


def test_a_rollback_after_ctrl_c_shows_in_the_progress(mgpu_home: Path) -> None:
    out = io.StringIO()
    progress = NodeProgress(out, live=False)
    store = ReportingStore(progress)
    inv = _inv("p", 2)
    store.create(inv)
    for r in range(2):
        store.record(inv, ResourceRecord(kind="container", id=f"c{r}", name=f"p-node-{r}"))
    try:
        with bootstrap_group(inv, store, FakeConnector()) as group:
            assert group is not None
            raise KeyboardInterrupt  # Ctrl-C while the nodes are bootstrapped
    except KeyboardInterrupt:
        _rolled_back(store, inv)
    lines = out.getvalue().splitlines()
    for r in range(2):
        assert lines.index(f"  p-node-{r}: container created") \
            < lines.index(f"  p-node-{r}: container removed")
    assert progress.states["node-0"] == "removed"  # the live table's node rows too


def test_after_a_good_bootstrap_teardown_adds_no_progress_lines(mgpu_home: Path) -> None:
    out = io.StringIO()
    store = ReportingStore(NodeProgress(out, live=False))
    inv = _inv("p", 1)
    store.create(inv)
    store.record(inv, ResourceRecord(kind="container", id="c0", name="p-node-0"))
    with bootstrap_group(inv, store, FakeConnector()) as group:
        assert group is not None
    before = out.getvalue()
    _rolled_back(store, inv)  # `run`'s teardown at the end: the run's last lines stay its own
    assert out.getvalue() == before
