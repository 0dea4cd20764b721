"""Issue 44: a recovery logs in to each node once. The resident path hands bring_back the
connections its cut opened to the nodes that stay (job/resident.py); bring_back bootstraps the
newcomer, updates the others and restores the checkpoint on those connections and one new
one (the newcomer's), instead of a group of its own per step (3 logins per kept node before:
the cut, the peers' update, the restore); the last checkpoint copy goes on meanwhile and the
restore waits for it. A fake transport counts every login."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fake_nodes import FakeConnector, archive_files

from provision.job.checkpoints import CheckpointKeeper
from provision.job.recovery import Failure, Recovery
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import ensure_cluster_key
from provision.model.spec import build_job_spec
from provision.nodes import NodeGroup

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py")
BOOTSTRAP = re.compile(r"^rm -rf \.mgpu-cloud/work && ")  # its one command per node
MANIFEST = '{"files": {"step_000010.pt": [12, 1.0]}, "incomplete": [], "now": 5.0}'


def _node(rank: int, key: str = "AAAA") -> NodeRecord:
    return NodeRecord(name=f"node-{rank}", rank=rank, address="127.0.0.1", port=4000 + rank,
                      private_address=f"10.0.0.{rank + 2}", host_key=f"ssh-ed25519 {key}")


def _recovery(tmp_path: Path, fake: FakeConnector) -> Recovery:
    store = InventoryStore()
    inv = Inventory(name="c1", provider="docker", nodes=[_node(r) for r in range(3)],
                    status="ready")
    inv.key_path = str(ensure_cluster_key(store.keys_dir("c1"))[0])
    store.create(inv)
    local = tmp_path / "kept"
    local.mkdir()
    (local / "step_000010.pt").write_bytes(b"checkpoint")
    keeper = CheckpointKeeper(inv, local, log=lambda m: None, connector=fake)
    job = build_job_spec({}, {"script": EXAMPLE, "max_restarts": 2})
    provider: Any = None  # bring_back asks nothing of it once _replace is scripted
    recovery = Recovery(provider, inv, store, job, lambda m: None, keeper)

    def replace(nodes: list[NodeRecord], why: str) -> list[NodeRecord]:  # a spare's record
        new = [_node(n.rank, key="BBBB") for n in nodes]
        inv.nodes = sorted([*(n for n in inv.nodes if n not in nodes), *new],
                           key=lambda n: n.rank)
        return new

    recovery._replace = replace  # type: ignore[method-assign]
    return recovery


@pytest.mark.parametrize("kept_open", [True, False])
def test_a_recovery_logs_in_to_each_node_once(kept_open: bool, tmp_path: Path,
                                              mgpu_home: Path) -> None:
    fake = FakeConnector()
    fake.on("ckpt-manifest", stdout=MANIFEST)
    recovery = _recovery(tmp_path, fake)
    inv = recovery.inv
    lost = inv.nodes[1]
    kept = NodeGroup(inv, [inv.nodes[0], inv.nodes[2]], connector=fake)
    if kept_open:
        kept.run("cut")  # the resident path's word to the others: their logins
    started: list[str] = []
    waited: list[list[str]] = []  # what the nodes had been asked when the restore waited

    def copying() -> None:  # the resident path's last checkpoint copy, still going
        waited.append([cmd for _, cmd, _ in fake.log])

    with pytest.MonkeyPatch.context() as mp:  # bring_back's own group, when it makes one
        mp.setattr("provision.nodes.group.default_connector", lambda inv: fake)
        recovery.bring_back(Failure("node lost", [lost], -1),
                            bootstrapped=lambda new: started.extend(n.name for n in new),
                            group=kept if kept_open else None, copying=copying)
    assert started == ["node-1"]
    [asked] = waited  # the newcomer readied while the copy went on; the restore after it
    assert any(BOOTSTRAP.match(c) for c in asked) and not any("checkpoints &&" in c for c in asked)
    assert sorted(fake.connected) == ["node-0", "node-1", "node-2"]  # one login each
    for name in ("node-0", "node-2"):  # told about the newcomer, then the checkpoint
        fake.assert_ran(name, r"^mkdir -p ~/.ssh && .*tar -xzf -")
        assert any(b"ssh-ed25519 BBBB" in body for data in fake.stdin(name)
                   for body in archive_files(data).values())
        fake.assert_ran(name, r"^rm -rf .*checkpoints && .*tar -xzf -")
    assert any(b"checkpoint" in body for data in fake.stdin("node-1")
               for body in archive_files(data).values())
    fake.assert_ran("node-1", BOOTSTRAP.pattern)  # bootstrapped, the others not
    assert not any(BOOTSTRAP.match(c) for c in fake.commands("node-0") + fake.commands("node-2"))
    if kept_open:  # the caller's connections stay open for its next word (the re-form)
        assert fake.closed == []
        kept.run("reform")
        assert sorted(fake.connected) == ["node-0", "node-1", "node-2"]
        kept.close()
    assert sorted(fake.closed) == ["node-0", "node-1", "node-2"]
