"""The slurm provider without a cluster: command lines, what Slurm's output means, the plan
from a recorded probe, the pending-reason loop and the transport, with a scripted login node
(outputs below were recorded on the emulated Slurm 22.05 of test_slurm_cluster.py)."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from provision.cluster.providers.slurm.allocation import wait_running
from provision.cluster.providers.slurm.login import Hop, LoginTarget, split_target
from provision.cluster.providers.slurm.nodeprep import (
    cleanup_script,
    parse_prepared,
    prepare_script,
)
from provision.cluster.providers.slurm.options import SlurmOptions
from provision.cluster.providers.slurm.plan import build_plan, probe_script
from provision.cluster.providers.slurm.provider import SlurmProvider
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
from provision.cluster.providers.slurm.transport import (
    JOB_KIND,
    LOGIN_KIND,
    Allocation,
    AllocationLostError,
    SrunConnection,
)
from provision.model.errors import CapacityError, ProvisionError, TeardownError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.spec import build_cluster_spec
from provision.nodes import CommandResult

TARGET = LoginTarget(login=Hop(user="user", address="127.0.0.1", port=2222,
                               host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinned"),
                     identity_file="/keys/id_ed25519")


def script_of(line: str) -> str:
    """The bash script inside a line made by shell() or srun_line()."""
    found = re.search(r"printf %s (\S+) \| base64 -d", line)
    assert found, line
    return base64.b64decode(found.group(1)).decode()


# ------------------------------------------------------------------------------ commands
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


# ----------------------------------------------------------------------------------- plan
PARTITION = ("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
             "Default=YES QoS=N/A DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=UNLIMITED "
             "MinNodes=0 Nodes=node[1-2] State=UP TotalCPUs=4 TotalNodes=2 "
             "TRES=cpu=4,mem=48210M,node=2,billing=4")
PROBE_OK = f"""::mgpu-cloud::version
slurm-wlm 22.05.8
::mgpu-cloud::user
user
::mgpu-cloud::partition
debug
{PARTITION}
::mgpu-cloud::nodes
node1|idle|2|24105|gpu:2|(null)
node2|alloc|2|24105|gpu:2|(null)
::mgpu-cloud::test
sbatch: Job 1 to start at 2026-11-30T10:54:09 using 4 processors on nodes node[1-2] in partition debug
exit=0
::mgpu-cloud::assoc
default||normal|||
research||normal|||
exit=0
::mgpu-cloud::runtime
pyxis
"""
PROBE_NO_PARTITION = """::mgpu-cloud::version
slurm-wlm 22.05.8
::mgpu-cloud::user
user
::mgpu-cloud::partition
nope
Partition nope not found
::mgpu-cloud::nodes
::mgpu-cloud::test
sbatch: error: invalid partition specified: nope
allocation failure: Invalid partition name specified
exit=1
::mgpu-cloud::assoc
sacctmgr: You are not running a supported accounting_storage plugin
exit=1
::mgpu-cloud::runtime
"""


def spec_of(**slurm: Any) -> Any:
    top = {k: slurm.pop(k) for k in ("nodes", "gpus_per_node", "max_hours") if k in slurm}
    return build_cluster_spec({}, {"provider": "slurm", "name": "c1", "nodes": 2, **top,
                                   "slurm": {"login": "user@127.0.0.1:2222", **slurm}})


def plan_of(output: str, **slurm: Any) -> Any:
    spec = spec_of(**slurm)
    return build_plan(spec, spec.options_as(SlurmOptions), TARGET, output, [])


def test_plan_from_a_probe() -> None:
    plan = plan_of(PROBE_OK, account="research")
    assert plan.request.model_dump() == {
        "job_name": "mgpu-cloud-c1", "nodes": 2, "time_minutes": 60, "partition": None,
        "account": "research", "qos": None, "constraint": None, "reservation": None,
        "gpus_per_node": 2, "extra": []}
    assert plan.slots_per_node == 2 and plan.site.partition == "debug"
    assert plan.site.container_runtimes == ["pyxis"] and plan.site.accounting
    assert "only pyxis found, which mgpu-cloud does not drive yet" in plan.render()
    text = plan.render()
    assert "expected_start=2026-11-30T10:54:09" in text and "time=0-01:00:00 (default)" in text
    assert "partition debug: UP, 2 node(s) (1 idle, 1 allocated, 0 mixed, 0 other)" in text
    assert "your associations: account default QOS normal; account research QOS normal" in text


def test_plan_quotes_slurm_when_it_refuses() -> None:
    with pytest.raises(UserInputError) as err:
        plan_of(PROBE_NO_PARTITION, partition="nope")
    assert "sbatch: error: invalid partition specified: nope\n  allocation failure: Invalid " \
           "partition name specified" in err.value.message


@pytest.mark.parametrize(("change", "expected"), [
    ({"nodes": 3}, "partition debug has 2 node(s); --nodes 3 asked"),
    ({"gpus_per_node": 4}, "at most 2 GPU(s) per node; --gpus-per-node 4 asked"),
])
def test_plan_checks_partition_limits(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(expected)):
        plan_of(PROBE_OK, **change)


def test_plan_time_limit_and_cpu_partitions() -> None:
    limited = PROBE_OK.replace("MaxTime=UNLIMITED", "MaxTime=00:10:00") \
        .replace("MaxNodes=UNLIMITED", "MaxNodes=1")
    with pytest.raises(UserInputError) as err:
        plan_of(limited, max_hours=1)
    assert "allows at most 1 node(s) per job" in err.value.message
    assert "allows at most 0-00:10:00 per job; --time 0-01:00:00 asked" in err.value.message
    cpu = plan_of(PROBE_OK.replace("gpu:2", "(null)"), gpus_per_node=4)
    assert cpu.request.gpus_per_node is None and cpu.slots_per_node == 4
    assert "the partition has no GPUs: 4 process(es) per node" in cpu.render()
    old = PROBE_OK.replace("22.05.8", "20.02.7")
    with pytest.raises(UserInputError, match="need Slurm 20.11 or newer"):
        plan_of(old)


def test_login_target_syntax() -> None:
    assert split_target("alice@login.hpc:2222", "--login") == ("alice", "login.hpc", 2222)
    assert split_target("hpc", "--login") == (None, "hpc", None)
    for bad in ("alice@", "host:port", "a,b"):
        with pytest.raises(UserInputError):
            split_target(bad, "--login")


# ------------------------------------------------------------------- a scripted login node
class FakeSession:
    """Answers the script inside each line with the first matching (pattern, result); records
    the scripts it ran."""

    def __init__(self, *rules: tuple[str, CommandResult | Callable[[], CommandResult]]) -> None:
        self.rules = list(rules)
        self.ran: list[str] = []
        self.users = 0

    def run(self, command: str, **_: Any) -> CommandResult:
        script = script_of(command)
        self.ran.append(("srun " if command.startswith("srun") else "") + script)
        for pattern, result in self.rules:
            if re.search(pattern, script):
                return result() if callable(result) else result
        return CommandResult(0)

    def acquire(self) -> None:
        self.users += 1

    def release(self) -> None:
        self.users -= 1


def states(*lines: str) -> Callable[[], CommandResult]:
    answers = iter(lines)
    return lambda: CommandResult(0, next(answers) + "\n")


def test_waiting_shows_each_pending_reason_once() -> None:
    session = FakeSession(("squeue", states(
        "PENDING|None||N/A", "PENDING|Priority||2026-12-01T08:00:00",
        "PENDING|Priority||2026-12-01T08:00:00", "PENDING|Resources||N/A",
        "RUNNING|None|node[1-2]|2026-11-30T10:00:00")))
    said: list[str] = []
    state = wait_running(session, "7", log=said.append, sleep=lambda s: None)  # type: ignore[arg-type]
    assert state.nodelist == "node[1-2]"
    assert said == ["allocation 7: PENDING (None)",
                    "allocation 7: PENDING (Priority); Slurm expects it to start at "
                    "2026-12-01T08:00:00",
                    "allocation 7: PENDING (Resources)"]


def test_waiting_stops_when_slurm_will_never_start_it() -> None:
    never = FakeSession(("squeue", CommandResult(0, "PENDING|PartitionTimeLimit||N/A\n")))
    with pytest.raises(ProvisionError, match="will never start: Slurm says PartitionTimeLimit"):
        wait_running(never, "7", log=print, sleep=lambda s: None)  # type: ignore[arg-type]
    clock = iter(range(0, 100, 4))
    settling = FakeSession(("squeue", CommandResult(0, "PENDING|PartitionConfig||N/A\n")))
    with pytest.raises(ProvisionError, match="no node of the partition can satisfy"):
        wait_running(settling, "7", log=print, sleep=lambda s: None,  # type: ignore[arg-type]
                     clock=lambda: float(next(clock)))
    ended = FakeSession(("squeue", CommandResult(0, "CANCELLED|None||N/A\n")))
    with pytest.raises(ProvisionError, match="ended: CANCELLED"):
        wait_running(ended, "7", log=print, sleep=lambda s: None)  # type: ignore[arg-type]


def test_waiting_gives_up_after_the_queue_timeout() -> None:
    clock = iter(range(0, 1000, 30))
    busy = FakeSession(("squeue", CommandResult(0, "PENDING|Resources||N/A\n")))
    with pytest.raises(CapacityError, match=r"did not start within 1 min \(still PENDING"):
        wait_running(busy, "7", log=print, timeout_s=60,  # type: ignore[arg-type]
                     sleep=lambda s: None, clock=lambda: float(next(clock)))


def node(name: str, rank: int = 0) -> NodeRecord:
    return NodeRecord(name=name, rank=rank, address=name, private_address=name, user="user")


def test_a_failing_command_is_checked_against_the_allocation() -> None:
    alloc = Allocation("9", TARGET, setup=None)
    session = FakeSession(("exit 3", CommandResult(3, "", "boom")),
                          ("squeue", states("RUNNING|None|node1|N/A", "CANCELLED|None|node1|N/A")))
    conn = SrunConnection(session, alloc, node("node1"))  # type: ignore[arg-type]
    assert conn.run("true").ok and not any("squeue" in s for s in session.ran)
    assert conn.run("exit 3").exit_code == 3  # still RUNNING: the command's own failure
    with pytest.raises(AllocationLostError) as lost:
        conn.run("exit 3")
    assert lost.value.message == ("the Slurm allocation 9 ended: CANCELLED (it was cancelled "
                                  "(scancel, by you or an administrator))")
    before = len(session.ran)
    with pytest.raises(AllocationLostError):
        conn.run("true")  # known lost: no srun any more
    assert not any(s.startswith("srun") for s in session.ran[before:])
    conn.close()
    conn.close()
    assert session.users == 0


def test_node_preparation_reports_every_bad_node() -> None:
    out = ("N|node1|3.11|ssh-ed25519 AAAA|/tmp/mgpu-cloud-u-c-9|yes|8|apptainer\n"
           "N|node2||ssh-ed25519 BBBB|/tmp/mgpu-cloud-u-c-9||8|\n"
           "E|node3|/tmp/mgpu-cloud-u-c-9 exists and is not ours\n")
    with pytest.raises(ProvisionError) as err:
        parse_prepared(out, ["node1", "node2", "node3", "node4"])
    assert "3 of 4 node(s) failed" in err.value.message
    assert "node2: python3 is not on PATH" in err.value.message
    assert "node3: /tmp/mgpu-cloud-u-c-9 exists and is not ours" in err.value.message
    assert "node4: did not answer" in err.value.message
    good = parse_prepared(out.splitlines()[0], ["node1"])
    assert good[0].host_key == "ssh-ed25519 AAAA" and good[0].node_ssh is True
    assert good[0].gpus == 8 and good[0].runtime == "apptainer"


def test_node_folder_and_cleanup_in_a_shell(tmp_path: Path) -> None:
    """prepare_script + cleanup_script on this machine: the link in a fake home, the folder
    in a fake TMPDIR, both removed; the user's own files stay."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    (home / ".mgpu-cloud").mkdir(parents=True)
    (home / ".mgpu-cloud" / "mine.txt").write_text("keep")
    tmp.mkdir()
    env = {"HOME": str(home), "TMPDIR": str(tmp), "SLURMD_NODENAME": "node1",
           "PATH": "/usr/bin:/bin"}
    res = subprocess.run(["bash", "-c", f"cd && {prepare_script('c1', '9', None, None)}"],
                         capture_output=True, text=True, env=env)
    line = res.stdout.strip()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    folder = tmp / f"mgpu-cloud-{user}-c1-9"
    assert line.startswith("N|node1|") and f"|{folder}||0|" in line, res.stderr
    assert (home / ".mgpu-cloud/slurm/c1").resolve() == folder and folder.is_dir()
    again = subprocess.run(["bash", "-c", f"cd && {prepare_script('c1', '9', None, None)}"],
                           capture_output=True, text=True, env=env)
    assert again.stdout.startswith("N|node1|")  # idempotent
    subprocess.run(["bash", "-c", "cd && " + cleanup_script("c1", "9", [], [".mgpu-cloud/slurm"])],
                   check=True, env=env)
    assert not folder.exists() and not (home / ".mgpu-cloud/slurm").exists()
    assert (home / ".mgpu-cloud" / "mine.txt").read_text() == "keep"


# ------------------------------------------------------------------------ provider, CLI
def test_destroy_keeps_the_inventory_when_the_login_node_is_unreachable(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = TARGET.model_copy(update={"login": TARGET.login.model_copy(update={"port": port})})
    store = InventoryStore()
    inv = Inventory(name="c1", provider="slurm", spec=spec_of())
    store.create(inv)
    store.record(inv, ResourceRecord(kind=LOGIN_KIND, id="x",
                                     extra={"target": target.model_dump_json()}))
    store.record(inv, ResourceRecord(kind=JOB_KIND, id="77", name="mgpu-cloud-c1"))
    with pytest.raises(TeardownError) as err:
        SlurmProvider().destroy(inv, store)
    assert "cancel allocation(s) 77" in err.value.message and "scancel 77" in (err.value.hint or "")
    assert [r.id for r in store.load("c1").resources_of(JOB_KIND)] == ["77"]


def test_cli_flags_and_spec() -> None:
    from provision.cli import app

    runner = CliRunner()
    help_text = runner.invoke(app, ["up", "--help"]).output
    for flag in ("--login", "--partition", "--account", "--qos", "--constraint",
                 "--node-access", "--queue-timeout"):
        assert flag in help_text
    wrong = runner.invoke(app, ["up", "--provider", "docker", "--partition", "gpu", "--dry-run"])
    assert wrong.exit_code == 2 and "setting of provider slurm" in wrong.output
    bad = runner.invoke(app, ["up", "--provider", "slurm", "--login", "h",
                              "--node-access", "rsh", "--dry-run"])
    assert bad.exit_code == 2 and "slurm.node_access" in bad.output
    missing = runner.invoke(app, ["up", "--provider", "slurm", "--dry-run"])
    assert missing.exit_code == 2 and "needs the login node" in missing.output
    gc_help = runner.invoke(app, ["gc", "--help"]).output
    assert "--login" in gc_help


def test_images_run_with_the_runtime_the_nodes_have() -> None:
    """--image on Slurm: `apptainer exec` (no Docker there), or a clear refusal."""
    from provision.job.launch import node_command
    from provision.model.errors import LaunchError
    from provision.model.spec import build_job_spec

    example = str(Path(__file__).resolve().parents[3] / "examples" / "train_ddp.py")
    inv = Inventory(name="c1", provider="slurm", remote_root=".mgpu-cloud/slurm/c1",
                    nodes=[node("node1")], container_runtime="apptainer",
                    container_args=["--nv"])
    job = build_job_spec({}, {"script": example, "image": "nvcr.io/nvidia/pytorch:24.06-py3",
                              "env": {"A": "x,y"}})
    line = node_command(inv, job, inv.nodes[0], job_id="7")
    assert (" -- env MGPU_CLUSTER=c1 MGPU_OUTPUT_DIR=/mgpu/outputs "
            "MGPU_CHECKPOINT_DIR=/mgpu/checkpoints MGPU_RESTART_COUNT=0 PYTHONPATH=/mgpu/py "
            "PYTHONUNBUFFERED=1 A=x,y MGPU_RESIDENT_DIR=/mgpu/jobs/7 MGPU_RESIDENT_PORT=29501 "
            "apptainer exec --bind \"$HOME\"/.mgpu-cloud/slurm/c1:/mgpu --pwd /mgpu/work --nv "
            "docker://nvcr.io/nvidia/pytorch:24.06-py3 torchrun ") in line, line
    assert "docker run" not in line and "sudo" not in line
    assert "--container" not in line  # apptainer's processes are the supervisor's own
    inv.container_runtime = "none"
    with pytest.raises(LaunchError, match="cannot run container images"):
        node_command(inv, job, inv.nodes[0])


def test_the_example_cluster_yaml_is_valid() -> None:
    from provision.model.spec import load_config_file

    path = Path(__file__).resolve().parents[3] / "inventories" / "slurm.example.yaml"
    spec = build_cluster_spec(load_config_file(path), {})
    opts = spec.options_as(SlurmOptions)
    assert spec.provider == "slurm" and spec.nodes == 4 and spec.max_hours == 6
    assert opts.login == "alice@login.hpc.example.org" and opts.partition == "gpu"
    assert opts.setup and opts.node_access == "srun"


class _LocalShell:
    """A NodeConnection whose commands run in a local shell (the node's login shell)."""

    def run(self, command: str, **_: Any) -> Any:
        from provision.nodes import CommandResult

        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def run_to_file(self, command: str, local: Path) -> Any:
        from provision.nodes import CommandResult

        with open(local, "wb") as fh:
            done = subprocess.run(["sh", "-c", command], stdout=fh, stderr=subprocess.PIPE)
        return CommandResult(done.returncode, "", done.stderr.decode())


def test_a_file_copied_through_ssh_mode_holds_only_the_commands_output(tmp_path: Path) -> None:
    """node_access=ssh: the site's setup line runs first; what it prints must not end up in
    a file copied off the node (a checkpoint archive would not unpack)."""
    from provision.cluster.providers.slurm.transport import SetupSshConnection
    from provision.nodes import get_file

    (tmp_path / "remote.bin").write_bytes(b"\x1f\x8b payload")
    conn = SetupSshConnection(_LocalShell(), "echo 'module loaded'")  # type: ignore[arg-type]
    got = tmp_path / "got"
    res = conn.run_to_file(f"cd {tmp_path} && printf data", got)
    assert res.ok and got.read_bytes() == b"data" and "module loaded" in res.stderr
    ran = conn.run(f"cd {tmp_path} && printf data")  # a command's stdout is its own, too
    assert ran.ok and ran.stdout == "data" and "module loaded" in ran.stderr
    get_file(conn, str(tmp_path / "remote.bin"), got)
    assert got.read_bytes() == b"\x1f\x8b payload"
    failing = SetupSshConnection(_LocalShell(), "false")  # type: ignore[arg-type]
    assert failing.run_to_file("printf data", got).exit_code == 97


def test_spares_ask_slurm_for_more_nodes_and_an_allocation_a_failed_node_does_not_end() -> None:
    """--spares 1 on 1 node: the plan is made for 2 (contract: the provider's own plan of
    N + K, the partition's limits checked for them all), and the allocation is submitted with
    --no-kill (Slurm otherwise ends a job one of whose nodes fails: the spare could never
    take the rank). 2 + 1 do not fit the partition's 2 nodes: refused in the plan."""
    from provision.cluster.providers import spares
    from provision.cluster.providers.slurm.slurmcmd import sbatch_argv

    spec = spares.with_spares(spec_of().model_copy(update={"nodes": 1, "spares": 1}))
    plan = build_plan(spec, spec.options_as(SlurmOptions), TARGET, PROBE_OK, [])
    assert plan.request.nodes == 2
    assert "--no-kill" in sbatch_argv(plan.request)
    assert "--no-kill" not in sbatch_argv(plan_of(PROBE_OK).request)
    more = spares.with_spares(spec_of().model_copy(update={"spares": 1}))
    with pytest.raises(UserInputError, match="partition debug has 2 node\\(s\\); --nodes 3"):
        build_plan(more, more.options_as(SlurmOptions), TARGET, PROBE_OK, [])
