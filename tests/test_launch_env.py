"""The environment torchrun's processes get: OMP_NUM_THREADS where torchrun would set it
itself (then it also prints a 5-line banner on every node), the job's own value kept."""

from __future__ import annotations

import io
import json
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from provision.job.launch import node_command
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_job_spec

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


def _inv(slots: int = 2) -> Inventory:
    nodes = [NodeRecord(name=f"node-{r}", rank=r, address="127.0.0.1", port=4000 + r,
                        private_address=f"node-{r}", slots=slots) for r in range(2)]
    return Inventory(name="demo", provider="docker", nodes=nodes, status="ready")


def test_torchrun_gets_omp_num_threads_as_it_would_set_it_without_its_banner() -> None:
    two = _inv(slots=2)
    job = build_job_spec({}, {"script": EXAMPLE})
    assert "OMP_NUM_THREADS=1" in node_command(two, job, two.nodes[0], "R")
    mine = build_job_spec({}, {"script": EXAMPLE, "env": {"OMP_NUM_THREADS": "6"}})
    cmd = node_command(two, mine, two.nodes[0], "R")
    assert "OMP_NUM_THREADS=6" in cmd and "OMP_NUM_THREADS=1" not in cmd
    one = build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "1"})
    assert "OMP_NUM_THREADS" not in node_command(two, one, two.nodes[0], "R")  # torchrun: none
    gpus = _inv(slots=1)  # 'gpu' on one-GPU nodes: one process, torchrun sets nothing
    by_gpu = build_job_spec({}, {"script": EXAMPLE, "nproc_per_node": "gpu"})
    assert "OMP_NUM_THREADS" not in node_command(gpus, by_gpu, gpus.nodes[0], "R")


# --- issue 34: the job's --env values reach every rank unchanged, and run nothing -----------
def battery(marker: str) -> dict[str, str]:
    """Values a shell, DeepSpeed's runner, pdsh or docker's env file would each misread
    (`marker`: the file a value that ran as a command would make)."""
    return {
        "SEMI": f"; touch {marker}", "SUBST": f"$(touch {marker})", "TICKS": f"`touch {marker}`",
        "AND": f"x && touch {marker} #", "SPACES": "  two  spaces  ", "TAB": "a\tb",
        "QUOTES": "it's \"quoted\" '", "BACKSLASH": "a\\b\\\\c\\", "DOLLAR": "$HOME ${X} $",
        "PCT": "%n %h %u %% 100%", "GLOB": "* ?", "BANG": "!! !x", "EQ": "a=b=c", "EMPTY": "",
        "HASH": "#not a comment", "UNICODE": "héllo ✓",
    }


def _shims(tmp_path: Path) -> dict[str, str]:
    """An environment whose `env` prints its arguments (the variables, then the command) as
    JSON, with HOME in tmp_path; the rest of the node's command line runs as is."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "env").write_text(f"#!{sys.executable}\nimport json, sys\n"
                              "print(json.dumps(sys.argv[1:]))\n")
    (shim / "env").chmod(0o755)
    (tmp_path / ".mgpu-cloud").mkdir()
    return {"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)}


def _run_line(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env,
                          timeout=30)


def _env_words(out: str) -> dict[str, str]:
    """The variables `env` was given (its words before the command)."""
    words = json.loads(out.strip().splitlines()[-1])
    return dict(w.split("=", 1) for w in words[:words.index("python3")])


@pytest.mark.parametrize("launcher,extra", [
    ("torchrun", {}), ("accelerate", {}), ("deepspeed", {"deepspeed_launcher": "no_ssh"}),
    ("deepspeed", {}),
])
def test_env_values_reach_the_launcher_unchanged(tmp_path: Path, launcher: str,
                                                 extra: dict[str, str]) -> None:
    """Every launcher's processes inherit the variables `env` sets on the node's line: a real
    shell runs the line; every value arrives byte for byte, none runs."""
    inv, values = _inv(), battery(str(tmp_path / "pwned"))
    job = build_job_spec({}, {"script": EXAMPLE, "launcher": launcher, "env": values, **extra})
    out = _run_line(node_command(inv, job, inv.nodes[0]), _shims(tmp_path))
    assert out.returncode == 0, out.stderr
    got = _env_words(out.stdout)
    assert {k: got[k] for k in values} == values
    assert not (tmp_path / "pwned").exists()


def runner_command(ds_env: str, rank: int, host: str, user: str) -> str:
    """The exports DeepSpeed's pdsh runner puts before its command on every node for this
    $DS_ENV_FILE text, as pdsh hands them to that node's shell. Transcribed from deepspeed
    0.19.8 (launcher/runner.py main: open(), readlines(), split('=', maxsplit=1);
    multinode_runner.py MultiNodeRunner.add_export: strip, wrap in double quotes when a
    character is outside [\\w@%+=:,./-]; PDSHRunner.get_cmd: `export K=V; `), then pdsh 2.34's
    replacement of %n (rank), %h, %u and %% in the remote command (measured: even inside
    quotes; an unknown %x stays). A real pdsh run is in tests/integration/test_launchers.py."""
    exports: dict[str, str] = {}
    for var in io.StringIO(ds_env, newline=None).readlines():  # open(path, 'r') reads so
        key, val = var.split("=", maxsplit=1)
        val = val.strip()
        if re.search(r"[^\w@%+=:,./-]", val):
            val = f'"{val}"'
        exports[key.strip()] = val
    line = "".join(f"export {k}={v}; " for k, v in exports.items())
    tokens = {"n": str(rank), "h": host, "u": user, "%": "%"}
    return re.sub(r"%(.)", lambda m: tokens.get(m[1], m[0]), line)


def test_deepspeed_env_file_gives_every_rank_the_same_values(tmp_path: Path) -> None:
    """pdsh mode: node 0's runner reads $DS_ENV_FILE and exports each value in the command
    pdsh runs on every node. What each node's shell then holds is what `env` was given on
    node 0 (the tool's $HOME paths expanded there too), byte for byte, and nothing ran. The
    file is 0600 (it holds the job's --env values), even where an older one was 0644."""
    inv, values = _inv(), battery(str(tmp_path / "pwned"))
    job = build_job_spec({}, {"script": EXAMPLE, "launcher": "deepspeed", "env": values})
    env = _shims(tmp_path)
    ds_file = tmp_path / ".mgpu-cloud" / "deepspeed_env"
    ds_file.write_text("OLD=1\n")
    ds_file.chmod(0o644)
    out = _run_line(node_command(inv, job, inv.nodes[0]), env)
    assert out.returncode == 0, out.stderr
    given = _env_words(out.stdout)
    assert ds_file.stat().st_mode & 0o777 == 0o600
    exports = runner_command(ds_file.read_text(), 1, "node-1", "root")
    dump = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    ranks = subprocess.run(["sh", "-c", exports + shlex.join(dump)], capture_output=True,
                           text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                           check=True)
    seen = json.loads(ranks.stdout)
    assert {k: seen.get(k) for k in given} == given
    assert {k: seen[k] for k in values} == values
    assert "OLD" not in seen and not (tmp_path / "pwned").exists()


def test_plain_lines_would_run_a_command_in_deepspeed_s_runner(tmp_path: Path) -> None:
    """The transcription fails the way the issue says DeepSpeed does with the `K=V` lines
    written before (so the test above can fail): the runner's double quotes let $(...) run
    and a quote in the value end them; a value's outer spaces are stripped."""
    ran = tmp_path / "ran"
    lines = f'A=$(touch {ran}-1)\nB=x"; touch {ran}-2; "\nC= padded \n'
    dump = "python3 -c 'import os; print(repr(os.environ[\"C\"]))'"
    out = subprocess.run(["sh", "-c", runner_command(lines, 0, "h", "u") + dump],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert Path(f"{ran}-1").exists() and Path(f"{ran}-2").exists()
    assert out.stdout.strip() == "'padded'"


# --- container jobs: --env values through a 0600 file, on no command line --------------------
FAKE_DOCKER = r'''
import json, os, sys
args, env, mounts = sys.argv[1:], {"PATH": os.environ["PATH"]}, {}
assert args.pop(0) == "run"
takes = {"--name", "--gpus", "--network", "--ipc", "--ulimit", "-v", "-w", "-e", "--env-file"}
while args[0].startswith("-"):
    flag = args.pop(0)
    value = args.pop(0) if flag in takes else None
    if flag == "-e":
        env.update([value.split("=", 1)])
    elif flag == "--env-file":  # docker's format: KEY=VALUE a line, VALUE literal
        seen = {"mode": os.stat(value).st_mode & 0o777}
        with open(value) as fh:
            env.update(line.rstrip("\n").split("=", 1) for line in fh)
    elif flag == "-v":
        source, target = value.split(":")
        mounts[target] = source
    elif flag == "-w":
        workdir = value
image, command = args[0], [*args[1:], workdir]
for target, source in mounts.items():  # the bind mount, as paths the container would see
    command = [source + w[len(target):] if w.startswith(target) else w for w in command]
with open(os.environ["HOME"] + "/docker-saw.json", "w") as fh:
    json.dump(seen, fh)
os.chdir(command.pop())
os.execvpe(command[0], command, env)
'''
PROBE = r'''
import json, os, sys
cmdlines = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdlines.append(fh.read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
job = os.path.dirname(os.getcwd()) + "/jobs/job-1"  # the job's cwd: ~/.mgpu-cloud/work
with open(os.path.dirname(os.path.dirname(os.getcwd())) + "/probe.json", "w") as fh:
    json.dump({"env": dict(os.environ), "cmdlines": cmdlines,
               "env_file_left": os.path.exists(job + "/env"),
               "meta_mode": os.stat(job + "/meta.json").st_mode & 0o777,
               "meta": open(job + "/meta.json").read()}, fh)
'''


def _container_node(tmp_path: Path) -> dict[str, str]:
    """This machine as a container node: remote.pyz in ~/.mgpu-cloud, `sudo` that runs its
    command, a `docker run` that starts the command after the image here (the env it was
    given, the bind mount's paths mapped), and a `torchrun` that records what it sees."""
    from provision.nodes.bootstrap import remote_zipapp

    env = _shims(tmp_path)
    shim = tmp_path / "bin"
    (shim / "env").unlink()
    (tmp_path / ".mgpu-cloud" / "remote.pyz").write_bytes(remote_zipapp())
    (tmp_path / ".mgpu-cloud" / "work").mkdir()
    scripts = {"sudo": '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n',
               "docker": f"#!{sys.executable}\n{FAKE_DOCKER}",
               "torchrun": f"#!{sys.executable}\n{PROBE}"}
    for name, text in scripts.items():
        (shim / name).write_text(text)
        (shim / name).chmod(0o755)
    return env


def test_container_env_values_are_on_no_command_line(tmp_path: Path) -> None:
    """Docker container mode, the node's line run for real (remote.pyz job start, attached):
    while the job runs, no process's command line and not meta.json (0600) holds a --env
    value; the container gets them all from a 0600 --env-file, which it removes first thing."""
    secret = "s3cr3t-" + secrets.token_hex(4)
    values = {**battery(str(tmp_path / "pwned")), "TOKEN": f"{secret} ; $(x)"}
    inv = _inv().model_copy(update={"container_image": "img:1", "container_runtime": "docker"})
    job = build_job_spec({}, {"script": EXAMPLE, "env": values})
    cmd = node_command(inv, job, inv.nodes[0], job_id="job-1")
    supervised = shlex.split(cmd[cmd.index("exec "):].replace('"$HOME"', "/h"))
    assert "--env-file" in supervised and "/h/.mgpu-cloud/jobs/job-1/env" in supervised
    assert not any(secret in w for w in supervised)
    assert "MGPU_CLUSTER=demo" in supervised  # the tool's own variables stay `-e`
    node = subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_container_node(tmp_path))
    assert node.stdout is not None and node.stdin is not None
    output = node.stdout.read()  # stdin (the controller's channel) open until the job ended
    assert node.wait(timeout=60) == 0, output
    node.stdin.close()
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert {k: probe["env"][k] for k in values} == values
    assert probe["env"]["MGPU_CLUSTER"] == "demo"
    assert json.loads((tmp_path / "docker-saw.json").read_text()) == {"mode": 0o600}
    assert not [c for c in probe["cmdlines"] if secret in c]
    assert any("job start" in c for c in probe["cmdlines"])  # the supervisor was looked at
    assert probe["meta_mode"] == 0o600 and secret not in probe["meta"]
    assert not probe["env_file_left"]
    assert not (tmp_path / "pwned").exists()


def test_container_without_env_values_has_no_env_file() -> None:
    inv = _inv().model_copy(update={"container_image": "img:1", "container_runtime": "docker"})
    cmd = node_command(inv, build_job_spec({}, {"script": EXAMPLE}), inv.nodes[0])
    assert "--env-file" not in cmd and "umask" not in cmd
