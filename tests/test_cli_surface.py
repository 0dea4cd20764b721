"""The command line as a new user meets it (issue 23), through the CLI runner: typos are
refused by name, options after the script are warned about, help is grouped and whole, the
tables fit 80 columns, a dry run exits 0, and `jobs`, `logs`, `monitor` say what is true."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from fake_nodes import FakeConnector
from typer.testing import CliRunner

from provision.cli import app
from provision.cli.options import DEFAULT_NODES
from provision.cluster import cost
from provision.job import jobs as jobrecords
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.jobstore import JobStore
from provision.model.spec import ClusterSpec, build_cluster_spec, build_job_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")


def invoke(*args: str, columns: int | None = None) -> Any:
    env = {"COLUMNS": str(columns)} if columns else {}
    return CliRunner().invoke(app, list(args), env=env)


def parsed(*args: str) -> dict[str, Any]:
    """What Click hands the command for `args` (the real parser, nothing run)."""
    group = typer.main.get_command(app)
    command = group.commands[args[0]]  # type: ignore[attr-defined]
    with command.make_context(args[0], list(args[1:])) as ctx:
        return dict(ctx.params)


def _inv(name: str = "demo", n: int = 2, provider: str = "docker", slots: int = 2) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=slots) for r in range(n)]
    return Inventory(name=name, provider=provider, nodes=nodes, status="ready",
                     created_at="2025-06-01T12:34:56+00:00")


def _fake(monkeypatch: pytest.MonkeyPatch) -> FakeConnector:
    fake = FakeConnector()
    monkeypatch.setattr("provision.nodes.group.default_connector", lambda inv: fake)
    return fake


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


# ------------------------------------------------------------------------- typos, script line
@pytest.mark.parametrize(("args", "typo", "suggested"), [
    (("run", "--nodse", "2", "train.py"), "--nodse", "--nodes"),
    (("launch", "C", "--nprocs", "1", "job/train.py"), "--nprocs", "--nproc-per-node"),
    (("scale", "--nodse", "1,2", "train.py"), "--nodse", "--nodes"),
])
def test_a_typo_before_the_script_is_refused_by_name(mgpu_home: Path, args: tuple[str, ...],
                                                     typo: str, suggested: str) -> None:
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert f"No such option: {typo}" in res.output and suggested in res.output
    assert "does not exist" not in res.output  # not taken for the script
    assert not (mgpu_home / "clusters").exists() or not list((mgpu_home / "clusters").iterdir())


def test_the_words_after_the_script_are_the_scripts_own() -> None:
    params = parsed("run", "--nodes", "2", "train.py", "--steps", "20", "--keep")
    assert (params["script"], params["args"]) == ("train.py", ["--steps", "20", "--keep"])
    assert params["nodes"] == 2 and params["keep"] is False
    params = parsed("launch", "C", "-d", "--nproc-per-node=1", "train.py", "--detach")
    assert params["detach"] is True and params["nproc_per_node"] == "1"
    assert (params["script"], params["args"]) == ("train.py", ["--detach"])
    params = parsed("launch", "C", "--", "train.py", "--lr", "3e-4")
    assert (params["script"], params["args"]) == ("train.py", ["--lr", "3e-4"])


def test_an_option_of_the_tool_after_the_script_is_warned_about(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = invoke("run", "--dry-run", str(script), "--nodes", "2", "--steps", "3")
    assert res.exit_code == 0, res.output
    assert f"warning: {script} gets --nodes" in res.output
    assert "put `--` before it" in res.output and "--steps" not in res.output.split("\n")[0]
    assert "1 node(s)" in res.output  # --nodes went to the script, as warned
    on_purpose = invoke("run", "--dry-run", "--", str(script), "--nodes", "2")
    assert on_purpose.exit_code == 0 and "warning" not in on_purpose.output


def test_a_dry_run_exits_0_as_up_does(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    for args in (("up", "--dry-run"), ("run", "--dry-run", str(script)),
                 ("run", "--dry-run", "--detach", str(script)),
                 ("scale", "--dry-run", "--nodes", "1,2", str(script))):
        res = invoke(*args)
        assert res.exit_code == 0, (args, res.output)
        assert "dry run: nothing was created" in res.output


# ----------------------------------------------------------------------------------- help
def test_version() -> None:
    from importlib.metadata import version

    res = invoke("--version")
    assert res.exit_code == 0 and res.output.strip() == f"mgpu-cloud {version('mgpu-cloud')}"


def test_top_level_help_shows_each_first_sentence_whole() -> None:
    res = invoke("--help", columns=80)
    assert res.exit_code == 0
    commands = res.output.split("\nCommands:\n")[1]
    assert "..." not in commands and _widest(res.output) <= 80
    flat = " ".join(commands.split())
    assert "Compare every node's GPUs, driver, torch/NCCL versions and ports; optionally " \
           "bandwidth." in flat
    assert "Delete every resource of a cluster (idempotent; works from the inventory alone)." \
        in flat


@pytest.mark.parametrize("command", ["run", "launch", "scale"])
def test_script_commands_help_is_grouped_without_python_types(command: str) -> None:
    res = invoke(command, "--help", columns=80)
    assert res.exit_code == 0
    text = res.output
    assert not re.search(r"<(str|int|float|bool|list\[\w+\])>", text), text
    assert "Options go before SCRIPT" in text
    for section in ("Arguments:", "Options:", "Job:", "Recovery:", "Fabric gate:"):
        assert f"\n{section}\n" in text, section
    if command == "run":
        assert "\nCluster:\n" in text and "\nProvider (each flag names its providers):\n" in text
        nodes = next(line for line in text.splitlines() if "--nodes INTEGER" in line)
        assert f"(default: {DEFAULT_NODES})" in nodes
        assert ClusterSpec.model_fields["nodes"].default == DEFAULT_NODES


# ------------------------------------------------------------------------------------ jobs
def _record(inv: Inventory, command_words: int = 30) -> None:
    args = [f"--option-{i}" for i in range(command_words)]
    job = build_job_spec({}, {"script": EXAMPLE, "args": args})
    rec = jobrecords.begin(inv, job, inv.nodes, detached=True)
    rec.state = "exited"
    for node in rec.nodes.values():
        node.set("exited", 0)
    JobStore().save(rec)


def test_jobs_without_a_name_uses_the_only_cluster_and_fits_80_columns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inv = _inv("only")
    InventoryStore().create(inv.model_copy(update={"status": "creating"}))
    _record(inv)
    res = invoke("jobs", columns=80)
    assert res.exit_code == 0, res.output
    assert "ID  STATE" in res.output and _widest(res.output) <= 80, res.output
    flat = " ".join(res.output.split())
    assert "--option-0 --option-1" in flat and "--option-29" in flat  # nothing cut
    InventoryStore().create(_inv("second").model_copy(update={"status": "creating"}))
    two = invoke("jobs")
    assert two.exit_code != 0 and "only, second" in two.output


def test_jobs_of_killed_ranks_fit_80_columns() -> None:
    """The widest cells a row can hold at once (a detached job's state, a signal's exit code
    on every node): STARTED leaves the row for a line of its own, nothing is cut
    (seen: 81 columns on real nodes, under load)."""
    inv = _inv("only")
    InventoryStore().create(inv.model_copy(update={"status": "creating"}))
    job = build_job_spec({}, {"script": EXAMPLE, "args": ["--steps", "12"]})
    rec = jobrecords.begin(inv, job, inv.nodes, detached=True)
    rec.state = "cancelled"  # its ranks killed: 137 on each node
    for node in rec.nodes.values():
        node.set("exited", 137)
    JobStore().save(rec)
    res = invoke("jobs", columns=80)
    assert res.exit_code == 0, res.output
    assert _widest(res.output) <= 80, res.output
    flat = " ".join(res.output.split())
    assert "137,137" in flat and "started " in flat, res.output


def test_a_managed_clusters_jobs_fit_80_columns(tmp_path: Path) -> None:
    from provision.job.managed.records import JobLog, next_job_id
    from remote.store import open_store

    url = f"file://{tmp_path}/store"
    store = open_store(url)
    log = JobLog(store, "m1", next_job_id(store, "m1"))
    args = [f"--option-{i}" for i in range(30)]
    store.put_bytes("m1/jobs/1/spec.json", json.dumps({"script": "train.py", "args": args})
                    .encode())
    log.record("submitted", "handed over")
    log.record("started", "running on 2 node(s)")
    log.close()
    res = invoke("jobs", "m1", "--store", url, columns=80)
    assert res.exit_code == 0, res.output
    assert "RESTARTS" in res.output and _widest(res.output) <= 80, res.output
    assert "--option-29" in res.output


def test_jobs_of_no_such_cluster_is_an_error_that_lists_the_clusters() -> None:
    InventoryStore().create(_inv("real").model_copy(update={"status": "creating"}))
    res = invoke("jobs", "nosuch")
    assert res.exit_code == 2, res.output
    assert "no cluster named 'nosuch'" in res.output and "real" in res.output
    assert "no jobs" not in res.output
    empty = invoke("jobs", "real")
    assert empty.exit_code == 0 and "no jobs on 'real' yet" in empty.output


# ------------------------------------------------------------------------------------ cost
def test_cost_fits_80_columns_and_cuts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = build_cluster_spec({}, {"name": "llama-finetune-production-1", "provider": "aws",
                                   "nodes": 16, "spot": True,
                                   "aws": {"instance_type": "p4d.24xlarge"}})
    inv = Inventory(name=spec.name, provider="aws", spec=spec, hourly_cost_usd=524.16,
                    created_at="2025-01-01T00:00:00+00:00")
    cost.record_up(inv)
    monkeypatch.setattr(cost, "_now", lambda: dt.datetime(2025, 1, 1, 2, 30, tzinfo=dt.UTC))
    cost.record_down(inv)
    res = invoke("cost", columns=80)
    assert res.exit_code == 0, res.output
    assert _widest(res.output) <= 80, res.output
    for value in ("llama-finetune-production-1", "p4d.24xlarge (spot)", "created 2025-01-01 "
                  "00:00Z", "removed 2025-01-01 02:30Z", "1310.40"):  # 2.5 h x $524.16
        assert value in res.output, value
    [row] = [line for line in res.output.splitlines() if line.startswith("llama")]
    assert row.endswith("  1310.40") and " 40.00 " in row  # the $ column, and node-hours


# ----------------------------------------------------------------------------------- check
CPU_NODE = {
    "schema": 1, "host": "node-0", "gpus": [], "gpu_error": "nvidia-smi not found",
    "topology": {"summary": None}, "torch": {"torch": "2.13.0+cpu", "cuda": None, "nccl": None,
                                             "cuda_available": False},
    "torch_error": None, "disk": {"path": "/root", "free_bytes": 51 * 2**30,
                                  "total_bytes": 100 * 2**30},
    "master_port": {"addr": "node-0", "port": 29500, "status": "refused", "reachable": True},
}


def test_check_fits_80_columns_and_cuts_no_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_check import a100_node

    InventoryStore().create(_inv("chk"))
    fake = _fake(monkeypatch)
    fake.on(r"preflight", node="node-0", stdout=json.dumps(a100_node()))
    other = a100_node()
    other["torch"] = {**other["torch"], "torch": "2.13.0.dev20260101+cu126"}
    fake.on(r"preflight", node="node-1", stdout=json.dumps(other))
    res = invoke("check", "chk", columns=80)
    assert _widest(res.output) <= 80, res.output
    assert "2.4.1+cu121" in res.output and "2.13.0.dev20260101+cu126" in res.output
    assert "…" not in res.output
    assert "master port refused" in res.output and "disk free 500 GiB" in res.output
    finding = " ".join(res.output.split())
    assert "torch" in finding and "node-1" in finding


# ---------------------------------------------------------------------------------- status
def test_status_node_lines_have_a_header(monkeypatch: pytest.MonkeyPatch) -> None:
    InventoryStore().create(_inv("st"))
    res = invoke("status", columns=80)
    lines = res.output.splitlines()
    assert lines[0].startswith("CLUSTER") and lines[2].split() == ["NODE", "SSH", "PRIVATE"]
    assert lines[3].split() == ["node-0", "root@127.0.0.1:4000", "node-0"]
    assert _widest(res.output) <= 80


# --------------------------------------------------------------------------------- monitor
def test_monitor_on_docker_says_the_numbers_are_the_hosts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sample = {"host": "h", "cpu_pct": 12.5, "cpus": 8, "mem_used_mib": 2048,
              "mem_total_mib": 8192, "load": [0.5, 0.25, 0.0], "gpus": [], "gpu_source": None,
              "gpu_error": "nvidia-smi not found"}
    fake = _fake(monkeypatch)
    fake.on(r"monitor", stdout=json.dumps(sample))
    InventoryStore().create(_inv("mon"))
    res = invoke("monitor", "mon", "--once")
    assert res.exit_code == 0, res.output
    assert "note: CPU, memory and load are this machine's (docker nodes share its kernel)" \
        in res.output
    as_json = json.loads(invoke("monitor", "mon", "--once", "--json").output)
    assert "docker nodes share its kernel" in as_json["note"]
    InventoryStore().create(_inv("own", provider="ssh"))
    assert "note:" not in invoke("monitor", "own", "--once").output
