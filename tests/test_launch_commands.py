"""Command construction: what each node runs, with every value quoted."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from provision.job.launch import launcher_argv, launching_nodes, node_command
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_job_spec

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _inv(n: int = 2, slots: int = 2, **kw: object) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=slots) for r in range(n)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready", **kw)


def _job(**kw: object):  # type: ignore[no-untyped-def]
    return build_job_spec({}, {"script": EXAMPLE, **kw})


def test_torchrun_static_ranks() -> None:
    inv = _inv(3)
    argv = launcher_argv(inv, _job(args=["--lr", "3e-4"]), inv.nodes[2], "R")
    assert argv == ["torchrun", "--nnodes", "3", "--nproc_per_node", "2", "--node_rank", "2",
                    "--master_addr", "node-0", "--master_port", "29500", "train_ddp.py",
                    "--lr", "3e-4"]


def test_torchrun_rdzv() -> None:
    inv = _inv(2)
    argv = launcher_argv(inv, _job(rdzv=True, master_port=29600, nproc_per_node="gpu"),
                         inv.nodes[1], "R")
    assert argv[:4] == ["torchrun", "--nnodes", "2", "--nproc_per_node"]
    assert argv[4] == "gpu"
    assert ["--rdzv_backend", "c10d", "--rdzv_endpoint", "node-0:29600"] == argv[5:9]
    assert "--node_rank" not in argv


def test_accelerate_counts_all_processes() -> None:
    inv = _inv(2, slots=4)
    argv = launcher_argv(inv, _job(launcher="accelerate"), inv.nodes[1], "R")
    assert argv[:13] == ["accelerate", "launch", "--multi_gpu", "--num_machines", "2",
                         "--machine_rank", "1", "--main_process_ip", "node-0",
                         "--main_process_port", "29500", "--num_processes", "8"]


def test_deepspeed_pdsh_starts_on_node0_only() -> None:
    inv = _inv(2)
    job = _job(launcher="deepspeed")
    assert [n.name for n in launching_nodes(inv, job)] == ["node-0"]
    argv = launcher_argv(inv, job, inv.nodes[0], "R")
    assert argv[:3] == ["deepspeed", "--hostfile", "R/hostfile"]
    assert argv[-5:] == ["--launcher", "pdsh", "train_ddp.py", "--deepspeed_config",
                         "R/ds_config.json"]
    own = launcher_argv(inv, _job(launcher="deepspeed", args=["--deepspeed_config", "x.json"]),
                        inv.nodes[0], "R")
    assert own[-3:] == ["train_ddp.py", "--deepspeed_config", "x.json"]


def test_deepspeed_no_ssh_runs_everywhere() -> None:
    inv = _inv(2)
    job = _job(launcher="deepspeed", deepspeed_launcher="no_ssh")
    assert len(launching_nodes(inv, job)) == 2
    argv = launcher_argv(inv, job, inv.nodes[1], "R")
    assert ["--no_ssh", "--node_rank", "1"] == argv[7:10]


HOSTILE = ["; rm -rf / #", "$(touch /tmp/pwned)", "`id`", "it's", 'a "b"', "x\ny"]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate"])
def test_every_value_is_quoted(launcher: str, tmp_path: Path) -> None:
    """Run the rendered line through a real shell with `env`/launchers replaced by echo-ers:
    hostile arguments and env values must arrive byte-for-byte as single arguments."""
    inv = _inv(2, nccl_env={"NCCL_X": "$(id)"})
    job = _job(launcher=launcher, args=HOSTILE, env={"EVIL": "; echo hi"})
    cmd = node_command(inv, job, inv.nodes[0])
    # Replace the program names by a printer of its argv, keep the rest of the line as is.
    shim = tmp_path / "bin"
    shim.mkdir()
    (tmp_path / ".mgpu-cloud").mkdir()
    printer = f"#!{sys.executable}\nimport sys\nprint(repr(sys.argv[1:]))\n"
    for prog in ("python3", "env"):
        (shim / prog).write_text(printer)
        (shim / prog).chmod(0o755)
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True,
                         env={"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=30)
    assert not (tmp_path / "pwned").exists()
    printed = out.stdout.strip().splitlines()[-1]
    args = eval(printed)  # noqa: S307 - repr of a list of str written by the shim above
    for hostile in HOSTILE:
        assert hostile in args
    assert "EVIL=; echo hi" in args
    assert "NCCL_X=$(id)" in args
    assert f"MGPU_OUTPUT_DIR={tmp_path}/.mgpu-cloud/outputs" in args
    if launcher == "deepspeed":  # the same values reach $DS_ENV_FILE, quoted for its runner
        from provision.job.launchers.deepspeed import env_file_line

        assert not (tmp_path / ".deepspeed_env").exists()  # the user's file is never touched
        ds_file = tmp_path / ".mgpu-cloud" / "deepspeed_env"
        ds_env = ds_file.read_text().splitlines()
        assert env_file_line("EVIL", "; echo hi") in ds_env
        assert env_file_line("NCCL_X", "$(id)") in ds_env
        from provision.nodes import HomePath  # $HOME expands where pdsh runs it

        assert env_file_line("MGPU_OUTPUT_DIR", HomePath(".mgpu-cloud/outputs")) in ds_env
        assert ds_file.stat().st_mode & 0o777 == 0o600  # the job's --env values are in it


def test_home_paths_expand_on_the_node() -> None:
    inv = _inv(1)
    cmd = node_command(inv, _job(), inv.nodes[0])
    assert '"$HOME"/' in cmd
    words = shlex.split(cmd.replace('"$HOME"', "/root"))
    assert "MGPU_OUTPUT_DIR=/root/.mgpu-cloud/outputs" in words
    assert "/root/.mgpu-cloud/remote.pyz" in words


def test_container_mode() -> None:
    inv = _inv(2, container_image="nvcr.io/nvidia/pytorch:24.06-py3")
    cmd = node_command(inv, _job(), inv.nodes[1])
    words = shlex.split(cmd.replace('"$HOME"', "/home/ubuntu"))
    i = words.index("docker")
    assert words[i + 1:i + 2] == ["run"]
    for flag in ["--gpus", "all", "--network", "host", "--ipc", "host", "memlock=-1",
                 "stack=67108864", "/home/ubuntu/.mgpu-cloud:/mgpu"]:
        assert flag in words
    assert "MGPU_OUTPUT_DIR=/mgpu/outputs" in words
    assert words[words.index("nvcr.io/nvidia/pytorch:24.06-py3") + 1] == "torchrun"


def test_nccl_debug_and_user_env_override_preset() -> None:
    inv = _inv(1, nccl_env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"})
    cmd = node_command(inv, _job(nccl_debug=True, env={"NCCL_SOCKET_IFNAME": "ens5"}),
                       inv.nodes[0])
    words = shlex.split(cmd.replace('"$HOME"', "/h"))
    assert "NCCL_SOCKET_IFNAME=ens5" in words and "NCCL_DEBUG=INFO" in words


def test_container_library_path_is_prepended_inside_the_container() -> None:
    """The words after the image put the provider's folders first on the image's own
    LD_LIBRARY_PATH (run here through a real shell, as the container would)."""
    inv = _inv(2, container_image="img:1", container_library_path=["/opt/amazon/efa/lib",
                                                                    "/opt/x y"])
    words = shlex.split(node_command(inv, _job(), inv.nodes[0]).replace('"$HOME"', "/h"))
    after = words[words.index("img:1") + 1:]
    i = after.index("torchrun")
    prefix = after[:i]
    show = ["sh", "-c", 'printf %s "$LD_LIBRARY_PATH"']
    with_old = subprocess.run(prefix + show, capture_output=True, text=True, check=True,
                              env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/local/lib"})
    assert with_old.stdout == "/opt/amazon/efa/lib:/opt/x y:/usr/local/lib"
    without = subprocess.run(prefix + show, capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin"})
    assert without.stdout == "/opt/amazon/efa/lib:/opt/x y"
    plain = _inv(2, container_image="img:1")
    plain_words = shlex.split(node_command(plain, _job(), plain.nodes[0]).replace('"$HOME"', "/h"))
    assert plain_words[plain_words.index("img:1") + 1] == "torchrun"
