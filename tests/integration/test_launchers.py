"""Every launcher for real across 2 docker nodes (CPU, gloo), on one cluster; then `check`.

Each run asserts the world size EVERY rank saw (accelerate on CPU silently runs each process
alone unless told otherwise: exit codes alone would not catch it).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import unique
from kit import cli

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("node_image"),
              pytest.mark.xdist_group("launchers")]  # one cluster, tests in file order
ROOT = Path(__file__).resolve().parents[2]
NAME = unique("it-launch")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("launch-home")
    res = cli("up", "--nodes", "2", "--name", NAME, home=home)
    assert res.returncode == 0, res.stderr
    try:
        yield home
    finally:
        down = cli("down", NAME, home=home)
        assert down.returncode == 0, down.stderr


def ranks_seen(out: str, world: int) -> None:
    """Every global rank printed `rank R/WORLD` exactly once, and on the node it belongs to."""
    found = sorted(int(m.group(1)) for m in re.finditer(rf"rank (\d+)/{world} on node-\d", out))
    assert found == list(range(world)), out
    assert not re.search(r"rank \d+/1 on", out), "a process ran alone (world size 1)"


GATED = ["--fabric-check", "on"]
IN_JOB = "(the fabric gate first, in the same processes)"


@pytest.mark.parametrize(
    "args,script,gate",
    [
        (["--launcher", "torchrun"], "train_ddp.py", None),
        (["--launcher", "torchrun", "--rdzv", "--master-port", "29511", *GATED], "train_ddp.py",
         IN_JOB),
        (["--launcher", "accelerate", "--master-port", "29512", *GATED], "train_accelerate.py",
         IN_JOB),
        (["--launcher", "deepspeed", "--master-port", "29513", *GATED], "train_deepspeed.py",
         "fabric gate: a run of its own before the job (DeepSpeed's pdsh mode"),
        (["--launcher", "deepspeed", "--deepspeed-launcher", "no_ssh", "--master-port", "29514",
          *GATED], "train_deepspeed.py", IN_JOB),
    ],
    ids=["torchrun-static", "torchrun-c10d-gated", "accelerate-gated", "deepspeed-pdsh-gated",
         "deepspeed-no_ssh-gated"],
)
def test_launcher_trains_with_every_rank(cluster: Path, tmp_path: Path, args: list[str],
                                         script: str, gate: str | None) -> None:
    """Gated (--fabric-check on): the gate runs first, in the processes the launcher starts
    for the job where it can (then the script's own init_process_group must still see the
    whole world), as a run of its own for DeepSpeed's pdsh mode."""
    res = cli("launch", NAME, *args, "--", str(ROOT / "examples" / script), "--steps", "6",
              home=cluster, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    ranks_seen(out, 4)
    if gate is not None:
        assert gate in res.stderr and "fabric gate: pass" in res.stderr, res.stderr
        assert "MGPU-GATE" not in res.stdout  # the gate's own lines are not the job's output
    assert "done: world_size=4" in out
    fetched = [p for p in (tmp_path / "mgpu-outputs" / NAME).rglob("*") if p.is_file()]
    assert fetched, "rank 0's outputs were not copied back"


def test_check_reports_no_gpu_and_gloo_bandwidth(cluster: Path) -> None:
    res = cli("check", NAME, "--bandwidth", "--min-bytes", "64K", "--max-bytes", "1M",
              "--json", home=cluster)
    report = json.loads(res.stdout)
    assert res.returncode == 0, res.stderr
    for node in ("node-0", "node-1"):
        pre = report["preflight"][node]
        assert pre["gpus"] == [] and "nvidia-smi" in pre["gpu_error"]
        assert pre["torch"]["torch"].startswith("2.13.0")
    assert any(f["check"] == "no-gpu" and f["severity"] == "info" for f in report["findings"])
    sizes = [r for r in report["bandwidth"]["records"] if "busbw_gbps" in r]
    assert [r["size_bytes"] for r in sizes][0] == 64 * 1024
    assert all(r["busbw_gbps"] > 0 for r in sizes)


def test_failed_launch_is_diagnosed(cluster: Path, tmp_path: Path) -> None:
    bad = tmp_path / "oom.py"
    bad.write_text("raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n")
    res = cli("launch", NAME, "--nproc-per-node", "1", "--", str(bad), home=cluster, cwd=tmp_path)
    assert res.returncode != 0
    assert "likely cause" in res.stderr and "batch" in res.stderr.lower(), res.stderr


# --- issue 34: --env values reach every rank byte for byte, and run nothing ------------------
PROBE = """import json, os
keys = os.environ["ENVPROBE_KEYS"].split(",")
print("ENVPROBE " + json.dumps({"rank": os.environ.get("RANK"),
                                "env": {k: os.environ.get(k) for k in keys}}), flush=True)
"""


def hostile_env(marker: str) -> dict[str, str]:
    """What a shell, DeepSpeed's runner (double quotes around what it deems special), pdsh
    (%n, %h, %u, %% replaced in the whole command) or a line-based file would misread."""
    return {"SEMI": f"; touch {marker}", "SUBST": f"$(touch {marker})",
            "TICKS": f"`touch {marker}`", "BREAKOUT": f'x"; touch {marker}; "',
            "SPACES": "  two  spaces  ", "QUOTES": "it's \"quoted\"", "DOLLAR": "$HOME ${X}",
            "PCT": "%n %h %u %% 100%", "BACKSLASH": "a\\b\\\\", "EMPTY": "", "GLOB": "*"}


@pytest.mark.parametrize("launcher,port", [("torchrun", 29521), ("accelerate", 29522),
                                           ("deepspeed", 29523)])
def test_env_values_reach_every_rank_unchanged(cluster: Path, tmp_path: Path, launcher: str,
                                               port: int) -> None:
    """DeepSpeed in its pdsh mode: node 0's runner reads $DS_ENV_FILE and starts node 1's
    ranks through pdsh and that node's shell, the path the issue found broken."""
    marker = f"/tmp/mgpu-env-pwned-{secrets.token_hex(3)}"  # noqa: S108 - on the nodes
    values = hostile_env(marker)
    (tmp_path / "envprobe.py").write_text(PROBE)
    pairs = [f"--env={k}={v}" for k, v in values.items()]
    res = cli("launch", NAME, "--launcher", launcher, "--master-port", str(port),
              "--fabric-check", "off", *pairs, f"--env=ENVPROBE_KEYS={','.join(values)}",
              "--", str(tmp_path / "envprobe.py"), home=cluster, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    seen = [json.loads(line.split("ENVPROBE ", 1)[1]) for line in res.stdout.splitlines()
            if "ENVPROBE " in line]
    assert sorted(int(s["rank"]) for s in seen) == [0, 1, 2, 3], out
    for rank in seen:
        assert rank["env"] == values, rank["rank"]
    ran = cli("exec", NAME, "--", f"test ! -e {marker}", home=cluster)
    assert ran.returncode == 0, ran.stdout  # no node ran a value as a command


def test_ssh_through_a_jump_host_checks_its_pinned_key(cluster: Path, tmp_path: Path) -> None:
    """`mgpu-cloud ssh`'s command line to node-1 through node-0 as a jump host: the jump host
    is checked against the cluster's known_hosts (its key pinned there), never the user's own
    or trusted on first use; with another key pinned for it, the login is refused even when
    the user's options say accept-new."""
    from provision.model.inventory import InventoryStore, ResourceRecord
    from provision.model.keys import generate_ed25519, host_key_only
    from provision.nodes.sshconfig import ssh_command
    from provision.nodes.sshconn import ssh_argv, write_cluster_known_hosts

    store = InventoryStore(cluster)
    inv = store.load(NAME)
    jump, node = inv.nodes[0], inv.nodes[1]
    behind = node.model_copy(update={"address": node.private_address, "port": 22,
                                     "proxy_jump": f"{jump.user}@{jump.address}:{jump.port}"})
    pinned = ResourceRecord(kind="pinned-host-key", id=f"[{jump.address}]:{jump.port}",
                            name=jump.address,
                            extra={"port": str(jump.port), "key": str(jump.host_key)})
    # node-0 only as the jump host (not a node: its key pinned as the jump host's alone)
    via = inv.model_copy(update={"nodes": [behind], "resources": [pinned],
                                 "known_hosts_path": str(tmp_path / "known_hosts")})
    write_cluster_known_hosts(via, store)  # this copy's file only: the inventory stays
    user = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "cat",
            "/etc/hostname"]
    ok = subprocess.run(ssh_command(ssh_argv(via, 1, []), user), capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == node.private_address or ok.stdout.strip().endswith("node-1")
    other = host_key_only(generate_ed25519("impostor").public_openssh)
    wrong = via.model_copy(update={"resources": [pinned.model_copy(
        update={"extra": {"port": str(jump.port), "key": other}})]})
    write_cluster_known_hosts(wrong, store)
    refused = subprocess.run(ssh_command(ssh_argv(wrong, 1, []), user), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, \
        refused.stderr
