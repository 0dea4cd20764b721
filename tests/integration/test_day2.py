"""Day-2 commands for real on docker nodes: detached jobs and their logs, cancel, plain ssh,
monitor, cost after `down`, `run --detach` nodes stopping themselves, and `scale`.

One 2-node cluster is shared by the tests that can share it (they run in file order; the
last one removes it); `scale` and `run --detach` make their own, as they must.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import force_remove, leftovers, unique
from kit import IN_CI, cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image"),
              pytest.mark.xdist_group("day2")]  # one cluster, tests in file order
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
NAME = unique("it14-day2")


def jobs_json(home: Path, name: str = NAME) -> list[dict[str, object]]:
    res = cli("jobs", name, "--json", home=home)
    assert res.returncode == 0, res.stderr
    data: list[dict[str, object]] = json.loads(res.stdout)
    return data


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("day2-home")
    res = cli("up", "--nodes", "2", "--name", NAME, home=home)
    assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        cli("down", NAME, home=home)  # idempotent: the last test removed it already
        force_remove(NAME)
        assert leftovers(NAME) == []


def test_detached_job_outlives_its_launcher_and_logs_follow_it(home: Path) -> None:
    go = f"/tmp/{NAME}-go"  # noqa: S108 (a node's): the job trains only once it is there
    res = cli("launch", NAME, "--detach", "--", EXAMPLE, "--steps", "30", "--sleep", "0.3",
              "--start-after", go, home=home)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    assert job_id.isdigit()
    # --detach returned while the job runs (it cannot end before the go); the launching
    # process is gone and the job runs on
    [rec] = [j for j in jobs_json(home) if j["id"] == job_id]
    assert rec["state"] == "running" and rec["detached"] is True
    assert cli("exec", NAME, "--", "touch", go, home=home).returncode == 0
    followed = cli("logs", NAME, job_id, "--follow", home=home)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert any(re.match(r"\[node-0\] rank \d/4 on node-0", ln) for ln in lines)
    assert any(re.match(r"\[node-1\] rank \d/4 on node-1", ln) for ln in lines)
    assert any(ln.startswith("[node-0] step 0 loss") for ln in lines), "from the start"
    assert "[node-0] done: world_size=4" in followed.stdout
    assert f"job {job_id} succeeded (exit code 0)" in followed.stderr
    [rec] = [j for j in jobs_json(home) if j["id"] == job_id]
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0 and rec["logs_saved"]
    table = cli("jobs", NAME, home=home).stdout
    assert re.search(rf"^\s*{job_id}\s+succeeded \(detached\)\s.*\s0,0\s+(-|\d+%)\s+"
                     r"train_ddp.py", table, re.M), table


def test_attached_launch_keeps_the_same_log_and_exit_codes(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys\nprint('rank', os.environ['RANK'], 'failing', flush=True)\n"
                   "sys.exit(3)\n")
    res = cli("launch", NAME, "--nproc-per-node", "1", "--", str(bad), home=home, cwd=tmp_path)
    assert res.returncode != 0
    rec = jobs_json(home)[-1]
    assert rec["detached"] is False and rec["state"] == "failed" and rec["logs_saved"]
    assert rec["exit_code"] == res.returncode
    logs = cli("logs", NAME, str(rec["id"]), "--node", "1", home=home)
    assert logs.returncode == 0, logs.stderr
    assert "[node-1] rank 1 failing" in logs.stdout and "[node-0]" not in logs.stdout
    followed = cli("logs", NAME, str(rec["id"]), "--follow", home=home)
    assert followed.returncode == rec["exit_code"], "an ended job's follow ends with its code"


def test_cancel_stops_every_rank(home: Path) -> None:
    res = cli("launch", NAME, "-d", "--", EXAMPLE, "--steps", "100000", "--sleep", "0.2",
              home=home)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    deadline = time.monotonic() + 120
    while "step 0 loss" not in cli("logs", NAME, job_id, home=home).stdout:
        assert time.monotonic() < deadline, "the job never started training"
        time.sleep(1)
    running = cli("exec", NAME, "--", "pgrep -c -f '[t]rain_ddp.py'", home=home)
    assert running.returncode == 0 and running.stdout.count("exit 0") == 2, running.stdout
    res = cli("cancel", NAME, job_id, "--grace", "5", home=home)
    assert res.returncode == 0, res.stderr
    assert f"job {job_id}: cancelled" in res.stdout
    left = cli("exec", NAME, "--", "pgrep -f '[t]rain_ddp.py' || echo none", home=home)
    assert left.stdout.count("none") == 2, f"ranks survived cancel:\n{left.stdout}"
    [rec] = [j for j in jobs_json(home) if j["id"] == job_id]
    assert rec["state"] == "cancelled" and rec["logs_saved"]


def test_plain_ssh_with_pinned_host_keys(home: Path, tmp_path: Path) -> None:
    res = cli("ssh-config", NAME, home=home)
    assert res.returncode == 0, res.stderr
    config = tmp_path / "config"
    config.write_text(res.stdout)
    batch = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
    for host, expected in ((f"{NAME}-node-1", "node-1"), (NAME, "node-0")):
        ssh = subprocess.run(["ssh", "-F", str(config), *batch, host, "hostname"],
                             capture_output=True, text=True, timeout=60)
        assert (ssh.returncode, ssh.stdout.strip()) == (0, expected), ssh.stderr
    # The same through a pipe (`ssh -F <(...)` cannot work: ssh closes every descriptor
    # above 2 before it reads its options, so /dev/fd/63 is gone; /dev/stdin is kept).
    piped = subprocess.run(
        f"{sys.executable} -m provision.cli ssh-config {NAME} | "
        f"ssh -F /dev/stdin -o BatchMode=yes {NAME}-node-1 hostname", shell=True,
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "MGPU_CLOUD_HOME": str(home)})
    assert piped.stdout.strip() == "node-1", piped.stderr
    # Strict: a node whose key is not the pinned one is refused, never trusted on first use.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    strange = config.read_text().replace(str(home / "keys" / NAME / "known_hosts"), str(empty))
    config.write_text(strange)
    refused = subprocess.run(["ssh", "-F", str(config), *batch, f"{NAME}-node-1", "hostname"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr


def test_ssh_passes_options_through(home: Path) -> None:
    res = cli("ssh", NAME, "--node", "1", "-o", "BatchMode=yes", "hostname", home=home)
    assert (res.returncode, res.stdout.strip()) == (0, "node-1"), res.stderr


def test_monitor_once_json_lists_every_node(home: Path) -> None:
    res = cli("monitor", NAME, "--once", "--json", home=home)
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)["nodes"]
    assert [(n["node"], n["host"]) for n in nodes] == [("node-0", "node-0"), ("node-1", "node-1")]
    for n in nodes:
        assert n["mem_total_mib"] > 0 and n["cpu_pct"] is not None and len(n["load"]) == 3
        assert n["gpus"] == [] and "nvidia-smi" in n["gpu_error"]
    table = cli("monitor", NAME, "--once", home=home).stdout
    assert re.search(r"^node-1\s+cpu x\d+\s+\d+\s+[\d.]+/[\d.]+ GiB", table, re.M), table


def test_after_down_logs_and_cost_remain(home: Path) -> None:
    first = jobs_json(home)[0]
    assert cli("down", NAME, home=home).returncode == 0
    assert leftovers(NAME) == []
    assert not (home / "clusters" / f"{NAME}.lock").exists()
    logs = cli("logs", NAME, str(first["id"]), home=home)
    assert logs.returncode == 0, logs.stderr
    assert "[node-0] done: world_size=4" in logs.stdout
    assert [j["state"] for j in jobs_json(home)][:1] == ["succeeded"]
    rep = json.loads(cli("cost", "--json", home=home).stdout)
    [row] = [r for r in rep["clusters"] if r["cluster"] == NAME]
    assert row["removed"] is not None and row["provider"] == "docker" and row["nodes"] == 2
    assert row["node_hours"] > 0 and row["cost_usd"] == 0.0


def test_run_detach_nodes_stop_themselves(tmp_path: Path, node_image: str) -> None:
    name = unique("it14-rundetach")
    try:
        res = cli("run", "--detach", "--idle-minutes", "0", "--nodes", "1", "--name", name,
                  "--nproc-per-node", "1", "--", EXAMPLE, "--steps", "3", home=tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == "1"
        assert "stop themselves" in res.stderr
        deadline = time.monotonic() + 180
        while True:  # the node container stops itself once the job has ended
            state = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}}",
                                    f"{name}-node-0"], capture_output=True, text=True).stdout
            if state.strip() == "exited":
                break
            assert time.monotonic() < deadline, f"the node did not stop itself: {state}"
            time.sleep(1)
        status = json.loads(cli("status", "--json", home=tmp_path).stdout)
        assert [c["name"] for c in status] == [name], "the inventory stays for `down`"
        assert cli("down", name, home=tmp_path).returncode == 0
        assert leftovers(name) == []
    finally:
        force_remove(name)


def test_scale_prints_a_row_per_size(tmp_path: Path, node_image: str) -> None:
    name = unique("it14-scale")
    chart = tmp_path / "scale.png"
    draw = IN_CI or importlib.util.find_spec("matplotlib") is not None  # CI installs it
    try:
        res = cli("scale", "--nodes", "1,2", "--name", name, "--nproc-per-node", "1",
                  *(["--plot", str(chart)] if draw else []), "--", EXAMPLE, "--steps", "8",
                  home=tmp_path, timeout=600)
        assert res.returncode == 0, res.stderr
        header, *rows = res.stdout.splitlines()
        assert header.split() == ["NODES", "SLOTS", "SAMPLES/S", "SECONDS", "SPEEDUP",
                                  "EFFICIENCY", "$/JOB"]
        assert len(rows) == 2, res.stdout
        one, two = (row.split() for row in rows)
        assert one[:2] == ["1", "1"] and two[:2] == ["2", "2"]
        assert float(one[2]) > 0 and float(two[2]) > 0, "throughput from samples/s="
        assert (one[4], one[5]) == ("1.00x", "100%")
        # efficiency = speedup / 2, each printed rounded (x.xx and N%): consistent within
        # what the rounding of both can hide, never recomputed from the rounded speedup
        speedup, efficiency = float(two[4].rstrip("x")), float(two[5].rstrip("%"))
        assert abs(efficiency - 100 * speedup / 2) <= 100 * 0.005 / 2 + 0.5, two
        assert float(two[6]) == 0.0, "docker nodes cost nothing"
        if draw:
            assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert leftovers(name) == [], "scale brings its cluster down"
        missing = cli("scale", "--cluster", "none-such", "--", EXAMPLE, home=tmp_path)
        assert missing.returncode == 2 and "no cluster named 'none-such'" in missing.stderr
    finally:
        force_remove(name)
