"""`up` on existing machines: check every host at once, report every problem at once.

Per host, through the NodeGroup (one SSH connection each, host key pinned):
    log in (key auth)  ->  python3 on PATH  ->  our remote folder is free  ->  record what we
    will place  ->  upload remote.pyz  ->  `remote.pyz preflight --json` (GPUs, driver, torch,
    NCCL, disk, and whether node-0's master port can be reached from this host)
then all preflights are compared (provision.nodes.checks.compare_preflights: same torch/CUDA/NCCL/
driver versions, GPU models and counts, master port reachable). Every host's problems are
collected and raised together as one ProvisionError; nothing is launched.

What is placed on a host is recorded in the inventory before it is made:
    remote-dir   NODE:~/.mgpu-cloud/ssh/CLUSTER (extra.parents: the folders above it that did
                 not exist before and may be removed again when empty)
Nothing else is written on the user's machines (launchers keep their files in that folder).
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from typing import Any

import paramiko

from provision.model.errors import ProvisionError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.logsink import Log
from provision.model.spec import DEFAULT_MASTER_PORT
from provision.nodes import Connector, NodeConnection, NodeGroup, NodeStepError, RemoteLayout
from provision.nodes.checks import Finding, compare_preflights
from provision.nodes.hostkeys import describe_connect_error
from provision.nodes.preflight import parse_last_json, report_of
from provision.nodes.sshconn import UnknownHostKeyError

PREFLIGHT_TIMEOUT_S = 10.0


class HostProblem(NodeStepError):
    """One host failed a check; the message says which check and why."""


def remote_root(cluster: str) -> str:
    """Our folder on the user's machines, relative to the login user's home. One folder per
    cluster under ~/.mgpu-cloud/ssh/, so the controller's own ~/.mgpu-cloud state (when the
    controller is also one of the hosts) and other clusters on the same hosts are never
    touched."""
    return f".mgpu-cloud/ssh/{cluster}"


def describe_login_error(exc: BaseException, inv: Inventory, node: NodeRecord) -> str:
    """Translate what `Connection.open()` raised into one line (classified by type/errno)."""
    via = f" (via jump host {node.proxy_jump})" if node.proxy_jump else ""
    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"host key CHANGED{via}: it presented {exc.key.get_name()} that differs from "
                "the key checked moments ago")
    if isinstance(exc, UnknownHostKeyError):
        return f"unknown host key{via}: {exc}"
    if isinstance(exc, paramiko.AuthenticationException):
        key = node.identity_file or inv.key_path
        return (f"key authentication failed{via}: {node.user}@{node.address} did not accept "
                f"{key}")
    reason = describe_connect_error(exc)
    if reason is not None:
        return f"unreachable{via}: {reason}"
    return f"SSH error{via}: {type(exc).__name__}: {exc}"


def _probe_script(root: str) -> str:
    parts = root.split("/")
    paths = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    listed = " ".join(shlex.quote(p) for p in paths)
    return (
        'cd "$HOME" || exit 4; '
        "command -v python3 >/dev/null 2>&1 || exit 3; "
        f"for p in {listed}; do if [ -e \"$p\" ]; then echo \"exists:$p\"; fi; done; exit 0"
    )


def check_host(conn: NodeConnection, inv: Inventory, node: NodeRecord, *, pyz: bytes,
               master: NodeRecord, master_port: int,
               record: Callable[[ResourceRecord], None]) -> dict[str, Any]:
    """All checks of one host; returns its preflight report. Raises HostProblem."""
    try:
        conn.open()
    except Exception as exc:  # noqa: BLE001 - translated into one line right here
        raise HostProblem(describe_login_error(exc, inv, node)) from None

    layout = RemoteLayout(inv.remote_root)
    root = layout.root
    probe = conn.run(_probe_script(root))
    if probe.exit_code == 3:
        raise HostProblem(f"python3 not found on PATH for {node.user} (install python3)")
    if not probe.ok:
        raise HostProblem(f"cannot run commands (exit {probe.exit_code}): "
                          f"{probe.stderr.strip()[-200:]}")
    existing = {line.removeprefix("exists:") for line in probe.stdout.splitlines()
                if line.startswith("exists:")}
    if root in existing:
        raise HostProblem(
            f"~/{root} already exists: another cluster named {inv.name!r} uses this host, or "
            "an earlier one was not removed (remove that folder, or pick another --name)"
        )
    parts = root.split("/")
    new_parents = ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)
                   if "/".join(parts[: i + 1]) not in existing]
    record(ResourceRecord(kind="remote-dir", id=f"{node.name}:~/{root}", name=node.name,
                          extra={"path": root, "parents": ",".join(new_parents)}))
    q = shlex.quote
    made = conn.run(f"mkdir -p {q(layout.outputs)} && cat > {q(layout.pyz)}", stdin=pyz)
    if not made.ok:
        raise HostProblem(f"cannot create ~/{root}: {made.tail()}")
    res = conn.run(layout.remote_command(
        "preflight", "--json", "--workdir", root, "--master-addr", master.private_address,
        "--master-port", str(master_port), "--timeout", f"{PREFLIGHT_TIMEOUT_S:g}"))
    report = parse_last_json(res.stdout) if res.ok else None
    if not report:
        raise HostProblem(f"preflight failed (exit {res.exit_code}): {res.tail()}")
    return report_of(node.name, report)


def _finding_text(f: Finding) -> str:
    return f"{f.check}: {f.message}" + (f" ({f.hint})" if f.hint else "")


def check_hosts(
    inv: Inventory,
    store: InventoryStore,
    *,
    pyz: bytes,
    expected_gpus_per_node: int | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    log: Log = print,
    connector: Connector | None = None,
) -> dict[str, dict[str, Any]]:
    """Check every node in parallel; node name -> preflight report.

    Raises ProvisionError naming EVERY failing host (each with all its problems). Whatever was
    placed on a host is in `inv.resources` by then, so destroy can remove it.
    """
    lock = threading.Lock()
    master = inv.master

    def record(res: ResourceRecord) -> None:
        with lock:
            store.record(inv, res)

    def one(conn: NodeConnection, node: NodeRecord) -> dict[str, Any]:
        try:
            return check_host(conn, inv, node, pyz=pyz, master=master,
                              master_port=master_port, record=record)
        except HostProblem:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. the session dropped: one line
            raise HostProblem(describe_login_error(exc, inv, node)) from exc

    with NodeGroup(inv, connector=connector) as group:
        outcomes = group.each(one)
    nodes = group.nodes
    problems: dict[str, list[str]] = {n.name: [] for n in nodes}
    reports: dict[str, dict[str, Any]] = {}
    for name, outcome in outcomes.items():
        if outcome.value is None:
            problems[name].append(outcome.why())
        else:
            reports[name] = outcome.value
    general: list[str] = []
    for f in compare_preflights(reports, expected_gpus_per_node) if reports else []:
        if f.severity != "error":
            where = f" [{', '.join(f.nodes)}]" if f.nodes else ""
            log(f"check {f.severity}: {f.message}{where}")
            continue
        targets = [n for n in f.nodes if n in problems]
        for n in targets:
            problems[n].append(_finding_text(f))
        if not targets:
            general.append(_finding_text(f))
    failed = {n: p for n, p in problems.items() if p}
    if failed or general:
        by_name = {n.name: n for n in nodes}
        lines = []
        for name, items in failed.items():
            node = by_name[name]
            port = "" if node.port == 22 else f":{node.port}"
            lines.append(f"{name} ({node.user}@{node.address}{port}): " + "; ".join(items))
        lines += general
        raise ProvisionError(
            f"host checks failed on {len(failed)} of {len(nodes)} host(s); nothing was "
            "launched:\n  " + "\n  ".join(lines),
            hint="fix the hosts named above and run `up` again; "
            "`ssh -i KEY USER@HOST` shows what a login sees",
        )
    return reports
