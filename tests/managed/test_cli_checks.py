"""What the command line refuses or says about managed runs before anything is created
(issue 18): supervision flags on a --detach job nobody supervises, --notify on an attached run,
the cluster YAML's `store:`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster.providers import get_provider
from provision.job.attached import Attached
from provision.job.detached import unsupervised_flags
from provision.job.supervision import Target
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import build_cluster_spec, build_job_spec, load_config_file

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def test_only_flags_set_away_from_their_defaults_count() -> None:
    assert unsupervised_flags(build_job_spec({}, {"script": EXAMPLE})) == []
    assert unsupervised_flags(build_job_spec({}, {"script": EXAMPLE, "max_restarts": 0,
                                                  "on_node_loss": "replace"})) == []
    job = build_job_spec({}, {"script": EXAMPLE, "max_restarts": 2, "stall_timeout": 30,
                              "start_timeout": 120,
                              "on_node_loss": "fail", "preempt_signal": "SIGTERM",
                              "notify": "https://hooks.example.com/x"})
    assert unsupervised_flags(job) == ["--max-restarts", "--stall-timeout", "--start-timeout",
                                       "--on-node-loss", "--preempt-signal", "--notify"]


def test_run_detach_without_a_store_refuses_supervision_flags_first(home: Path) -> None:
    code, out = invoke("run", "--detach", "--provider", "docker", "--nodes", "2", "--name",
                       "nostore", "--max-restarts", "2", "--notify", "http://127.0.0.1:9/h",
                       EXAMPLE)
    assert code != 0
    assert "--max-restarts, --notify need a supervisor" in out, out
    assert "add --store s3://BUCKET/PREFIX" in out and "run attached" in out, out
    assert not InventoryStore(home).exists("nostore")  # nothing was made


def test_launch_detach_on_a_cluster_without_a_store_refuses_them(home: Path) -> None:
    InventoryStore(home).create(Inventory(name="plain", provider="docker", status="ready",
                                          spec=build_cluster_spec({}, {"name": "plain"})))
    code, out = invoke("launch", "plain", "--detach", "--stall-timeout", "30", "--", EXAMPLE)
    assert code != 0
    assert "--stall-timeout needs a supervisor" in out, out
    assert "the cluster 'plain' has no store" in out and "up --store URL" in out, out


def test_notify_on_an_attached_run_is_said_to_be_ignored(home: Path) -> None:
    job = build_job_spec({}, {"script": EXAMPLE, "notify": "https://hooks.example.com/x"})
    target = Target("busy", get_provider("docker"), "docker", None, new=False)
    said: list[str] = []
    Attached().check(job, target, said.append)
    assert len(said) == 1 and "ignored on an attached run" in said[0]
    Attached().check(build_job_spec({}, {"script": EXAMPLE}), target, said.append)
    assert len(said) == 1
    InventoryStore(home).create(Inventory(name="busy", provider="docker", status="creating"))
    code, out = invoke("launch", "busy", "--notify", "https://hooks.example.com/x", "--",
                       EXAMPLE)
    assert code != 0 and "--notify is ignored on an attached run" in out, out


def test_the_cluster_yaml_store_is_read_and_checked_before_anything_is_made(
        home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    good = tmp_path / "good.yaml"
    good.write_text(f"name: yml\nprovider: docker\nnodes: 2\nstore: file://{folder}\n")
    assert build_cluster_spec(load_config_file(good), {}).store == f"file://{folder}"
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: yml\nprovider: docker\nnodes: 2\nstore: file://{folder}/none\n")
    code, out = invoke("up", "--config", str(bad), "--yes")
    assert code != 0 and f"{folder}/none is not a folder here" in out, out
    assert "mkdir -p" in out
    assert not InventoryStore(home).exists("yml")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("name: yml\nprovider: docker\nstore: http://bucket/x\n")
    code, out = invoke("up", "--config", str(wrong), "--yes")
    assert code != 0 and "not a store URL" in out, out
