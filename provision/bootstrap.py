"""Prepare every node at once over SSH (Fabric), reporting every failing node, not the first.

Per node, in one thread each: wait for SSH (backoff, deadline) -> wait for the GPU driver
(cloud nodes) -> upload remote.pyz -> hostfile -> /etc/hosts (cloud) -> inter-node SSH trust
-> pull the training container (when set) -> sync the workdir (when a job is given).

Remote layout (relative to the login user's home):
    .mgpu-cloud/remote.pyz  .mgpu-cloud/hostfile  .mgpu-cloud/work/  .mgpu-cloud/outputs/
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import shlex
import tarfile
import tempfile
import time
import zipapp
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from provision.assets import remote_package_dir
from provision.errors import BootstrapError
from provision.inventory import Inventory, InventoryStore, NodeRecord
from provision.render import render
from provision.spec import JobSpec
from provision.sshconn import UnknownHostKeyError, connect, write_cluster_known_hosts

Log = Callable[[str], None]
SSH_DEADLINE_S = float(os.environ.get("MGPU_CLOUD_SSH_DEADLINE", "180"))
GPU_DEADLINE_S = float(os.environ.get("MGPU_CLOUD_GPU_DEADLINE", "600"))


@dataclass
class NodeResult:
    """Fabric GroupResult-style outcome for one node."""

    node: str
    ok: bool
    error: str = ""


def remote_path(inv: Inventory, *parts: str) -> str:
    return "/".join([inv.remote_root, *parts])


@cache
def remote_zipapp() -> bytes:
    """The `remote` package as a zipapp (`python3 remote.pyz COMMAND`)."""
    src = remote_package_dir()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "stage"
        (stage / "remote").mkdir(parents=True)
        for f in src.glob("*.py"):
            (stage / "remote" / f.name).write_bytes(f.read_bytes())
        (stage / "__main__.py").write_text("from remote.cli import main\nraise SystemExit(main())\n")
        out = Path(tmp) / "remote.pyz"
        zipapp.create_archive(stage, out)
        return out.read_bytes()


def workdir_tar(root: Path, excludes: list[str]) -> bytes:
    """A gzip tar of `root` without paths whose any component matches an exclude pattern."""

    def excluded(rel: str) -> bool:
        return any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in excludes)

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames
                                 if not excluded(os.path.normpath(os.path.join(rel_dir, d))))
            for name in sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if not excluded(rel):
                    tar.add(os.path.join(dirpath, name), arcname=rel, recursive=False)
    return buf.getvalue()


def _run(conn: Any, cmd: str, what: str) -> str:
    res = conn.run(cmd, hide=True, warn=True, in_stream=False)
    if res.exited != 0:
        detail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed (exit {res.exited}): {' | '.join(detail)}")
    return str(res.stdout)


def wait_for_ssh(conn: Any, deadline_s: float = SSH_DEADLINE_S) -> None:
    """Open the connection, retrying with exponential backoff until the deadline.

    A host key that does not match the pinned one is not retried: it is an error at once.
    """
    import paramiko
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

    def transient(exc: BaseException) -> bool:
        if isinstance(exc, paramiko.BadHostKeyException | paramiko.AuthenticationException
                      | UnknownHostKeyError):
            return False
        return isinstance(exc, OSError | paramiko.SSHException | EOFError)

    for attempt in Retrying(
        retry=retry_if_exception(transient),
        # Short waits: sshd in a fresh node answers within a second or two, and every
        # oversleep here adds to `up` directly.
        wait=wait_exponential_jitter(initial=0.05, max=0.5, jitter=0.05),
        stop=stop_after_delay(deadline_s),
        reraise=True,
    ):
        with attempt:
            try:
                conn.open()
            except BaseException:
                conn.close()
                raise


def wait_for_gpu(conn: Any, deadline_s: float = GPU_DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while True:
        if conn.run("nvidia-smi -L", hide=True, warn=True, in_stream=False).exited == 0:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"nvidia-smi did not answer within {deadline_s:.0f} s")
        time.sleep(5)


def _managed_block_sed(cluster: str) -> str:
    """sed expression deleting the block this tool wrote for `cluster` (cluster names are
    [a-z0-9-], so they need no regex escaping)."""
    return f"/^# >>> mgpu-cloud {cluster} >>>$/,/^# <<< mgpu-cloud {cluster} <<<$/d"


def _ssh_trust_files(inv: Inventory) -> tuple[dict[str, tuple[bytes, int]], str]:
    """Files (home-relative path -> (data, mode)) and the shell line that make nodes reach
    each other by name with the cluster key and pinned host keys (DeepSpeed/pdsh)."""
    q = shlex.quote
    hosts: list[str] = []
    known: list[str] = []
    for n in inv.nodes:
        names = [n.name] if n.name == n.private_address else [n.name, n.private_address]
        hosts.extend(names)
        if n.host_key:
            known.append(f"{','.join(names)} {n.host_key}")
    block = render("ssh_config.j2", cluster=inv.name, hosts=hosts)
    files = {
        f".ssh/mgpu-cloud_{inv.name}_ed25519": (Path(inv.key_path or "").read_bytes(), 0o600),
        f".ssh/mgpu-cloud_{inv.name}_known_hosts": (("\n".join(known) + "\n").encode(), 0o600),
        remote_path(inv, "ssh_config"): (block.encode(), 0o600),
    }
    pub = Path(inv.key_path or "").with_suffix(".pub").read_text().strip()
    # Our block goes first in ~/.ssh/config (first match wins), replacing an older one; the
    # cluster key is authorized for node-to-node logins.
    script = (
        f"touch ~/.ssh/config ~/.ssh/authorized_keys && "
        f"chmod 600 ~/.ssh/config ~/.ssh/authorized_keys && "
        f"sed -e {q(_managed_block_sed(inv.name))} ~/.ssh/config > ~/.ssh/config.mgpu && "
        f"cat {q(remote_path(inv, 'ssh_config'))} ~/.ssh/config.mgpu > ~/.ssh/config && "
        f"rm -f ~/.ssh/config.mgpu && "
        f"(grep -qxF {q(pub)} ~/.ssh/authorized_keys || echo {q(pub)} >> ~/.ssh/authorized_keys)"
    )
    return files, script


def _etc_hosts_files(inv: Inventory) -> tuple[dict[str, tuple[bytes, int]], str]:
    q = shlex.quote
    lines = "".join(f"{n.private_address} {n.name}\n" for n in inv.nodes)
    block = f"# >>> mgpu-cloud {inv.name} >>>\n{lines}# <<< mgpu-cloud {inv.name} <<<\n"
    staged = remote_path(inv, "hosts_block")
    inner = f"sed -i {q(_managed_block_sed(inv.name))} /etc/hosts && cat {q(staged)} >> /etc/hosts"
    return {staged: (block.encode(), 0o644)}, f"sudo -n sh -c {q(inner)}"


def files_tar(files: dict[str, tuple[bytes, int]], workdir: bytes | None, work: str) -> bytes:
    """One gzip tar of home-relative files (+ the workdir's files under `work`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path, (data, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        if workdir is not None:
            with tarfile.open(fileobj=io.BytesIO(workdir), mode="r:gz") as src:
                for member in src.getmembers():
                    fh = src.extractfile(member) if member.isfile() else None
                    member.name = f"{work}/{member.name}"
                    tar.addfile(member, fh)
    return buf.getvalue()


def deepspeed_config(job: JobSpec, gpus: bool) -> bytes:
    """The user's --deepspeed-config file, or the shipped template (ZeRO-1, AdamW)."""
    if job.deepspeed_config:
        return Path(job.deepspeed_config).read_bytes()
    return render("deepspeed/ds_config.json.j2", micro_batch=16, grad_accum=1, lr=1e-3,
                  zero_stage=1, bf16=gpus).encode()


def _payload(
    inv: Inventory, files: dict[str, tuple[bytes, int]], job: JobSpec | None
) -> tuple[bytes, list[str]]:
    """One archive (files + the job's workdir and DeepSpeed config) and the shell steps that
    unpack it on a node, replacing the previous workdir. Used by bootstrap and by launch."""
    q = shlex.quote
    files = dict(files)
    if job is not None and job.launcher == "deepspeed":
        files[remote_path(inv, "ds_config.json")] = (deepspeed_config(job, inv.wait_for_gpu),
                                                     0o644)
    workdir = workdir_tar(job.local_workdir, job.excludes) if job else None
    archive = files_tar(files, workdir, remote_path(inv, "work"))
    steps = [f"rm -rf {q(remote_path(inv, 'work'))}",
             f"mkdir -p {q(remote_path(inv, 'outputs'))} {q(remote_path(inv, 'work'))} ~/.ssh",
             "chmod 700 ~/.ssh",
             "tar -xzf - -C ~ --no-same-owner"]  # the archive, on stdin
    return archive, steps


def _upload_and_run(conn: Any, archive: bytes, steps: list[str]) -> None:
    """ONE channel per node: the archive goes to the command's stdin, where the steps' `tar`
    reads it (no SFTP session and its round trips, no copy on the node's disk)."""
    command = " && ".join(steps)
    conn.open()
    chan = conn.client.get_transport().open_session()
    try:
        chan.set_combine_stderr(True)
        chan.exec_command(command)
        with contextlib.suppress(OSError, EOFError):  # a command that fails early stops reading
            chan.sendall(archive)
            chan.shutdown_write()
        output = chan.makefile("rb").read().decode(errors="replace")
        code = chan.recv_exit_status()
    finally:
        chan.close()
    if code != 0:
        detail = " | ".join(output.strip().splitlines()[-3:])
        raise RuntimeError(f"unpacking the uploaded files failed (exit {code}): {detail}")


def for_each_node(
    inv: Inventory, step: Callable[[Any, NodeRecord], None], what: str
) -> list[NodeResult]:
    """Run `step(conn, node)` on all nodes in parallel; BootstrapError naming EVERY failed node."""

    def one(node: NodeRecord) -> NodeResult:
        conn = connect(inv, node)
        try:
            step(conn, node)
            return NodeResult(node.name, True)
        except Exception as exc:  # noqa: BLE001 - reported per node below
            return NodeResult(node.name, False, f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(inv.nodes)))) as pool:
        results = list(pool.map(one, inv.nodes))
    failed = [r for r in results if not r.ok]
    if failed:
        detail = "\n  ".join(f"{r.node}: {r.error}" for r in failed)
        raise BootstrapError(
            f"{what} failed on {len(failed)} of {len(results)} node(s):\n  {detail}",
            hint="`mgpu-cloud status` shows the nodes; `mgpu-cloud ssh NAME --node R` to look",
        )
    return results


def bootstrap_cluster(
    inv: Inventory, store: InventoryStore, *, job: JobSpec | None = None, log: Log = print
) -> list[NodeResult]:
    """Prepare every node: per node ONE upload (a tar of everything) and ONE command, after
    SSH answers (and the GPU driver, on GPU nodes). Reports every failing node."""
    write_cluster_known_hosts(inv, store)
    q = shlex.quote
    files: dict[str, tuple[bytes, int]] = {
        remote_path(inv, "remote.pyz"): (remote_zipapp(), 0o644),
        remote_path(inv, "hostfile"): (render("hostfile.j2", nodes=inv.nodes).encode(), 0o644),
    }
    extra: list[str] = []
    for enabled, builder in ((inv.inter_node_ssh, _ssh_trust_files),
                             (inv.manage_etc_hosts, _etc_hosts_files)):
        if enabled:
            more, line = builder(inv)
            files.update(more)
            extra.append(line)
    archive, steps = _payload(inv, files, job)
    steps += extra

    def step(conn: Any, node: NodeRecord) -> None:
        wait_for_ssh(conn)
        if inv.wait_for_gpu:
            wait_for_gpu(conn)
        _upload_and_run(conn, archive, steps)
        if inv.container_image:
            _run(conn, f"sudo -n docker pull {q(inv.container_image)}", "pulling the container")

    t0 = time.monotonic()
    results = for_each_node(inv, step, "bootstrap")
    inv.bootstrapped = True
    store.save(inv)
    log(f"bootstrapped {len(results)} node(s) in {time.monotonic() - t0:.1f} s")
    return results


def sync_workdir(inv: Inventory, store: InventoryStore, job: JobSpec, *, log: Log = print) -> None:
    """Copy the job's workdir (and DeepSpeed config) to every node, replacing the previous one."""
    archive, steps = _payload(inv, {}, job)
    for_each_node(inv, lambda conn, node: _upload_and_run(conn, archive, steps), "workdir sync")
    log(f"synced {job.local_workdir} ({len(archive) / 1024:.0f} KiB) to {len(inv.nodes)} node(s)")
