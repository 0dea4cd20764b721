"""`up` against the Compute fake records its timeline (plan, create call, nodes running) and
`status NAME --timeline` shows it; the startup script sent starts the image's pull at boot."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from fake_compute import FakeCompute

from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

BULK = r"/instances/bulkInsert$"
MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]


def test_up_records_the_timeline_and_the_nodes_pull_at_boot(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    inv = up(make_spec(nodes=2, image="nvcr.io/nvidia/pytorch:24.10-py3"))
    (tl,) = store.load("c1").timelines
    assert [(p.phase, p.part_of) for p in tl.phases] == [
        ("plan", ""), ("create call", ""), ("nodes running", "create call")]
    out = subprocess.run([sys.executable, "-m", "provision.cli", "status", "c1", "--timeline"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "MGPU_CLOUD_HOME": str(store.home)}).stdout
    assert "(gcp)" in out and "    nodes running " in out and "slowest phase: " in out

    (bulk,) = (r.body for r in fake.sent("POST", BULK))
    meta = {i["key"]: i["value"] for i in bulk["instanceProperties"]["metadata"]["items"]}
    assert inv.container_image == "nvcr.io/nvidia/pytorch:24.10-py3"
    assert f"docker pull {inv.container_image}" in meta["startup-script"]
    assert "systemd-run --unit=mgpu-cloud-image-pull" in meta["startup-script"]
