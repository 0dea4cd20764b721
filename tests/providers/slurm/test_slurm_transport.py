"""The slurm provider against a scripted login node: the pending-reason loop (allocation.py),
commands through srun checked against the allocation and the ssh mode's copies
(transport.py), and the node folder's preparation and cleanup (nodeprep.py)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slurmkit import TARGET, node, script_of

from provision.cluster.providers.slurm.allocation import wait_running
from provision.cluster.providers.slurm.nodeprep import (
    cleanup_script,
    parse_prepared,
    prepare_script,
)
from provision.cluster.providers.slurm.transport import (
    Allocation,
    AllocationLostError,
    SrunConnection,
)
from provision.model.errors import CapacityError, ProvisionError
from provision.nodes import CommandResult


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


def test_an_endless_archive_through_srun_stops_at_the_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """srun mode writes a copy through unpack.CappedWriter too (nodes/unpack.py): a node's
    stream past the cap is refused while it arrives, not after it filled this disk."""
    from provision.nodes import unpack

    monkeypatch.setattr(unpack, "MAX_DOWNLOAD", 1 << 20)

    class Endless(FakeSession):
        def run(self, command: str, **kw: Any) -> CommandResult:
            for _ in range(1000):  # 64 MiB offered, 64x the cap
                kw["binary_out"].write(b"\0" * (1 << 16))
            return CommandResult(0)

    conn = SrunConnection(Endless(), Allocation("9", TARGET, setup=None),  # type: ignore[arg-type]
                          node("node1"))
    with pytest.raises(unpack.UnsafeArchive, match=r"more than 1048576 bytes"):
        conn.run_to_file("tar -czf - .", tmp_path / "a.tgz")
    assert (tmp_path / "a.tgz").stat().st_size <= 1 << 20
