"""`up` under moto records its timeline (plan, create call, nodes running) and `status NAME
--timeline` shows it; the user data sent starts the training image's pull at boot."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import yaml


def test_up_records_the_timeline_and_the_nodes_pull_at_boot(fakes, spec_for, store, up_cluster):
    inv = up_cluster(spec_for(nodes=2))
    (tl,) = store.load("c1").timelines
    assert tl.command == "up" and tl.ended
    assert [(p.phase, p.part_of) for p in tl.phases] == [
        ("plan", ""), ("create call", ""), ("nodes running", "create call")]
    assert tl.phases[2].detail == "2 node(s)"
    out = subprocess.run([sys.executable, "-m", "provision.cli", "status", "c1", "--timeline"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "MGPU_CLOUD_HOME": str(store.home)}).stdout
    assert "c1: up at " in out and "(aws)" in out
    assert "  create call " in out and "    nodes running " in out
    top = max((p for p in tl.phases if not p.part_of), key=lambda p: p.seconds)
    assert f"slowest phase: {top.phase} " in out  # whichever it was: plan or create call

    raw = fakes.calls("RunInstances")[0]["UserData"]
    text = raw if raw.startswith("#cloud-config") else base64.b64decode(raw).decode()
    data = yaml.safe_load(text)
    script = next(f for f in data["write_files"] if f["path"].endswith("boot-pull.sh"))
    assert data["runcmd"] == [["bash", script["path"]]]
    assert f"docker pull {inv.container_image}" in script["content"]
    assert "systemd-run --unit=mgpu-cloud-image-pull" in script["content"]
