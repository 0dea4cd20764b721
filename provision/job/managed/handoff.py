"""The user's side of a managed run: make the controller, give it the job, return once it runs.

    Controller                  the supervision (provision/job/supervision.py) of `--detach`
                                on a cluster with a store; provision/job/lifecycle.start runs
                                it like any other:
      check                     the store (reachable, writable, credentials for the nodes),
                                a provider that can make a controller, MGPU_RESUME_FROM, no
                                managed job running: before anything is made
      start                     the nodes' store SDK checked, then hand_off (teardown=True
                                for `run --detach --store`, whose controller removes the
                                cluster; False for `launch --detach`) -> the job id

hand_off: the controller is created the first time (Supervising.create_controller, recorded
in the inventory), gets ONE upload (the tool's code as installed here, the inventory, the
cluster key, the job's workdir and spec, the store's environment 0600), and starts
`provision.job.managed.supervisor` under the node-side job supervisor (remote.pyz job start),
detached. The CLI then waits for the job's `started` record in the store (or a failure) and
returns: from then on nothing runs on this machine.

    down (a cluster with a controller)    stop_before_down: a live managed job is cancelled
                                          through the store and its supervisor seen to end
                                          before any node is removed (no replacement races
                                          the teardown); the provider then removes the
                                          controller before the nodes
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from provision.cluster.providers.contract import AnyProvider, Supervising
from provision.job.managed.records import (
    RESUME_VAR,
    JobView,
    claim_job_id,
)
from provision.job.managed.signing import KEY_FILE
from provision.job.supervision import Ready, Started, Supervision, Target
from provision.model.errors import LaunchError, MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log
from provision.model.spec import JobSpec
from provision.nodes import HomePath, NodeGroup, RemoteLayout
from remote.store import StoreURL, open_store, parse_url

CONTROLLER_DIR = "controller"  # under the controller's remote folder
START_DEADLINE_S = 600.0
SETUP_DEADLINE_S = 900.0  # a cloud controller's first boot: apt + pip of the dependencies
TEARDOWN_KEY = "_teardown"  # in spec.json: whether the controller removes the cluster


def controller_layout(inv: Inventory) -> RemoteLayout:
    return RemoteLayout(f"{inv.remote_root}/{CONTROLLER_DIR}")


def store_url(inv: Inventory) -> StoreURL:
    return parse_url(inv.spec.store if inv.spec and inv.spec.store else "")


def controller_inventory(inv: Inventory, store: InventoryStore) -> Inventory:
    """An inventory whose only node is the controller (for NodeGroup), host key pinned in a
    known_hosts of its own, logged in to with the controller's own key."""
    from provision.model.keys import known_hosts_line, write_known_hosts

    ctl = inv.controller
    if ctl is None:
        raise MgpuError(f"cluster {inv.name!r} has no controller")
    keys = store.keys_dir(inv.name)
    path = keys / "controller_known_hosts"
    write_known_hosts(path, [known_hosts_line([ctl.address], ctl.port, ctl.host_key or "")])
    # the controller's own login key (no node holds it); a controller made before it existed
    # authorized the cluster key
    own = keys / "controller_ed25519"
    key_path = str(own) if own.exists() else inv.key_path
    return inv.model_copy(update={"nodes": [ctl], "known_hosts_path": str(path),
                                  "key_path": key_path})


def _tree_files(name: str, root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` as archive entries under `name` (no caches)."""
    return {f"{name}/{p.relative_to(root)}": (p.read_bytes(), 0o644) for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def controller_payload(inv: Inventory, job: JobSpec, job_id: str, env: dict[str, Any],
                       layout: RemoteLayout, log: Log | None = None) -> bytes:
    """One archive: the tool's code, its state for this cluster, the job (its folder through
    shipping.workdir_archive: the state folder and key files stay here, `log` hears it)."""
    import provision
    from provision.model.assets import templates_dir
    from provision.nodes.bootstrap import files_tar, remote_zipapp
    from provision.nodes.shipping import workdir_archive

    lib = Path(provision.__file__).resolve().parent
    keys = Path(inv.key_path or "").parent
    spec = job.model_dump(mode="json")
    spec.update(script=job.script_in_workdir, workdir=None)
    if job.deepspeed_config:
        spec["deepspeed_config"] = Path(job.deepspeed_config).name
    work = f"{layout.root}/jobs/{job_id}/work"
    entries = {
        f"{inv.remote_root}/remote.pyz": (remote_zipapp(), 0o644),
        f"{layout.root}/home/clusters/{inv.name}.yaml": (
            _inventory_yaml(inv).encode(), 0o600),
        f"{layout.root}/home/store-env.json": (json.dumps(env).encode(), 0o600),
        f"{layout.root}/jobs/{job_id}/job.json": (json.dumps(spec).encode(), 0o600),
    }
    # the cluster key (to reach the nodes) and the records key (to sign what it writes); not
    # the controller's own login key, which stays on this machine
    for key in (p for p in keys.iterdir() if p.is_file()
                and (p.name.startswith("id_") or p.name == KEY_FILE)):
        entries[f"{layout.root}/home/keys/{inv.name}/{key.name}"] = (key.read_bytes(), 0o600)
    if job.deepspeed_config:
        entries[f"{work}/{Path(job.deepspeed_config).name}"] = (
            Path(job.deepspeed_config).read_bytes(), 0o644)
    for name, root in ((f"{layout.root}/lib/provision", lib),
                       (f"{layout.root}/lib/remote", lib.parent / "remote"),
                       (f"{layout.root}/lib/templates", templates_dir())):
        entries.update(_tree_files(name, root))
    tree = workdir_archive(job.local_workdir, job.excludes, inv, log)
    return files_tar(entries, tree, work)


def controller_state(inv: Inventory, url: StoreURL, job_id: str, job: JobSpec,
                     env: dict[str, str], log: Log) -> dict[str, Any]:
    """The controller's store-env.json: its own store variables (on aws without this
    shell's keys) and the nodes' first credentials, minted here for the job's data prefix."""
    from provision.job.managed.checks import controller_env
    from provision.job.managed.nodecreds import FEDERATION_MAX_S, for_job

    hours = inv.spec.max_hours if inv.spec is not None else None
    life = int(hours * 3600) + 3600 if hours else FEDERATION_MAX_S
    nodes = for_job(url, inv.name, job_id, env, resume_from=job.env.get(RESUME_VAR),
                    duration_s=life, note=log)()
    return {"env": controller_env(inv.provider, env), "nodes": nodes}


def _inventory_yaml(inv: Inventory) -> str:
    import yaml

    return yaml.safe_dump(inv.model_dump(mode="json"), sort_keys=False)


def start_line(inv: Inventory, job_id: str, url: StoreURL, teardown: bool,
               take_back: bool = False) -> str:
    """The controller's command line: the supervisor under `remote.pyz job start`."""
    home = RemoteLayout(HomePath(inv.remote_root))
    ctl = RemoteLayout(HomePath(f"{inv.remote_root}/{CONTROLLER_DIR}"))
    from provision.nodes.shell import word

    inner = ["env", f"PYTHONPATH={ctl.path('lib')}", f"MGPU_CLOUD_HOME={ctl.path('home')}",
             "python3", "-m", "provision.job.managed.supervisor", "--cluster", inv.name,
             "--job", job_id, "--store", str(url),
             "--job-file", ctl.path("jobs", job_id, "job.json"),
             "--env-file", ctl.path("home", "store-env.json"),
             "--workdir", ctl.path("jobs", job_id, "work")]
    if teardown:
        inner.append("--teardown")
    if take_back:
        inner.append("--take-back")
    outer = ["python3", home.pyz, "job", "start", "--dir", ctl.path("jobs", job_id, "run"),
             "--", *inner]
    # HomePath words keep $HOME live; `env` words carry it inside the assignment
    return " ".join(word(w) if not w.startswith(("PYTHONPATH=", "MGPU_CLOUD_HOME="))
                    else _assign(w) for w in outer)


def _assign(pair: str) -> str:
    key, _, value = pair.partition("=")
    return f'{key}="$HOME"/{shlex.quote(value)}'


# What works instead of a managed run where the provider cannot make a controller (the ssh
# hosts are the user's machines; a Slurm allocation is held by the process that asked for it)
UNSUPERVISED = {
    "ssh": ("the ssh provider's hosts are your machines: it cannot make the controller a "
            "managed run needs",
            "run attached (`mgpu-cloud run`/`launch` without --detach: recovery restarts the "
            "job on the same hosts, --store keeps checkpoints there), or `launch --detach` "
            "without --store (no recovery; `jobs`, `logs`, `cancel` work)"),
    "slurm": ("a Slurm allocation is held by the process that asked for it: the slurm "
              "provider cannot make the controller a managed run needs",
              "run attached (`mgpu-cloud run` without --detach: --max-restarts restarts the "
              "job inside the allocation), or `launch --detach` without --store"),
}


def refuse_unsupervised(provider: AnyProvider, name: str) -> None:
    """UserInputError saying what works instead, for a provider that cannot supervise."""
    if isinstance(provider, Supervising):
        return
    why, instead = UNSUPERVISED.get(name, (
        f"provider {name!r} cannot make a controller for managed runs",
        "run attached (without --detach)"))
    raise UserInputError(f"--detach --store: {why}", hint=instead)


def wait_controller_setup(group: NodeGroup, inv: Inventory) -> None:
    """A cloud controller's boot installs the supervisor's dependencies (controller_boot.py)
    after SSH answers: wait for its READY file (LaunchError with the set-up's log tail when it
    failed). The docker controller's record names none: its image has them."""
    from provision.cluster.providers.controller_boot import FAILED

    ready = next((r.extra["ready_file"] for r in inv.resources
                  if r.extra.get("role") == "controller" and r.extra.get("ready_file")), None)
    if ready is None:
        return
    q = shlex.quote
    line = (f"timeout {int(SETUP_DEADLINE_S)} sh -c "
            + q(f"until [ -e {q(ready)} ] || [ -e {q(FAILED)} ]; do sleep 2; done")
            + f"; [ -e {q(ready)} ] || {{ cat {q(FAILED)} 2>/dev/null; exit 1; }}")
    group.run(line, timeout=SETUP_DEADLINE_S + 60).raise_for(
        "setting up the controller (python3 and the tool's dependencies)", LaunchError)


def check_node_sdk(inv: Inventory, group: NodeGroup) -> None:
    """Before the job starts: every node's python3 imports the SDK its checkpoint pushes use
    (remote/store.py; only the docker node image is known to carry them). LaunchError naming
    every node without it."""
    from provision.job.managed.checks import NODE_SDK, node_sdk_probe

    url = store_url(inv)
    line = node_sdk_probe(url)
    if line is None:
        return
    module, dist = NODE_SDK[url.scheme]
    group.run(line).raise_for(
        f"--store {url}: importing {module} (the nodes push checkpoints with it)", LaunchError,
        hint=f"install it in the nodes' image (python3 -m pip install {dist}), or use a "
             "file:// store the nodes mount")


def ensure_controller(provider: AnyProvider, inv: Inventory, store: InventoryStore,
                      log: Log) -> None:
    if inv.controller is not None:
        return
    refuse_unsupervised(provider, inv.provider)
    assert isinstance(provider, Supervising)
    log(f"creating the controller of {inv.name!r} ...")
    inv.controller = provider.create_controller(inv, store)
    store.save(inv)


def hand_off(provider: AnyProvider, inv: Inventory, store: InventoryStore, job: JobSpec,
             env: dict[str, str], *, teardown: bool, log: Log) -> str:
    """Give `job` to the cluster's controller; return its id once it runs (LaunchError when
    the controller reports a failure first, or nothing within START_DEADLINE_S)."""
    from provision.model.keys import ensure_records_key

    url = store_url(inv)
    ensure_controller(provider, inv, store, log)
    objects = open_store(url)
    spec = {**job.model_dump(mode="json"), TEARDOWN_KEY: teardown}
    key = ensure_records_key(store.keys_dir(inv.name))
    job_id = claim_job_id(objects, inv.name, json.dumps(spec).encode(), key)
    deliver(inv, store, job, job_id, controller_state(inv, url, job_id, job, env, log),
             teardown=teardown, log=log)
    return job_id


def deliver(inv: Inventory, store: InventoryStore, job: JobSpec, job_id: str,
             state: dict[str, Any], *, teardown: bool, log: Log, take_back: bool = False) -> None:
    """The controller gets ONE upload (code, inventory, keys, job) and starts the supervisor;
    back once the job's `started` (or `taken_back`) record is in the store."""
    from provision.model.keys import ensure_records_key

    url = store_url(inv)
    key = ensure_records_key(store.keys_dir(inv.name))
    layout = controller_layout(inv)
    archive = controller_payload(inv, job, job_id, state, layout, log)
    q = shlex.quote
    with NodeGroup(controller_inventory(inv, store)) as group:
        group.wait_until_reachable().raise_for("reaching the controller", LaunchError)
        wait_controller_setup(group, inv)
        group.upload(archive, [f"rm -rf {q(layout.path('lib'))} "
                               f"{q(layout.path('jobs', job_id, 'run'))}",
                               f"mkdir -p {q(layout.root)}",
                               "tar -xzf - -C ~ --no-same-owner"]).raise_for(
            "preparing the controller", LaunchError)
        group.run(start_line(inv, job_id, url, teardown, take_back)).raise_for(
            "starting the controller", LaunchError)
        log(f"job {job_id} handed to the controller; waiting for it to "
            f"{'take it back' if take_back else 'start'} ...")
        wait_started(JobView(open_store(url), inv.name, job_id, key), group, layout, job_id,
                     log, until="taken_back" if take_back else "started")


def wait_started(view: JobView, group: NodeGroup, layout: RemoteLayout, job_id: str,
                 log: Log, deadline_s: float = START_DEADLINE_S, until: str = "started") -> None:
    """Until the job's `started` record; LaunchError on a failure record or a controller
    that ended without one (its own log's tail in the message)."""
    end = time.monotonic() + deadline_s
    seen = 0
    while time.monotonic() < end:
        for rec in view.records(after=seen):
            seen = rec.seq
            log(f"controller: {rec.event}: {rec.message}")
            if rec.event == until:
                return
            if rec.event in ("failed", "cancelled"):
                raise LaunchError(f"job {job_id}: {rec.message}")
        if supervisor_ended(group, layout, job_id) is True:
            tail = group.run(f"tail -n 20 {shlex.quote(layout.path('jobs', job_id, 'run', 'node.log'))}")
            text = next(iter(tail.values())).value
            raise LaunchError(f"the controller ended before job {job_id} started:\n"
                              + (text.stdout if text is not None else ""))
        time.sleep(0.5)
    raise LaunchError(f"job {job_id} did not start within {deadline_s:.0f} s")


def supervisor_ended(group: NodeGroup, layout: RemoteLayout, job_id: str) -> bool | None:
    """Whether the controller's supervisor of `job_id` has exited (None: cannot tell, e.g.
    the controller does not answer)."""
    status = group.run(layout.remote_command("job", "status", "--jobs",
                                             layout.path("jobs", job_id)))
    res = next(iter(status.values()))
    if not res.ok or res.value is None:
        return None
    return '"exited"' in res.value.stdout


# --- the supervision ----------------------------------------------------------------------
class Controller(Supervision):
    """The cluster's controller supervises the job (`--detach` on a cluster with a store):
    checked before anything is made, handed over once the cluster is ready (a new cluster's
    removal with it), returned as soon as it runs. Returns the job's id."""

    hands_over = "the controller"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        from provision.job.managed.checks import store_env

        self.env = store_env() if env is None else env  # what reaches a store from here

    def check(self, job: JobSpec, target: Target, log: Log) -> None:
        from provision.job.managed.checks import (
            check_resume,
            check_store,
            refuse_broad,
            refuse_if_running,
        )

        url = check_store(target.provider_name, target.store or "", self.env)
        refuse_broad(url, self.env, allowed=job.allow_broad_node_credentials, log=log)
        refuse_unsupervised(target.provider, target.provider_name)
        check_resume(target.name, target.store or "", job)
        if target.inv is not None:
            refuse_if_running(target.inv)

    def start(self, ready: Ready) -> Started:
        from provision.job.managed.client import remember

        check_node_sdk(ready.inv, ready.group)
        job_id = hand_off(ready.provider, ready.inv, ready.store, ready.job, self.env,
                          teardown=ready.new, log=ready.log)
        if ready.new and ready.inv.spec is not None and ready.inv.spec.store:
            remember(ready.inv.name, ready.inv.spec.store)  # `jobs`, `logs` after it is gone
        return Started(job_id=job_id)
