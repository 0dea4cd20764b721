"""NodeGroup: one result per node, every failure named, connections reused, layout in one place."""

from __future__ import annotations

import pytest
from fake_nodes import FakeConnector

from provision.model.errors import BootstrapError
from provision.model.inventory import Inventory, NodeRecord
from provision.nodes import HomePath, NodeGroup, NodeStepError, RemoteLayout, fan_out


def _inv(n: int = 3) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}") for r in range(n)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def test_run_returns_a_result_for_every_node_even_when_some_fail() -> None:
    fake = FakeConnector()
    fake.unreachable("node-1")
    fake.on("hostname", node="node-2", exit_code=3, stderr="boom")
    with NodeGroup(_inv(), connector=fake) as group:
        res = group.run("hostname")
    assert list(res) == ["node-0", "node-1", "node-2"]
    assert [r.node.name for r in res.succeeded] == ["node-0"]
    assert [r.node.name for r in res.failed] == ["node-1", "node-2"]
    assert "No route to host" in res["node-1"].why()
    assert res["node-2"].why() == "exit 3: boom"
    with pytest.raises(BootstrapError) as info:
        res.raise_for("probe")
    assert "probe failed on 2 of 3 node(s)" in info.value.message
    assert "node-1: OSError" in info.value.message and "node-2: exit 3: boom" in info.value.message


def test_connections_are_made_once_and_closed_once() -> None:
    fake = FakeConnector()
    group = NodeGroup(_inv(2), connector=fake)
    group.run("a")
    group.run(lambda node: f"echo {node.rank}")
    assert sorted(fake.connected) == ["node-0", "node-1"]
    assert fake.commands("node-1") == ["a", "echo 1"]
    group.close()
    assert sorted(fake.closed) == ["node-0", "node-1"]


def test_a_failed_transport_is_not_reused() -> None:
    fake = FakeConnector()
    fake.on("flaky", node="node-0", raises=EOFError("session dropped"))
    group = NodeGroup(_inv(1), connector=fake)
    assert not group.run("flaky")["node-0"].ok
    group.run("again")
    assert fake.connected == ["node-0", "node-0"]


def test_step_errors_read_as_their_message() -> None:
    def step(conn, node):  # type: ignore[no-untyped-def]
        raise NodeStepError("python3 not found")

    res = NodeGroup(_inv(1), connector=FakeConnector()).each(step)
    assert res["node-0"].why() == "python3 not found"


def test_a_group_of_some_nodes_runs_only_there() -> None:
    fake = FakeConnector()
    inv = _inv(3)
    NodeGroup(inv, [inv.nodes[2]], connector=fake).run("x")
    assert fake.commands("node-2") == ["x"] and fake.commands("node-0") == []


def test_upload_sends_the_archive_on_stdin_with_one_command() -> None:
    fake = FakeConnector()
    NodeGroup(_inv(2), connector=fake).upload(b"ARCHIVE", ["mkdir -p x", "tar -xzf - -C ~"])
    for node in ("node-0", "node-1"):
        assert fake.commands(node) == ["mkdir -p x && tar -xzf - -C ~"]
        assert fake.stdin(node) == [b"ARCHIVE"]


def test_layout_spells_every_remote_path() -> None:
    layout = RemoteLayout(".mgpu-cloud/ssh/lab")
    assert layout.pyz == ".mgpu-cloud/ssh/lab/remote.pyz"
    assert (layout.work, layout.outputs, layout.pidfile, layout.hostfile) == (
        ".mgpu-cloud/ssh/lab/work", ".mgpu-cloud/ssh/lab/outputs",
        ".mgpu-cloud/ssh/lab/job.pid", ".mgpu-cloud/ssh/lab/hostfile")
    assert layout.remote_command("stop", "--pidfile", "a b") == (
        "python3 .mgpu-cloud/ssh/lab/remote.pyz stop --pidfile 'a b'")
    assert isinstance(RemoteLayout(HomePath(".mgpu-cloud")).work, HomePath)


def test_fan_out_keeps_order_and_raises() -> None:
    assert fan_out(range(5), lambda i: i * i) == [0, 1, 4, 9, 16]
    assert fan_out([], lambda i: i) == []
    with pytest.raises(ZeroDivisionError):
        fan_out([1, 0], lambda i: 1 // i)


def test_streaming_calls_start_on_every_node_at_once_beyond_the_pool_cap() -> None:
    """A job's launch and its followers last as long as the job: on 40 nodes (more than
    MAX_WORKERS) every node's call must be running at the same time, or a rendezvous of all
    ranks would wait forever. A barrier of 40 only opens when all 40 have started."""
    import threading
    from concurrent.futures import wait

    from provision.nodes.pool import MAX_WORKERS

    n = MAX_WORKERS + 8
    barrier = threading.Barrier(n, timeout=20)

    def meet(conn: object, node: NodeRecord) -> int:
        barrier.wait()  # BrokenBarrierError after 20 s if some node never started
        return node.rank

    with NodeGroup(_inv(n), connector=FakeConnector()) as group:
        futures = group.submit(meet)
        done, _ = wait(futures, timeout=60)
        assert sorted(f.result() for f in done) == list(range(n))
        barrier.reset()
        res = group.each(meet, streaming=True)
    assert [r.value for r in res.values()] == list(range(n))


def test_a_subset_runs_on_its_owners_connections_and_only_the_owner_closes_them() -> None:
    fake = FakeConnector()
    inv = _inv(3)
    owner = NodeGroup(inv, inv.nodes[:2], connector=fake)
    owner.run("cut")
    sub = owner.subset(inv.nodes)  # node-2 is not the owner's: made in it, kept there
    sub.run("restore")
    assert fake.connected == ["node-0", "node-1", "node-2"]
    sub.subset([inv.nodes[2]]).run("again")  # a subset's subset: the same owner
    sub.close()
    assert fake.connected == ["node-0", "node-1", "node-2"] and fake.closed == []
    assert fake.commands("node-2") == ["restore", "again"]
    owner.close()
    assert sorted(fake.closed) == ["node-0", "node-1", "node-2"]


def test_a_transport_that_failed_in_a_subset_is_not_reused_by_its_owner() -> None:
    fake = FakeConnector()
    fake.on("flaky", node="node-0", raises=EOFError("session dropped"))
    inv = _inv(1)
    owner = NodeGroup(inv, connector=fake)
    owner.run("first")
    assert not owner.subset(inv.nodes).run("flaky")["node-0"].ok
    assert fake.closed == ["node-0"]
    owner.run("again")
    assert fake.connected == ["node-0", "node-0"]
