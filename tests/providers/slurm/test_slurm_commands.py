"""The slurm provider's command lines and what Slurm's output means (slurmcmd.py): times,
GRES, the held allocation's sbatch, one-line scripts through any login shell, a probe's
sections."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurmkit import script_of

from provision.cluster.providers.slurm.plan import probe_script
from provision.cluster.providers.slurm.slurmcmd import (
    AllocationRequest,
    check_argv,
    format_time,
    gpu_count,
    minutes_for,
    node_script,
    parse_time,
    sbatch_argv,
    sections,
    shell,
    srun_line,
)


@pytest.mark.parametrize(("text", "minutes"), [
    ("UNLIMITED", None), ("infinite", None), ("10:00", 10), ("00:10:00", 10), ("1:30", 2),
    ("1-00:00:00", 1440), ("2-12", 3600), ("90", 90), ("01:00:01", 61),
])
def test_slurm_times(text: str, minutes: int | None) -> None:
    assert parse_time(text) == minutes


def test_time_limit_is_whole_minutes_rounded_up() -> None:
    assert format_time(minutes_for(0.25)) == "0-00:15:00"
    assert format_time(minutes_for(1 / 120)) == "0-00:01:00"
    assert format_time(minutes_for(49.5)) == "2-01:30:00"


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:2", 2), ("gpu:a100:8(S:0-1)", 8), ("gpu:a100:4,gpu:v100:2", 6), ("(null)", 0),
    ("mps:100,gpu:h100:4(S:0)", 4),
])
def test_gpus_in_gres(gres: str, gpus: int) -> None:
    assert gpu_count(gres) == gpus


def test_the_held_allocation_request() -> None:
    req = AllocationRequest(job_name="mgpu-cloud-c", nodes=4, time_minutes=90, partition="gpu",
                            account="lab", qos="high", gpus_per_node=8, extra=["--mem=0"])
    assert sbatch_argv(req) == [
        "sbatch", "--parsable", "--exclusive", "--no-requeue", "--job-name=mgpu-cloud-c",
        "--nodes=4", "--time=0-01:30:00", "--output=/dev/null", "--error=/dev/null",
        "--chdir=/", "--partition=gpu", "--account=lab", "--qos=high", "--gpus-per-node=8",
        "--mem=0", "--wrap=exec sleep infinity"]
    test = check_argv(req)
    assert test[:2] == ["sbatch", "--test-only"] and test[-1] == "--wrap=true"
    assert "--parsable" not in test and "--time=0-01:30:00" in test


def test_lines_survive_any_content_and_login_shell(tmp_path: Path) -> None:
    """shell()/srun_line() send one line without newlines whatever the script holds."""
    script = "printf '%s\\n' \"it's\" 'a \"b\"' $((1+2))\necho 'second line'\n"
    line = shell(script)
    assert "\n" not in line and script_of(line) == script
    res = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert res.stdout == "it's\na \"b\"\n3\nsecond line\n"
    srun = srun_line("42", "node7", "hostname", setup="module load cuda")
    assert srun.startswith("srun --jobid=42 --overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 "
                           "--nodelist=node7 --chdir=/ --mpi=none --quiet bash -c ")
    body = script_of(srun)
    assert body.startswith('cd "$HOME" || exit 1\n{ module load cuda\n} >&2 || {')
    assert body.endswith("\nhostname\n")
    # what the setup line prints is not the command's output (a copied file, a status JSON)
    ran = subprocess.run(["bash", "-c", node_script("printf data", "echo 'module loaded'")],
                         capture_output=True, text=True)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "data", "module loaded\n")
    failed = subprocess.run(["bash", "-c", node_script("printf data", "false")],
                            capture_output=True, text=True)
    assert failed.returncode == 97 and failed.stdout == ""


def test_sections_of_a_probe() -> None:
    out = subprocess.run(["bash", "-c", probe_script("debug", AllocationRequest(
        job_name="j", nodes=1, time_minutes=1)).replace("sinfo", "echo sinfo")
                          .replace("scontrol", "echo scontrol").replace("sbatch", "echo sbatch")
                          .replace("sacctmgr", "echo sacctmgr").replace("srun", "echo srun")],
                         capture_output=True, text=True).stdout
    parts = sections(out)
    assert list(parts) == ["version", "user", "partition", "nodes", "test", "assoc", "runtime"]
    assert parts["partition"].startswith("debug\nscontrol show partition -o debug")
