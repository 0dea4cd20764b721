"""The tool's folder on the allocated nodes, made and removed in ONE job step over all nodes.

    ~/.mgpu-cloud/slurm/NAME  ->  $TMPDIR/mgpu-cloud-USER-NAME-JOBID   (a symlink, per node)

Homes on Slurm sites are usually shared: every node would unpack, write its pid file and
replace its workdir in the SAME folder at the same moment. The symlink resolves to a folder on
each node's own disk, so every path of RemoteLayout (home-relative, as the core spells them)
stays per node, shared home or not. The folder is made 0700 by its owner and refused when it
exists otherwise (a node's /tmp is shared with other users).

The same step reads each node's SSH host key (the job step is authenticated by Slurm, so the
key can be pinned for `--node-access ssh`), checks python3, counts the GPUs the step sees
(nvidia-smi), finds a container runtime (apptainer/singularity, for --image), and from node 0
tries SSH to another node (DeepSpeed's pdsh launcher needs it).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from provision.cluster.providers.slurm.login import LoginSession
from provision.cluster.providers.slurm.slurmcmd import SETUP_FAILED, srun_line
from provision.model.errors import ProvisionError

STOP_GRACE_S = 5
STEP_TIMEOUT_S = 120.0


def remote_root(cluster: str) -> str:
    """Our folder in the login user's home on every node (one per cluster)."""
    return f".mgpu-cloud/slurm/{cluster}"


@dataclass(frozen=True)
class PreparedNode:
    name: str
    python: str  # "3.11", or "" when python3 is missing
    host_key: str | None
    node_dir: str
    node_ssh: bool | None  # node 0 only: SSH to another node works
    gpus: int  # GPUs nvidia-smi lists in the job step (0: none, or no nvidia-smi)
    runtime: str  # "apptainer" | "singularity" | "" (none on PATH)


def prepare_script(cluster: str, job_id: str, node_dir: str | None,
                   other_node: str | None) -> str:
    q = shlex.quote
    root = remote_root(cluster)
    base = q(node_dir) if node_dir else '"${TMPDIR:-/tmp}"'
    probe_ssh = ""
    if other_node:
        probe_ssh = (f'if [ "${{SLURM_NODEID:-1}}" = 0 ]; then ssh -o BatchMode=yes '
                     f"-o ConnectTimeout=5 {q(other_node)} true </dev/null >/dev/null 2>&1 "
                     '&& s=yes || s=no; fi')
    return f"""n="${{SLURMD_NODENAME:-$(hostname)}}"
t={base}/mgpu-cloud-"$(id -un)"-{q(cluster)}-{q(job_id)}
if ! mkdir -m 700 "$t" 2>/dev/null; then
  if [ -L "$t" ] || [ ! -d "$t" ] || [ ! -O "$t" ]; then echo "E|$n|$t exists and is not ours"; exit 1; fi
fi
mkdir -p {q(root.rsplit("/", 1)[0])} || {{ echo "E|$n|cannot make ~/{root.rsplit("/", 1)[0]}"; exit 1; }}
if [ -e {q(root)} ] && [ ! -L {q(root)} ]; then echo "E|$n|~/{root} exists and is not our link"; exit 1; fi
for i in 1 2 3 4 5; do
  [ "$(readlink {q(root)})" = "$t" ] && break
  ln -sfn "$t" {q(root)} 2>/dev/null || sleep 0.2
done
if [ "$(readlink {q(root)})" != "$t" ]; then echo "E|$n|~/{root} points to $(readlink {q(root)}), not $t"; exit 1; fi
py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || py=
k=
for f in /etc/ssh/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ecdsa_key.pub /etc/ssh/ssh_host_rsa_key.pub; do
  if [ -r "$f" ]; then k=$(cut -d' ' -f1,2 "$f"); break; fi
done
g=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
r=
for c in apptainer singularity; do if command -v $c >/dev/null 2>&1; then r=$c; break; fi; done
s=
{probe_ssh}
echo "N|$n|$py|$k|$t|$s|${{g:-0}}|$r"
"""


def parse_prepared(output: str, expected: list[str]) -> list[PreparedNode]:
    """Lines of prepare_script -> PreparedNode per node (in `expected` order).
    ProvisionError naming every node that failed or did not answer."""
    found: dict[str, PreparedNode] = {}
    errors: dict[str, str] = {}
    for line in output.splitlines():
        parts = line.strip().split("|")
        if parts[0] == "E" and len(parts) >= 3:
            errors[parts[1]] = "|".join(parts[2:])
        elif parts[0] == "N" and len(parts) == 8:
            _, name, py, key, node_dir, ssh, gpus, runtime = parts
            found[name] = PreparedNode(name, py, key or None, node_dir,
                                       {"yes": True, "no": False}.get(ssh),
                                       int(gpus) if gpus.isdigit() else 0, runtime)
    for name in expected:
        if name in found and not found[name].python:
            errors[name] = "python3 is not on PATH (mgpu-cloud runs `python3 remote.pyz` there)"
        elif name not in found and name not in errors:
            errors[name] = "did not answer"
    if errors:
        detail = "\n  ".join(f"{n}: {why}" for n, why in sorted(errors.items()))
        raise ProvisionError(f"preparing {len(errors)} of {len(expected)} node(s) failed:\n  "
                             f"{detail}", hint="python3 must be on PATH on the nodes (the "
                             "slurm `setup` option can load a module or activate an env)")
    return [found[n] for n in expected]


def prepare(session: LoginSession, job_id: str, cluster: str, nodes: list[str],
            node_dir: str | None, setup: str | None) -> list[PreparedNode]:
    other = nodes[1] if len(nodes) > 1 else None
    script = prepare_script(cluster, job_id, node_dir, other)
    res = session.run(srun_line(job_id, None, script, setup=setup, nodes=len(nodes)),
                      timeout=STEP_TIMEOUT_S)
    if SETUP_FAILED in res.stderr:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip() and "srun:" not in ln]
        raise ProvisionError(f"the slurm setup line ({setup!r}) failed on the nodes: "
                             f"{' | '.join(dict.fromkeys(lines))}",
                             hint="fix `setup` in the slurm section; it runs in a job step "
                                  "on each node, like a batch script's first lines")
    try:
        return parse_prepared(res.stdout, nodes)
    except ProvisionError as exc:
        if res.stderr.strip():
            exc.message += f"\n  srun: {res.tail(5)}"
        raise


def cleanup_script(cluster: str, job_id: str, node_dirs: list[str], parents: list[str],
                   setup: str | None = None) -> str:
    """Stop our job, remove our node folder(s) and link, and the parents we made if empty.
    The site's setup line may fail here: removing files needs no python3."""
    q = shlex.quote
    root = remote_root(cluster)
    pyz, pid = f"{root}/remote.pyz", f"{root}/job.pid"
    lines = [f"{{ {setup}\n}} >/dev/null 2>&1" if setup else ":"]
    lines += [f"if [ -f {q(pid)} ] && [ -f {q(pyz)} ]; then python3 {q(pyz)} stop --pidfile "
             f"{q(pid)} --grace {STOP_GRACE_S} || true; fi"]
    lines += [f"rm -rf -- {q(d)}" for d in node_dirs]
    # what the link points to, when create failed before the folders were recorded
    lines.append(f"t=$(readlink {q(root)}); case \"$t\" in */mgpu-cloud-\"$(id -un)\"-{q(cluster)}"
                 f"-{q(job_id)}) rm -rf -- \"$t\";; esac")
    lines.append(f"if [ -L {q(root)} ]; then rm -f -- {q(root)}; fi")
    for parent in sorted(parents, key=len, reverse=True):
        lines.append(f"rmdir -- {q(parent)} 2>/dev/null || true")  # only when empty
    return "\n".join(lines) + "\nexit 0\n"


def cleanup_nodes(session: LoginSession, job_id: str, cluster: str, count: int,
                  node_dirs: list[str], parents: list[str],
                  setup: str | None) -> tuple[bool, str]:
    """On every node of the (running) allocation, in one step. (ok, why not)."""
    line = srun_line(job_id, None, cleanup_script(cluster, job_id, node_dirs, parents,
                                                   setup),
                     nodes=count)
    res = session.run(line, timeout=STEP_TIMEOUT_S)
    return res.exit_code == 0, res.tail()
