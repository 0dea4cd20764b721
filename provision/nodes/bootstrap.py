"""Prepare every node at once through the NodeGroup, reporting every failing node.

Per node, in one step each: wait for SSH (backoff, deadline) -> wait for the GPU driver (cloud
nodes) -> ONE upload of a tar (remote.pyz, hostfile, node-to-node SSH files, the workdir, the
launcher's files) unpacked by ONE command -> the training container (when set): the pull a
cloud node began at boot (waited for when a job is about to use it), else pulled here.
Paths on the node come from nodes.RemoteLayout.
"""

from __future__ import annotations

import io
import os
import py_compile
import shlex
import tarfile
import tempfile
import time
import zipapp
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from provision.model.assets import remote_package_dir, templates_dir
from provision.model.errors import BootstrapError, LaunchError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.logsink import Log
from provision.model.render import render
from provision.model.timeline import reached
from provision.nodes import (
    GroupResult,
    NodeConnection,
    NodeGroup,
    NodeStepError,
    RemoteLayout,
    borrowed,
    layout_of,
    poll,
    retry_open,
)
from provision.nodes.layout import Files

SSH_DEADLINE_S = float(os.environ.get("MGPU_CLOUD_SSH_DEADLINE", "180"))
GPU_DEADLINE_S = float(os.environ.get("MGPU_CLOUD_GPU_DEADLINE", "600"))


@dataclass(frozen=True)
class Workdir:
    """What a job brings to every node: its local folder (without the `excludes` patterns),
    placed as the node's work/ folder, and extra home-relative files (its launcher's)."""

    local: Path
    excludes: list[str] = field(default_factory=list)
    files: Files = field(default_factory=dict)


@cache
def remote_zipapp() -> bytes:
    """The `remote` package as a zipapp (`python3 remote.pyz COMMAND`), every module with its
    bytecode beside it. zipimport cannot write bytecode, so without it every command on a
    node compiled the modules it imports from source, again each time: `job status` 43 ->
    33 ms of node CPU, `ckpt-manifest` 18 -> 16 (a node container, 40 calls each), thousands
    of calls per test suite, every rank of a gated job included. The bytecode is this
    python's and checked against its source (PEP 552 checked-hash .pyc): a node whose python
    differs (another magic number) or a source that differs from it imports the source, as
    before (zipimport skips a .pyc it refuses). Unoptimised whatever this python's -O: a node's
    help texts are docstrings. Tracebacks name `remote.pyz/remote/NAME.py`."""
    src = remote_package_dir()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "stage"
        (stage / "remote").mkdir(parents=True)
        for f in src.glob("*.py"):
            (stage / "remote" / f.name).write_bytes(f.read_bytes())
            py_compile.compile(str(stage / "remote" / f.name),
                               cfile=str(stage / "remote" / f"{f.stem}.pyc"),
                               dfile=f"remote.pyz/remote/{f.name}", doraise=True, optimize=0,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        (stage / "__main__.py").write_text("from remote.cli import main\nraise SystemExit(main())\n")
        out = Path(tmp) / "remote.pyz"
        zipapp.create_archive(stage, out)
        return out.read_bytes()


def files_tar(files: Files, workdir: bytes | None, work: str) -> bytes:
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


def _managed_block_sed(cluster: str) -> str:
    """sed expression deleting the block this tool wrote for `cluster` (cluster names are
    [a-z0-9-], so they need no regex escaping)."""
    return f"/^# >>> mgpu-cloud {cluster} >>>$/,/^# <<< mgpu-cloud {cluster} <<<$/d"


def _ssh_trust_files(inv: Inventory, layout: RemoteLayout) -> tuple[Files, str]:
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
    staged = layout.path("ssh_config")
    files = {
        f".ssh/mgpu-cloud_{inv.name}_ed25519": (Path(inv.key_path or "").read_bytes(), 0o600),
        f".ssh/mgpu-cloud_{inv.name}_known_hosts": (("\n".join(known) + "\n").encode(), 0o600),
        staged: (block.encode(), 0o600),
    }
    pub = Path(inv.key_path or "").with_suffix(".pub").read_text().strip()
    # Our block goes first in ~/.ssh/config (first match wins), replacing an older one; the
    # cluster key is authorized for node-to-node logins.
    script = (
        f"touch ~/.ssh/config ~/.ssh/authorized_keys && "
        f"chmod 600 ~/.ssh/config ~/.ssh/authorized_keys && "
        f"sed -e {q(_managed_block_sed(inv.name))} ~/.ssh/config > ~/.ssh/config.mgpu && "
        f"cat {q(staged)} ~/.ssh/config.mgpu > ~/.ssh/config && "
        f"rm -f ~/.ssh/config.mgpu && "
        f"(grep -qxF {q(pub)} ~/.ssh/authorized_keys || echo {q(pub)} >> ~/.ssh/authorized_keys)"
    )
    return files, script


def _etc_hosts_files(inv: Inventory, layout: RemoteLayout) -> tuple[Files, str]:
    q = shlex.quote
    lines = "".join(f"{n.private_address} {n.name}\n" for n in inv.nodes)
    block = f"# >>> mgpu-cloud {inv.name} >>>\n{lines}# <<< mgpu-cloud {inv.name} <<<\n"
    staged = layout.path("hosts_block")
    # Rewritten in place, not renamed over (sed -i): a container's /etc/hosts is a file the
    # engine bind-mounts, which a rename cannot replace. Root (docker nodes) needs no sudo.
    inner = (f"sed {q(_managed_block_sed(inv.name))} /etc/hosts > /etc/hosts.mgpu && "
             f"cat /etc/hosts.mgpu {q(staged)} > /etc/hosts && rm -f /etc/hosts.mgpu")
    as_root = f"sh -c {q(inner)}"
    return ({staged: (block.encode(), 0o644)},
            f'if [ "$(id -u)" = 0 ]; then {as_root}; else sudo -n {as_root}; fi')


def _peer_pieces(inv: Inventory, layout: RemoteLayout) -> tuple[Files, list[str]]:
    """What makes nodes know each other: node-to-node SSH (cluster key, pinned host keys)
    and names in /etc/hosts, where the inventory asks for them."""
    files: Files = {}
    lines: list[str] = []
    for enabled, builder in ((inv.inter_node_ssh, _ssh_trust_files),
                             (inv.manage_etc_hosts, _etc_hosts_files)):
        if enabled:
            more, line = builder(inv, layout)
            files.update(more)
            lines.append(line)
    return files, lines


def refresh_peers(inv: Inventory, store: InventoryStore, group: NodeGroup) -> None:
    """After nodes were replaced: the group's nodes learn the new host keys and addresses
    (node-to-node SSH, /etc/hosts) and the hostfile (a spare that took a rank may keep a
    name of its own: a Slurm host). BootstrapError names every node where it failed."""
    from provision.nodes.sshconn import write_cluster_known_hosts  # paramiko: see _ssh_stack

    write_cluster_known_hosts(inv, store)
    layout = layout_of(inv)
    files, lines = _peer_pieces(inv, layout)
    files[layout.hostfile] = (render("hostfile.j2", nodes=inv.nodes).encode(), 0o644)
    steps = ["mkdir -p ~/.ssh", "chmod 700 ~/.ssh", "tar -xzf - -C ~ --no-same-owner", *lines]
    group.upload(files_tar(files, None, layout.work), steps).raise_for(
        "updating the other nodes", BootstrapError)


def payload(inv: Inventory, files: Files, workdir: Workdir | None,
            log: Log | None = None) -> tuple[bytes, list[str]]:
    """One archive (files + the job's workdir and its extra files) and the shell steps that
    unpack it on a node, replacing the previous workdir. Used by bootstrap and launch. The
    workdir goes through shipping.workdir_archive (the state folder and keys stay here;
    `log` hears what was left out)."""
    from provision.nodes.shipping import workdir_archive

    q = shlex.quote
    layout = layout_of(inv)
    files = dict(files)
    tree = None
    if workdir is not None:
        files.update(workdir.files)
        tree = workdir_archive(workdir.local, workdir.excludes, inv, log)
    archive = files_tar(files, tree, layout.work)
    steps = [f"rm -rf {q(layout.work)}",
             f"mkdir -p {q(layout.outputs)} {q(layout.work)} {q(layout.checkpoints)} ~/.ssh",
             "chmod 700 ~/.ssh",
             "tar -xzf - -C ~ --no-same-owner"]  # the archive, on stdin
    return archive, steps


EGRESS_TIMEOUT_S = 10


def registry_of(image: str) -> str:
    """The registry host an image is pulled from ("nvcr.io/nvidia/pytorch:x" -> nvcr.io;
    "ubuntu:22.04" -> Docker Hub)."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first.split(":", 1)[0]
    return "registry-1.docker.io"


def egress_probe(image: str) -> str:
    """A shell line that succeeds only when this node resolves and reaches the image's
    registry on 443 within EGRESS_TIMEOUT_S (no curl needed: bash's /dev/tcp)."""
    host = shlex.quote(registry_of(image))
    return (f"getent hosts {host} >/dev/null && timeout {EGRESS_TIMEOUT_S} "
            f"bash -c {shlex.quote(f'exec 3<>/dev/tcp/{registry_of(image)}/443')}")


def _checked(res: object, what: str) -> None:
    from provision.nodes import CommandResult

    if isinstance(res, CommandResult) and not res.ok:
        raise NodeStepError(f"{what} failed (exit {res.exit_code}): {res.tail()}")


def bootstrap_cluster(
    inv: Inventory, store: InventoryStore, *, workdir: Workdir | None = None, log: Log = print,
    group: NodeGroup | None = None, wait_image: bool = True,
) -> GroupResult[None]:
    """Prepare every node: per node ONE upload (a tar of everything) and ONE command, after
    SSH answers (and the GPU driver, on GPU nodes); then the training image (an image the node
    began pulling at boot is waited for only when `wait_image`: a job is about to use it).
    BootstrapError names every failing node. The open timeline (provision/model/timeline.py)
    gets the parts "ssh answers" and "image present" of its bootstrap phase."""
    from provision.nodes.sshconn import write_cluster_known_hosts  # paramiko: see _ssh_stack

    write_cluster_known_hosts(inv, store)
    layout = layout_of(inv)
    files: Files = {
        layout.pyz: (remote_zipapp(), 0o644),
        layout.hostfile: (render("hostfile.j2", nodes=inv.nodes).encode(), 0o644),
        f"{layout.python_path}/sitecustomize.py": (
            (templates_dir() / "node" / "sitecustomize.py").read_bytes(), 0o644),
    }
    peer_files, extra = _peer_pieces(inv, layout)
    files.update(peer_files)
    archive, steps = payload(inv, files, workdir, log)
    command = " && ".join(steps + extra)
    answered: dict[str, float] = {}  # node -> unix time SSH answered
    present: dict[str, float] = {}  # node -> unix time the image was there

    def step(conn: NodeConnection, node: NodeRecord) -> None:
        retry_open(conn, SSH_DEADLINE_S)
        answered[node.name] = time.time()
        if inv.wait_for_gpu and not poll(lambda: conn.run("nvidia-smi -L").ok, GPU_DEADLINE_S):
            raise NodeStepError(f"nvidia-smi did not answer within {GPU_DEADLINE_S:.0f} s")
        _checked(conn.run(command, stdin=archive), "unpacking the uploaded files")
        if inv.container_image and _image_on(conn, inv.container_image, wait_image):
            present[node.name] = time.time()

    t0 = time.monotonic()
    with borrowed(inv, group) as nodes:
        results = nodes.each(step)
    for phase, times in (("ssh answers", answered), ("image present", present)):
        if times:
            last = max(times, key=lambda n: times[n])
            reached(inv, phase, part_of="bootstrap", at=times[last],
                    detail=f"{len(times)} node(s), the last {last}")
    results.raise_for("bootstrap", BootstrapError)
    inv.bootstrapped = True
    store.save(inv)
    log(f"bootstrapped {len(results)} node(s) in {time.monotonic() - t0:.1f} s")
    return results


# The pull a cloud node starts at boot (templates/node/image-pull.sh.j2, from the AWS user
# data and the GCP startup script): STARTED holds the image's name, DONE "ok" or why not.
BOOT_PULL_STARTED = "/var/lib/mgpu-cloud/image-pull.started"
BOOT_PULL_DONE = "/var/lib/mgpu-cloud/image-pull.done"
BOOT_PULL_WAIT_S = float(os.environ.get("MGPU_CLOUD_PULL_DEADLINE", "1800"))


def boot_pull(image: str | None) -> dict[str, object]:
    """What templates/node/image-pull.sh.j2 needs (image None: no pull at boot)."""
    return {"image": image, "started": BOOT_PULL_STARTED, "done": BOOT_PULL_DONE,
            "script": "/var/lib/mgpu-cloud/image-pull.sh",
            "log": "/var/log/mgpu-cloud-image-pull.log", "retry_s": 15}


def boot_pull_probe(image: str, wait: bool) -> str:
    """A shell line printing "ok" / "failed ..." (the boot pull ended; `wait`: after waiting
    up to BOOT_PULL_WAIT_S for it), "pulling" (not waited for), or nothing (no boot pull of
    `image` on this node)."""
    q = shlex.quote
    done = f"until [ -s {q(BOOT_PULL_DONE)} ]; do sleep 1; done"
    then = (f"timeout {BOOT_PULL_WAIT_S:.0f} sh -c {q(done)}; cat {q(BOOT_PULL_DONE)}" if wait
            else f"cat {q(BOOT_PULL_DONE)} 2>/dev/null || echo pulling")
    return (f"if [ -f {q(BOOT_PULL_STARTED)} ] && grep -qxF {q(image)} "
            f"{q(BOOT_PULL_STARTED)}; then {then}; fi")


def _image_on(conn: NodeConnection, image: str, wait: bool) -> bool:
    """Make sure `image` is on the node (or, not `wait`, on its way there); True when it is
    there now. A boot pull that ended well is used; one still running is waited for only when
    `wait`; otherwise (none, failed, timed out) the image is pulled here, after checking that
    the node reaches its registry at all."""
    state = conn.run(boot_pull_probe(image, wait)).stdout.strip()
    if state == "ok":
        return True
    if state == "pulling" and not wait:
        return False
    # A node without a way out (no public address, no NAT) is named here, before a pull that
    # would fail or hang on it.
    if not conn.run(egress_probe(image)).ok:
        raise NodeStepError(
            f"no path to the internet: {registry_of(image)}:443 cannot be reached within "
            f"{EGRESS_TIMEOUT_S} s (needed to pull {image}; see docs/clouds.md)")
    _checked(conn.run(f"sudo -n docker pull {shlex.quote(image)}"), "pulling the container")
    return True


JOB_RUNNING = 75  # `remote.pyz job idle`: a job still runs on the node (remote/jobs.py BUSY)


def sync_workdir(inv: Inventory, workdir: Workdir, *, log: Log = print,
                 group: NodeGroup | None = None) -> None:
    """Copy the job's workdir (and its launcher's files) to every node, replacing the
    previous one. Each node first checks that no job runs there (whoever started it): files
    are never replaced under a running job; LaunchError names the busy nodes, and nothing is
    replaced on them. BootstrapError names every other node where it failed."""
    layout = layout_of(inv)
    archive, steps = payload(inv, {}, workdir, log)
    guard = layout.remote_command("job", "idle", "--pidfile", layout.pidfile)
    with borrowed(inv, group) as nodes:
        results = nodes.upload(archive, [guard, *steps])
    busy = [r.node.name for r in results.failed
            if r.value is not None and r.value.exit_code == JOB_RUNNING]
    if busy:
        raise LaunchError(
            f"a job is still running on {', '.join(busy)}: its workdir was not replaced",
            hint=f"`mgpu-cloud jobs {inv.name}` lists the jobs; wait for it, or stop it with "
                 f"`mgpu-cloud cancel {inv.name} ID`")
    results.raise_for("workdir sync", BootstrapError)
    log(f"synced {workdir.local} ({len(archive) / 1024:.0f} KiB) to {len(inv.nodes)} node(s)")
