"""The documented provider skeleton (docs/provider-skeleton/example) plugs in with ONE
registry line: its spec section, CLI flags, plan, create, rollback and destroy all work
without any other edit. Run in a fresh interpreter so the registry line is the only change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = r'''
import provision.model.registry as registry
registry.REGISTRY["example"] = "example"          # the one line a new provider adds

from typer.testing import CliRunner
from provision.cluster import pipeline
from provision.cli import app
from provision.model.errors import UserInputError
from provision.model.inventory import InventoryStore
from provision.model.spec import build_cluster_spec, load_config_file

help_text = CliRunner().invoke(app, ["up", "--help"]).output
assert "--example-hosts" in help_text and "[example]" in help_text, help_text

out = CliRunner().invoke(app, ["up", "--provider", "example", "--nodes", "2", "--name", "ex",
                               "--example-hosts", "10.0.0.1,10.0.0.2", "--dry-run"])
assert out.exit_code == 0 and "reservation" in out.output, out.output
wrong = CliRunner().invoke(app, ["up", "--provider", "docker", "--example-hosts", "a",
                                 "--dry-run"])
assert wrong.exit_code == 2 and "setting of provider example" in wrong.output, wrong.output

store = InventoryStore()
spec = build_cluster_spec(load_config_file(CONFIG), {})
inv = pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False, log=print)
assert [n.address for n in inv.nodes] == ["10.0.0.1", "10.0.0.2"]
assert store.load("ex").spec.example.user == "ops"   # the typed spec, stored
pipeline.down("ex", store=store, log=print)
assert not store.exists("ex")

bad = build_cluster_spec({}, {"provider": "example", "name": "ex2", "nodes": 2,
                              "example": {"hosts": "10.0.0.1,fail"}})
try:
    pipeline.up(bad, confirm=lambda plan: True, store=store, bootstrap=False, log=print)
except UserInputError as exc:
    assert "everything created so far was deleted" in exc.message, exc.message
else:
    raise AssertionError("create should have failed")
assert not store.exists("ex2")   # rolled back by the pipeline, through destroy
print("SKELETON OK")
'''


def test_skeleton_needs_only_a_registry_line(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("name: ex\nprovider: example\nnodes: 2\n"
                      "example:\n  hosts: 10.0.0.1,10.0.0.2\n  user: ops\n")
    driver = tmp_path / "driver.py"
    driver.write_text(f"CONFIG = {str(config)!r}\n" + DRIVER)
    env = {**os.environ, "MGPU_CLOUD_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "docs" / "provider-skeleton"), str(ROOT)])}
    out = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SKELETON OK" in out.stdout
