"""`up` on existing machines: check every host at once, report every problem at once.

Per host, in one thread each (one SSH connection, host key pinned):
    log in (key auth)  ->  python3 on PATH  ->  our remote folder is free  ->  record what we
    will place  ->  upload remote.pyz  ->  `remote.pyz preflight --json` (GPUs, driver, torch,
    NCCL, disk, and whether node-0's master port can be reached from this host)
then all preflights are compared (provision.check.compare_preflights: same torch/CUDA/NCCL/
driver versions, GPU models and counts, master port reachable). Every host's problems are
collected and raised together as one ProvisionError; nothing is launched.

What is placed on a host is recorded in the inventory before it is made:
    remote-dir   NODE:~/.mgpu-cloud/ssh/CLUSTER (extra.parents: the folders above it that did
                 not exist before and may be removed again when empty)
    remote-file  NODE:~/.deepspeed_env, only when the host had none (DeepSpeed launches write
                 it; `down` removes it only if it still holds this cluster's MGPU_CLUSTER line)
"""

from __future__ import annotations

import io
import json
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import paramiko

from provision.check import Finding, compare_preflights
from provision.errors import ProvisionError
from provision.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.providers.ssh.hostkeys import describe_connect_error
from provision.sshconn import UnknownHostKeyError, connect

Log = Callable[[str], None]
DEFAULT_MASTER_PORT = 29500  # what JobSpec uses unless --master-port is given
PREFLIGHT_TIMEOUT_S = 10.0


class HostProblem(Exception):
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


def _run(conn: Any, cmd: str) -> tuple[int, str, str]:
    res = conn.run(cmd, hide=True, warn=True, in_stream=False)
    return int(res.exited), str(res.stdout), str(res.stderr)


def _probe_script(root: str) -> str:
    parts = root.split("/")
    paths = ["/".join(parts[: i + 1]) for i in range(len(parts))] + [".deepspeed_env"]
    listed = " ".join(shlex.quote(p) for p in paths)
    return (
        'cd "$HOME" || exit 4; '
        "command -v python3 >/dev/null 2>&1 || exit 3; "
        f"for p in {listed}; do if [ -e \"$p\" ]; then echo \"exists:$p\"; fi; done; exit 0"
    )


def check_host(conn: Any, inv: Inventory, node: NodeRecord, *, pyz: bytes, master: NodeRecord,
               master_port: int, record: Callable[[ResourceRecord], None]) -> dict[str, Any]:
    """All checks of one host; returns its preflight report. Raises HostProblem."""
    try:
        conn.open()
    except Exception as exc:  # noqa: BLE001 - translated into one line right here
        conn.close()
        raise HostProblem(describe_login_error(exc, inv, node)) from None

    root = inv.remote_root
    code, out, err = _run(conn, _probe_script(root))
    if code == 3:
        raise HostProblem(f"python3 not found on PATH for {node.user} (install python3)")
    if code != 0:
        raise HostProblem(f"cannot run commands (exit {code}): {err.strip()[-200:]}")
    existing = {line.removeprefix("exists:") for line in out.splitlines()
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
    if ".deepspeed_env" not in existing:
        record(ResourceRecord(kind="remote-file", id=f"{node.name}:~/.deepspeed_env",
                              name=node.name, extra={"path": ".deepspeed_env"}))
    q = shlex.quote
    code, _, err = _run(conn, f"mkdir -p {q(root)}/outputs")
    if code != 0:
        raise HostProblem(f"cannot create ~/{root}: {err.strip()[-200:]}")
    conn.put(io.BytesIO(pyz), f"{root}/remote.pyz")

    code, out, err = _run(conn, (
        f"python3 {q(root)}/remote.pyz preflight --json --workdir {q(root)} "
        f"--master-addr {q(master.private_address)} --master-port {master_port} "
        f"--timeout {PREFLIGHT_TIMEOUT_S:g}"
    ))
    lines = out.strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1]) if code == 0 and lines else {}
    except json.JSONDecodeError:
        report = {}
    if not report:
        detail = (err or out).strip().splitlines()[-3:]
        raise HostProblem(f"preflight failed (exit {code}): {' | '.join(detail)}")
    return report


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

    def one(node: NodeRecord) -> dict[str, Any] | HostProblem:
        try:
            conn = connect(inv, node)
        except Exception as exc:  # noqa: BLE001 - e.g. an unreadable key file
            return HostProblem(f"{type(exc).__name__}: {exc}")
        try:
            return check_host(conn, inv, node, pyz=pyz, master=master,
                              master_port=master_port, record=record)
        except HostProblem as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - reported per host below
            return HostProblem(describe_login_error(exc, inv, node))
        finally:
            conn.close()

    nodes = sorted(inv.nodes, key=lambda n: n.rank)
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(nodes)))) as pool:
        outcomes = dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))

    problems: dict[str, list[str]] = {n.name: [] for n in nodes}
    reports: dict[str, dict[str, Any]] = {}
    for name, outcome in outcomes.items():
        if isinstance(outcome, HostProblem):
            problems[name].append(str(outcome))
        else:
            reports[name] = outcome
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
