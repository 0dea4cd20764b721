"""A real Slurm cluster (Debian's slurmctld/slurmd/munge 22.05) in Docker, for the slurm
provider's tests. Made by the TESTS, never by the provider. Stdlib only, docker CLI.

One image for every role (emulation/Dockerfile, FROM the docker provider's node image; the
`slurm-acct` target adds slurmdbd + MariaDB for accounting):
    NAME-login    slurmctld (+ slurmdbd) + munged + sshd; SSH published on 127.0.0.1:<random>
    NAME-node1..  slurmd + munged + sshd; reachable only on the cluster's network
on a private bridge network NAME-net, with a shared /home volume NAME-home (as real sites have;
root's home is NOT shared, so tests logging in as root see per-node homes). Everything carries
the label mgpu-cloud.slurm-emu=NAME: `down(NAME)` and `leftovers()` find it by that.

Per cluster (all passed in environment variables, no bind mounts): a random munge key, an
ed25519 host key per node (`Cluster.host_keys`, all in every node's ssh_known_hosts), a key
pair for SSH between nodes, the caller's public key authorized for root and `user` (uid 1000).
Fake GPUs (`gpus=N`): GRES gpu:N per node backed by char devices the entrypoint makes (CPU
torch never opens them; Slurm sets CUDA_VISIBLE_DEVICES).

Measured on the 2-core build machines (see the provider's docs/slurm.md): image build 3 s
(+8.5 s for slurm-acct, once per node image), up 1.7 s (4.8-5.1 s with accounting), down 0.6 s.

    python tests/providers/slurm/slurm_emulation.py up NAME 2 [--accounting] [--gpus 2]
    python tests/providers/slurm/slurm_emulation.py down NAME
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import os
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "emulation"
LABEL = "mgpu-cloud.slurm-emu"
IMAGE_REPO = "mgpu-cloud/slurm"  # + "-acct" for the target with slurmdbd + MariaDB
CONTROLLER = "login"
PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _docker(*args: str, check: bool = True) -> str:
    p = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} ...: {p.stderr.strip()}")
    return p.stdout.strip()


# ----------------------------------------------------------------------------------- image
def build_image(base: str, *, accounting: bool = False, quiet: bool = True) -> str:
    """The Slurm node image on top of `base` (the node image), built once: its tag is a hash
    of the base image's id and the build inputs, so a changed node image or Dockerfile
    builds a new one and an unchanged one costs a `docker images -q`."""
    base_id = _docker("image", "inspect", "-f", "{{.Id}}", base)
    h = hashlib.sha256(base_id.encode())
    for f in ("Dockerfile", "slurm-entrypoint.sh"):
        h.update((HERE / f).read_bytes())
    tag = f"{IMAGE_REPO}{'-acct' if accounting else ''}:{h.hexdigest()[:12]}"
    if _docker("images", "-q", tag):
        return tag
    args = ["build", "--target", "slurm-acct" if accounting else "slurm",
            "--build-arg", f"NODE_IMAGE={base}", "--label", f"{LABEL}.image=1", "-t", tag,
            str(HERE)]
    if quiet:
        args.insert(1, "-q")
    p = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"building {tag} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return tag


# --------------------------------------------------------------------------------- cluster
@dataclasses.dataclass
class Cluster:
    name: str
    nodes: list[str]  # compute node names (= hostnames = Slurm NodeNames)
    ssh_host: str
    ssh_port: int
    image: str
    host_keys: dict[str, str]  # host -> "ssh-ed25519 AAAA..." (public)
    accounting: bool
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    def container(self, host: str = CONTROLLER) -> str:
        return f"{self.name}-{host}"

    def known_hosts_line(self) -> str:
        """The login node's key as the user's known_hosts would hold it."""
        return f"[{self.ssh_host}]:{self.ssh_port} {self.host_keys[CONTROLLER]}"

    def exec(self, cmd: str, user: str = "root", host: str = CONTROLLER, check: bool = True,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`bash -c cmd` on a node (default: the login node) as `user`, with a clean
        environment: a `docker exec` session would otherwise see the container's (munge key,
        private keys) and srun/sbatch would hand it on to jobs."""
        home = "/root" if user == "root" else f"/home/{user}"
        p = subprocess.run(
            ["docker", "exec", "-u", user, "-w", home, self.container(host), "env", "-i",
             f"HOME={home}", f"USER={user}", f"LOGNAME={user}", "LANG=C.UTF-8", f"PATH={PATH}",
             "bash", "-c", cmd],
            capture_output=True, text=True, timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise RuntimeError(f"{host}: {cmd!r} -> exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p


def _keypair(comment: str) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        k = os.path.join(d, "k")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", k],
                       check=True)
        return Path(k).read_text(), Path(k + ".pub").read_text().strip()


def host_resources() -> tuple[int, int]:
    """CPUs and RealMemory (MiB) as `slurmd -C` reports them in a container without limits."""
    with open("/proc/meminfo") as fh:
        mem_kb = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    return os.cpu_count() or 1, mem_kb // 1024


def render_conf(name: str, nodes: list[str], cpus: int, memory: int, gpus: int,
                accounting: bool) -> tuple[str, str | None]:
    tpl = string.Template((HERE / "slurm.conf.in").read_text())
    conf = tpl.substitute(
        cluster=name.replace("-", "_").lower()[:40], controller=CONTROLLER,
        nodelist=",".join(nodes), cpus=cpus, memory=memory, enforce="",
        gres_types="GresTypes=gpu\n" if gpus else "",
        gres=f" Gres=gpu:{gpus}" if gpus else "",
        accounting=(f"AccountingStorageType=accounting_storage/slurmdbd\n"
                    f"AccountingStorageHost={CONTROLLER}\n"
                    f"AccountingStorageEnforce=associations,limits,qos\n") if accounting
        else "AccountingStorageType=accounting_storage/none\n")
    files = "/dev/nvidia0" if gpus == 1 else f"/dev/nvidia[0-{gpus - 1}]"
    gres_conf = f"Name=gpu File={files}\n" if gpus else None
    return conf, gres_conf


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _ssh_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def up(name: str, nodes: int, pubkey: str, *, image: str, gpus: int = 0,
       accounting: bool = False, accounts: tuple[str, ...] = ("default", "research"),
       timeout: float = 90.0) -> Cluster:
    """Start the cluster; return once SSH answers and `sinfo` shows every node idle (and, with
    accounting, `accounts` exist for root and user, the first their default). On any failure
    everything made is removed before the error is raised."""
    t0 = time.monotonic()
    hosts = [f"node{i}" for i in range(1, nodes + 1)]
    cpus, memory = host_resources()
    conf, gres_conf = render_conf(name, hosts, cpus, memory, gpus, accounting)
    cluster_priv, cluster_pub = _keypair(f"{name}-cluster")
    keys = {h: _keypair(h) for h in [CONTROLLER, *hosts]}
    common = {
        "SLURM_CONF_B64": _b64(conf), "MUNGE_KEY_B64": _b64(os.urandom(1024)),
        "MGPU_AUTHORIZED_KEY": f"{pubkey.strip()}\n{cluster_pub}",
        "CLUSTER_SSH_KEY": cluster_priv,
        "KNOWN_HOSTS": "\n".join(f"{h} {pub.rsplit(' ', 1)[0]}" for h, (_, pub) in keys.items()),
    }
    if gres_conf:
        common.update(GRES_CONF_B64=_b64(gres_conf), FAKE_GPUS=str(gpus))
    label = f"{LABEL}={name}"
    try:
        _docker("network", "create", "--label", label, f"{name}-net")
        _docker("volume", "create", "--label", label, f"{name}-home")
        procs = []
        for h in [CONTROLLER, *hosts]:
            role = "controller" if h == CONTROLLER else "compute"
            env = dict(common, SLURM_ROLE=role, MGPU_HOST_KEY=keys[h][0], HOST_PUBKEY=keys[h][1])
            if accounting and role == "controller":
                env["SLURM_ACCOUNTING"] = "1"
            args = ["run", "-d", "--init", "--name", f"{name}-{h}", "--hostname", h,
                    "--network", f"{name}-net", "--network-alias", h, "--label", label,
                    "--label", f"{LABEL}.role={role}", "-v", f"{name}-home:/home"]
            if role == "controller":
                args += ["-p", "127.0.0.1::22"]
            for k in env:
                args += ["-e", k]  # values from the environment: never on a command line
            procs.append(subprocess.Popen(["docker", *args, image], env={**os.environ, **env},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
            # The controller's container is made before the others: the engine copies the
            # image's /home into the new, empty volume when the first container mounts it, and
            # two containers doing that at once can fail ("failed to mkdir
            # .../_data/user: file exists"; seen in a full run). Once it holds the copy, the
            # engine copies no more, so the compute nodes start together.
            if role == "controller" and procs[0].wait() != 0:
                break
        errors = [p.communicate()[1].strip() for p in procs if p.wait() != 0]
        if errors:
            raise RuntimeError("docker run failed: " + "; ".join(errors))
        port = int(_docker("port", f"{name}-{CONTROLLER}", "22").splitlines()[0]
                   .rsplit(":", 1)[1])
        cluster = Cluster(name, hosts, "127.0.0.1", port, image,
                          {h: " ".join(pub.split()[:2]) for h, (_, pub) in keys.items()},
                          accounting)
        _wait_ready(cluster, nodes, timeout)
        cluster.timings["ready_s"] = round(time.monotonic() - t0, 2)
        if accounting:
            acc = ",".join(accounts)
            cluster.exec(f"sacctmgr -i add account {acc} Description=test Organization=test "
                         f">/dev/null && sacctmgr -i add user user,root "
                         f"DefaultAccount={accounts[0]} Account={acc} >/dev/null")
        cluster.timings["up_s"] = round(time.monotonic() - t0, 2)
        return cluster
    except BaseException:
        down(name)
        raise


def _wait_ready(cluster: Cluster, nodes: int, timeout: float) -> None:
    """Poll (never sleep a fixed time): SSH answers and every node is idle in `debug`."""
    deadline = time.monotonic() + timeout
    ssh = idle = False
    while not (ssh and idle):
        ssh = ssh or _ssh_ready(cluster.ssh_port)
        if not idle:
            p = cluster.exec("sinfo -h -p debug -o '%D %t'", check=False, timeout=10)
            idle = p.returncode == 0 and f"{nodes} idle" in p.stdout.splitlines()
        if time.monotonic() > deadline:
            log = cluster.exec("tail -20 /var/log/slurm/slurmctld.log; sinfo",
                               check=False).stdout
            raise TimeoutError(f"emulated Slurm cluster {cluster.name} not ready in "
                               f"{timeout:.0f} s (ssh={ssh}, idle={idle}):\n{log}")
        if not (ssh and idle):
            time.sleep(0.2)


def _labelled(kind: str, name: str | None) -> list[str]:
    flt = f"label={LABEL}={name}" if name else f"label={LABEL}"
    if kind == "container":
        return _docker("ps", "-aq", "--filter", flt).split()
    return _docker(kind, "ls", "-q", "--filter", flt).split()


def down(name: str) -> None:
    """Remove the cluster's containers, network and volume (found by label). Idempotent."""
    ids = _labelled("container", name)
    if ids:
        _docker("rm", "-f", "-v", *ids)
    for net in _labelled("network", name):
        _docker("network", "rm", net)
    for vol in _labelled("volume", name):
        _docker("volume", "rm", "-f", vol)


def leftovers(name: str | None = None) -> dict[str, list[str]]:
    """What is still there of cluster `name` (default: of any emulated cluster)."""
    return {k: _labelled(k, name) for k in ("container", "network", "volume")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start a cluster; prints JSON (a key pair is made)")
    u.add_argument("name")
    u.add_argument("nodes", type=int)
    u.add_argument("--base", default=None, help="node image (default: newest mgpu-cloud/node)")
    u.add_argument("--gpus", type=int, default=0)
    u.add_argument("--accounting", action="store_true")
    d = sub.add_parser("down", help="remove a cluster")
    d.add_argument("name")
    a = ap.parse_args(argv)
    if a.cmd == "down":
        down(a.name)
        return 0
    base = a.base or _docker("images", "mgpu-cloud/node", "--format",
                             "{{.Repository}}:{{.Tag}}").splitlines()[0]
    image = build_image(base, accounting=a.accounting)
    key_dir = Path(tempfile.mkdtemp(prefix=f"slurmemu-{a.name}-"))
    priv, pub = _keypair(f"{a.name}-user")
    (key_dir / "id_ed25519").write_text(priv)
    os.chmod(key_dir / "id_ed25519", 0o600)
    c = up(a.name, a.nodes, pub, image=image, gpus=a.gpus, accounting=a.accounting)
    print(json.dumps({**dataclasses.asdict(c), "key_file": str(key_dir / "id_ed25519")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
