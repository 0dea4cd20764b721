"""A scripted, recording stand-in for the node transport (provision.nodes.Connector).

    fake = FakeConnector()
    fake.on(r"^nvidia-smi", exit_code=0, stdout="GPU 0: ...")   # first matching rule answers
    fake.unreachable("node-1")                                  # open()/run() raise OSError
    group = NodeGroup(inv, connector=fake)
    ...
    fake.assert_ran("node-0", r"tar -xzf -")
    fake.commands("node-0"), fake.stdin("node-0"), fake.connected

`archive_files(fake.stdin(node)[0])`: the files of an archive a node was sent.

Unscripted commands succeed with empty output. What `run_to_file` writes comes from
`fake.files[(node, command)]` (or `fake.send(pattern, data)`: any command matching), and a file copied with transport.get_file from `fake.files[(node,
remote path)]`. Everything a node was asked is recorded, in order, per node.
"""

from __future__ import annotations

import io
import re
import shlex
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.model.inventory import Inventory, NodeRecord
from provision.nodes import CommandResult


@dataclass
class Rule:
    pattern: re.Pattern[str]
    node: str | None
    result: CommandResult | None
    raises: BaseException | None
    stream: str


@dataclass
class FakeConnector:
    rules: list[Rule] = field(default_factory=list)
    dead: set[str] = field(default_factory=set)
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    sent: list[tuple[re.Pattern[str], str | None, bytes]] = field(default_factory=list)
    log: list[tuple[str, str, bytes | None]] = field(default_factory=list)
    connected: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, inv: Inventory, node: NodeRecord) -> FakeConnection:
        with self.lock:
            self.connected.append(node.name)
        return FakeConnection(self, node.name)

    # --- scripting -------------------------------------------------------------------------
    def on(self, pattern: str, *, node: str | None = None, exit_code: int = 0, stdout: str = "",
           stderr: str = "", raises: BaseException | None = None, stream: str = "") -> None:
        """Answer commands matching `pattern` (on `node`, or any): a result, an exception,
        or (`stream`) text written to the caller's `out` before the result."""
        self.rules.insert(0, Rule(re.compile(pattern), node,
                                  None if raises else CommandResult(exit_code, stdout, stderr),
                                  raises, stream))

    def send(self, pattern: str, data: bytes, *, node: str | None = None) -> None:
        """What `run_to_file` of a command matching `pattern` (on `node`, or any) writes (an
        archive a node packs, whatever its exact command line)."""
        self.sent.insert(0, (re.compile(pattern), node, data))

    def unreachable(self, *nodes: str) -> None:
        self.dead.update(nodes)

    # --- what happened -----------------------------------------------------------------------
    def commands(self, node: str) -> list[str]:
        return [cmd for n, cmd, _ in self.log if n == node]

    def stdin(self, node: str) -> list[bytes]:
        return [data for n, _, data in self.log if n == node and data is not None]

    def assert_ran(self, node: str, pattern: str) -> str:
        rx = re.compile(pattern)
        for cmd in self.commands(node):
            if rx.search(cmd):
                return cmd
        raise AssertionError(f"{node} never ran /{pattern}/; it ran: {self.commands(node)}")

    def answer(self, node: str, command: str) -> Rule | None:
        for rule in self.rules:
            if (rule.node in (None, node)) and rule.pattern.search(command):
                return rule
        return None


class FakeConnection:
    def __init__(self, fake: FakeConnector, node: str) -> None:
        self.fake, self.node = fake, node

    def _check(self) -> None:
        if self.node in self.fake.dead:
            raise OSError(f"[Errno 113] No route to host ({self.node})")

    def open(self) -> None:
        self._check()

    def run(self, command: str, *, stdin: bytes | None = None, out: Any = None,
            timeout: float | None = None) -> CommandResult:
        self._check()
        with self.fake.lock:
            self.fake.log.append((self.node, command, stdin))
        rule = self.fake.answer(self.node, command)
        if rule is None:
            return CommandResult(0)
        if rule.raises is not None:
            raise rule.raises
        if out is not None and rule.stream:
            out.write(rule.stream)
        assert rule.result is not None
        return rule.result

    def run_to_file(self, command: str, local: Path) -> CommandResult:
        """The command's "stdout" is `fake.files[(node, command)]` (b"" when not there); for
        `exec cat -- PATH` (transport.get_file) `fake.files[(node, PATH)]`, and a missing one
        fails as cat would."""
        self._check()
        with self.fake.lock:
            self.fake.log.append((self.node, command, None))
        rule = self.fake.answer(self.node, command)
        if rule is not None and rule.raises is not None:
            raise rule.raises
        if command.startswith("exec cat -- "):
            path = shlex.split(command)[-1]
            if (self.node, path) not in self.fake.files:
                return CommandResult(1, "", f"cat: {path}: No such file or directory")
            local.write_bytes(self.fake.files[(self.node, path)])
            return CommandResult(0)
        sent = [data for rx, node, data in self.fake.sent
                if node in (None, self.node) and rx.search(command)]
        local.write_bytes(sent[0] if sent else self.fake.files.get((self.node, command), b""))
        return rule.result if rule is not None and rule.result is not None else CommandResult(0)

    def close(self) -> None:
        with self.fake.lock:
            self.fake.closed.append(self.node)


def archive_files(archive: bytes) -> dict[str, bytes]:
    """name -> bytes (b"" for a folder) of a gzip tar a node was sent (`fake.stdin(node)`)."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                for m in tar.getmembers()}
