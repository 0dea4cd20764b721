"""provision/job/liveness.py: the provider asked about every node at once (issue 44: no
per-node serial wait in the detection), and a look begun before a replacement says nothing
after it (GoneNodes.reset, job/resident.py)."""

from __future__ import annotations

import threading
import time

import pytest

from provision.cluster.providers import get_provider
from provision.job.liveness import GoneNodes
from provision.model.inventory import Inventory, NodeRecord


def _inv(n: int) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"10.0.0.{r + 1}", slots=1) for r in range(n)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def _until(gone: GoneNodes, want: list[str]) -> list[str]:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if (got := gone()) == want:
            return got
        time.sleep(0.02)
    return gone()


def test_every_node_is_asked_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    together = threading.Barrier(6, timeout=5)  # breaks unless all six calls overlap
    provider = get_provider("docker")

    def alive(inv: Inventory, node: NodeRecord) -> bool:
        together.wait()
        return node.name != "node-4"

    monkeypatch.setattr(provider, "node_alive", alive)
    # one look only (a look every poll would outlive the test: a later one, half on the real
    # node_alive once monkeypatch is undone, broke the barrier inside another test)
    gone = GoneNodes(provider, _inv(6), every_s=3600.0)  # type: ignore[arg-type]
    assert _until(gone, ["node-4"]) == ["node-4"]
    assert not gone.busy


def test_a_provider_that_raises_cannot_tell_and_looking_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error the provider let through is "cannot tell" (alive) for that node, the others
    are still judged, and the next look starts (before: `busy` stayed set for good)."""
    provider = get_provider("docker")
    looks: list[str] = []

    def alive(inv: Inventory, node: NodeRecord) -> bool:
        looks.append(node.name)
        if node.name == "node-0":
            raise RuntimeError("the API's connection dropped")
        return node.name != "node-2"

    monkeypatch.setattr(provider, "node_alive", alive)
    gone = GoneNodes(provider, _inv(3), every_s=0.05)  # type: ignore[arg-type]
    assert _until(gone, ["node-2"]) == ["node-2"]
    end = time.monotonic() + 10
    while looks.count("node-0") < 2 and time.monotonic() < end:
        gone()
        time.sleep(0.06)
    assert looks.count("node-0") >= 2, "no second look after the one that raised"
    gone.every_s = 3600.0  # no more looks: wait for the one under way
    end = time.monotonic() + 10
    while gone.busy and time.monotonic() < end:
        time.sleep(0.02)
    assert not gone.busy


def test_a_look_begun_before_a_reset_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = get_provider("docker")
    release, entered = threading.Event(), threading.Event()

    def alive(inv: Inventory, node: NodeRecord) -> bool:
        entered.set()
        release.wait(5)  # a slow look, under way while the node is replaced
        return node.name != "node-1"

    monkeypatch.setattr(provider, "node_alive", alive)
    gone = GoneNodes(provider, _inv(2), every_s=3600.0)  # type: ignore[arg-type]
    assert gone() == []  # the first look starts (its thread: not yet begun, maybe)
    assert entered.wait(90)  # it has begun: it read the nodes and asks the provider
    gone.reset()  # node-1 replaced meanwhile
    release.set()
    end = time.monotonic() + 5
    while gone.busy and time.monotonic() < end:
        time.sleep(0.02)
    assert not gone.busy and gone.gone == [], "the old look's node-1 is not the new node-1"
    assert _until(gone, ["node-1"]) == ["node-1"]  # a look begun after it counts


def test_the_first_look_starts_at_once_whatever_the_clocks_origin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic()'s origin is unspecified (on Linux: the boot). An interval longer than
    the clock has run (a machine booted less than every_s ago, as a fresh controller is) must
    not put the first look off (before: "last looked" was 0.0, so it waited until then)."""
    provider = get_provider("docker")
    monkeypatch.setattr(provider, "node_alive", lambda inv, node: node.name != "node-1")
    gone = GoneNodes(provider, _inv(2), every_s=time.monotonic() + 3600.0)  # type: ignore[arg-type]
    assert _until(gone, ["node-1"]) == ["node-1"]
    gone.reset()  # and again at once after a replacement (a look every_s later: never here)
    assert gone() == []
    assert _until(gone, ["node-1"]) == ["node-1"]
