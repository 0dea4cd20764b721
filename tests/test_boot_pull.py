"""The training image pulled from boot on (templates/node/image-pull.sh.j2, from the AWS user
data and the GCP startup script) and bootstrap's side of it (provision/nodes/bootstrap.py):
the rendered script is run by bash with a stand-in `docker` and `systemd-run` on PATH, and
bootstrap's probe line reads the files it leaves."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from fake_nodes import FakeConnector

from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.keys import ensure_cluster_key
from provision.model.render import render
from provision.model.timeline import begin, timed
from provision.nodes import NodeGroup
from provision.nodes import bootstrap as bs

IMAGE = "nvcr.io/nvidia/pytorch:24.06-py3"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A boot-pull context under tmp_path, and bin/ with stand-ins: `docker pull` takes as
    long as $PULL_S and exits $PULL_EXIT; `systemd-run` runs its command in the background."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        '#!/bin/sh\n[ "$1" = info ] && exit 0\necho "$@" >> "$CALLS"\n'
        'sleep "${PULL_S:-0}"\nexit "${PULL_EXIT:-0}"\n')
    (bin_dir / "systemd-run").write_text(
        '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\n"$@" &\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    ctx = {**bs.boot_pull(IMAGE), "started": str(tmp_path / "lib/image-pull.started"),
           "done": str(tmp_path / "lib/image-pull.done"), "script": str(tmp_path / "lib/pull.sh"),
           "log": str(tmp_path / "pull.log"), "retry_s": 0}
    monkeypatch.setattr(bs, "BOOT_PULL_STARTED", ctx["started"])
    monkeypatch.setattr(bs, "BOOT_PULL_DONE", ctx["done"])
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    return ctx


def _boot(ctx: dict[str, object], **env: str) -> None:
    text = render("node/image-pull.sh.j2", **ctx)
    subprocess.run(["bash", "-euo", "pipefail"], input=text, text=True, check=True,
                   env={**os.environ, **env})


def _probe(wait: bool) -> str:
    return subprocess.run(["sh", "-c", bs.boot_pull_probe(IMAGE, wait)], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_the_pull_starts_at_boot_and_bootstrap_waits_only_when_asked(
        node: dict[str, object], tmp_path: Path) -> None:
    assert _probe(wait=False) == ""  # no boot pull on this node: bootstrap pulls itself
    _boot(node, PULL_S="2")
    assert _probe(wait=False) == "pulling"  # `up`: not waited for
    t0 = time.monotonic()
    assert _probe(wait=True) == "ok"  # `run`: waited for, until the pull ended
    assert time.monotonic() - t0 > 0.5
    assert (tmp_path / "calls").read_text().split() == ["pull", IMAGE]


def test_a_failed_boot_pull_says_so(node: dict[str, object]) -> None:
    _boot(node, PULL_EXIT="1")
    assert _probe(wait=True) == f"failed: docker pull {IMAGE} (see {node['log']})"


@pytest.fixture
def cluster(mgpu_home: Path) -> tuple[Inventory, InventoryStore]:
    store = InventoryStore()
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", host_key="ssh-ed25519 AAAA")
             for r in range(2)]
    inv = Inventory(name="demo", provider="aws", nodes=nodes, status="ready",
                    container_image=IMAGE)
    inv.key_path = str(ensure_cluster_key(store.keys_dir("demo"))[0])
    store.create(inv)
    return inv, store


@pytest.mark.parametrize(("state", "wait", "pulled", "present"), [
    ("ok", True, False, True),          # the boot pull ended well: used
    ("pulling", False, False, False),   # `up`: the pull goes on, nobody waits
    ("failed: docker pull x", True, True, True),  # pulled here, the error would be its own
    ("", True, True, True),             # no boot pull (docker, ssh, slurm nodes): pulled here
])
def test_bootstrap_uses_the_boot_pull(cluster: tuple[Inventory, InventoryStore], state: str,
                                      wait: bool, pulled: bool, present: bool) -> None:
    inv, store = cluster
    fake = FakeConnector()
    fake.on(r"image-pull\.started", stdout=state + "\n")
    begin(inv, "up")
    with timed(inv, "bootstrap"):
        bs.bootstrap_cluster(inv, store, log=lambda m: None, wait_image=wait,
                             group=NodeGroup(inv, connector=fake))
    for name in ("node-0", "node-1"):
        assert any("docker pull" in c for c in fake.commands(name)) is pulled
    phases = [p.phase for p in inv.timelines[-1].phases]
    assert phases == ["bootstrap", "ssh answers"] + (["image present"] if present else [])
