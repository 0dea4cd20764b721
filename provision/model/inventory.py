"""The on-disk record of a cluster, one YAML file per cluster in the state dir.

State dir: `$MGPU_CLOUD_HOME`, default `~/.mgpu-cloud`:

    clusters/NAME.yaml     the Inventory (0600; written atomically: temp file + fsync + rename)
    clusters/NAME.lock     flock'ed while a command acts on the cluster (removed by `down`)
    keys/NAME/             the cluster's ed25519 key (0600), known_hosts, node host keys
    ssh/NAME.conf          `ssh-config --install`: the OpenSSH config of the cluster's nodes
    jobs/NAME/ID/          job records and copied logs (provision/job/jobs.py; kept after `down`)
    history.jsonl          every cluster made here, for `cost` (provision/cluster/cost.py)

Contract: a provider records every resource through `InventoryStore.record` the moment its id
exists, before making the next call, so a crash never leaves something billed that `down`
cannot find. Inventories hold ids, addresses and key *paths*, never credentials.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import re
import shlex
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from provision.model.errors import (
    ClusterBusyError,
    ClusterExistsError,
    ClusterNotFoundError,
    InventoryUnreadableError,
    MgpuError,
    UserInputError,
)
from provision.model.gate_record import GateRecord
from provision.model.logins import checked_login_field
from provision.model.spec import ClusterSpec, validate_cluster_name
from provision.model.timeline import Timeline
from provision.model.yamltext import YAML_HINT, YamlProblem
from remote.files import write_atomic

CLUSTER_TAG = "mgpu-cloud-cluster"
# libyaml when PyYAML was built with it: a save is ~2 ms instead of ~8 (saved ~10x per `up`).
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def checked_name(name: str) -> str:
    """`name` if it is a valid cluster name; UserInputError saying the rule otherwise."""
    try:
        return validate_cluster_name(name)
    except ValueError as exc:
        raise UserInputError(str(exc)) from None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def state_home() -> Path:
    return Path(os.environ.get("MGPU_CLOUD_HOME", "~/.mgpu-cloud")).expanduser()


class ResourceRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    id: str
    name: str | None = None
    region: str | None = None
    zone: str | None = None
    extra: dict[str, str] = Field(default_factory=dict)


class NodeRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    rank: int
    address: str = Field(description="where the controller connects over SSH")
    port: int = 22
    private_address: str = Field(description="where the other nodes reach this one")
    user: str = "root"
    slots: int = 1
    host_key: str | None = Field(None, description="pinned public host key, 'type base64'")
    resource_id: str | None = None
    zone: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None

    @field_validator("user", "address", "private_address", "name", "proxy_jump")
    @classmethod
    def _login(cls, v: str | None, info: ValidationInfo) -> str | None:
        return v if v is None else checked_login_field(str(info.field_name), v)


class FabricExpectation(BaseModel):
    """What the network between nodes should deliver, as the provider knows it from its
    catalog (set at create; None where nothing is known, e.g. docker or the user's machines).
    The fabric gate compares NCCL's chosen transport and the measured bandwidth with it."""

    model_config = ConfigDict(extra="forbid")

    transport: str = Field(description="NCCL network expected between nodes: efa | ib | tcpx "
                                       "| tcpxo | rdma | socket")
    busbw_gbps: float | None = Field(None, description="expected cross-node all-reduce bus "
                                     "bandwidth, GB/s (None: unknown)")
    nominal: str = Field("", description="e.g. '4 x 100 Gb/s EFA'")
    source: str = Field("", description="where the figures come from, with a date")


class PreemptionSource(BaseModel):
    """Where nodes learn they are about to be taken away (remote/preempt.py protocols)."""

    model_config = ConfigDict(extra="forbid")

    protocol: Literal["aws", "gcp", "file"]
    url: str


class Replacement(BaseModel):
    """One node replaced during a run (recovery), for the record."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    old: str | None
    new: str | None
    reason: str
    at: str = Field(default_factory=lambda: _now())


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    provider: str
    status: Literal["creating", "ready", "destroying"] = "creating"
    created_at: str = Field(default_factory=lambda: _now())
    spec: ClusterSpec | None = Field(None, description="what the user asked for, typed")
    resources: list[ResourceRecord] = Field(default_factory=list)
    nodes: list[NodeRecord] = Field(default_factory=list)
    spares: list[NodeRecord] = Field(default_factory=list, description="warm spares (issue "
                                     "44): made, bootstrapped, idle; not ranks")
    spares_made: int = Field(0, description="spares ever made: the next one's number")
    key_path: str | None = None
    known_hosts_path: str | None = None
    hourly_cost_usd: float = 0.0
    unpriced: list[str] = Field(default_factory=list, description="parts without a known "
                                "price: hourly_cost_usd is then only the known part")
    remote_root: str = ".mgpu-cloud"
    nccl_env: dict[str, str] = Field(default_factory=dict)
    container_image: str | None = Field(None, description="jobs run inside this image when set")
    gpu_model: str | None = Field(None, description="the nodes' GPUs as the provider's catalog "
                                  "names them (e.g. 'NVIDIA B200', 'nvidia-b200'); a job's "
                                  "--image is checked against them; None: unknown")
    container_args: list[str] = Field(default_factory=list, description="extra `docker run` "
                                      "words the provider's fabric needs (devices, mounts, env)")
    container_library_path: list[str] = Field(
        default_factory=list, description="folders put first on LD_LIBRARY_PATH inside the "
        "container (e.g. the host's libfabric and NCCL net plugin, mounted by container_args)")
    container_runtime: Literal["docker", "apptainer", "singularity", "none"] = Field(
        "docker", description="what runs a job's image on the nodes (provision/nodes/container.py); "
        "container_args are words of this runtime; none: the nodes cannot run images")
    wait_for_gpu: bool = Field(False, description="bootstrap waits for nvidia-smi too")
    manage_etc_hosts: bool = Field(False, description="bootstrap writes node names to /etc/hosts")
    inter_node_ssh: bool = Field(
        True, description="bootstrap sets up node-to-node SSH (off where users already have it)"
    )
    bootstrapped: bool = False
    fabric: FabricExpectation | None = None
    preemption: PreemptionSource | None = None
    replacements: list[Replacement] = Field(default_factory=list)
    fabric_gate: GateRecord | None = Field(None, description="the fabric gate's last result")
    controller: NodeRecord | None = Field(None, description="the machine that supervises "
                                          "managed runs (docs/ARCHITECTURE.md)")
    timelines: list[Timeline] = Field(default_factory=list, description="where each bring-up's "
                                      "time went, newest last (provision/model/timeline.py)")

    def resources_of(self, kind: str) -> list[ResourceRecord]:
        return [r for r in self.resources if r.kind == kind]

    @property
    def master(self) -> NodeRecord:
        return min(self.nodes, key=lambda n: n.rank)

    def adopt(self, theirs: Inventory) -> bool:
        """Take the nodes and resources of `theirs` (the copy a managed run's controller keeps
        of this cluster) when it has recorded more replacements than this one: the cluster
        changed without this machine. Key paths and status stay this machine's. True if taken."""
        if theirs.name != self.name or len(theirs.replacements) <= len(self.replacements):
            return False
        self.nodes, self.resources = theirs.nodes, theirs.resources
        self.spares, self.spares_made = theirs.spares, theirs.spares_made
        self.replacements = theirs.replacements
        return True


def unreadable(path: Path, text: str, why: str) -> InventoryUnreadableError:
    """The error for an inventory file that cannot be used, with what can be done about it."""
    found = re.search(r"^provider:\s*['\"]?([a-z0-9_-]+)", text, re.MULTILINE)
    provider = found.group(1) if found else None
    gc = f"mgpu-cloud gc --provider {provider}" if provider else "mgpu-cloud gc --provider P"
    return InventoryUnreadableError(
        f"inventory {str(path)!r} {why}",
        hint=f"fix the file (it is YAML: {YAML_HINT}), or move it away "
             f"(mv {shlex.quote(str(path))} {shlex.quote(str(path))}.broken) and find what the "
             f"cluster left with `{gc}`",
        path=str(path), cluster=path.stem, provider=provider)


class InventoryStore:
    """Inventories on disk. Every method is safe to call from several processes."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or state_home()
        self.clusters_dir = self.home / "clusters"
        # record/forget/save from several threads (a spare ordered in the background)
        self._write = threading.RLock()

    # --- paths -------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.clusters_dir / f"{checked_name(name)}.yaml"

    def ssh_config_path(self, name: str) -> Path:
        """The cluster's OpenSSH config, when installed (provision/nodes/sshconfig.py)."""
        return self.home / "ssh" / f"{checked_name(name)}.conf"

    def keys_dir(self, name: str) -> Path:
        d = self.home / "keys" / checked_name(name)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    def _ensure_dirs(self) -> None:
        self.clusters_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # --- locking -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Hold the cluster's lock or raise ClusterBusyError at once (never waits).

        `delete` removes the lock file while holding it; a command that opened the old file
        just before would then hold a lock nobody else can see, so the lock taken is checked
        to still be the file at the path (else taken again on the new one)."""
        self._ensure_dirs()
        lock_path = self.clusters_dir / f"{checked_name(name)}.lock"
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ClusterBusyError(
                    f"cluster {name!r} is in use by another mgpu-cloud command",
                    hint="wait for it to finish (or stop it), then try again",
                ) from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)

    # --- read / write --------------------------------------------------------------------
    def exists(self, name: str) -> bool:
        return self.path(name).exists()

    def load(self, name: str) -> Inventory:
        """The cluster's inventory. ClusterNotFoundError without one; InventoryUnreadableError
        (path, line, how to fix it) when the file cannot be read, is not YAML or not an
        inventory."""
        p = self.path(name)
        try:
            text = p.read_text()
        except FileNotFoundError:
            known = ", ".join(self.names()) or "none"
            raise ClusterNotFoundError(f"no cluster named {name!r} (known clusters: {known})",
                                       hint="`mgpu-cloud status` lists them") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise unreadable(p, "", f"cannot be read: {exc}") from None
        try:
            data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader
        except yaml.YAMLError as exc:
            bad = YamlProblem.of(exc)
            raise unreadable(p, text, f"is not valid YAML{bad.at()}: {bad.problem}") from None
        try:
            return Inventory.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the top level"
            raise unreadable(p, text, f"is not an inventory ({where}: {first['msg']}; "
                                      f"{exc.error_count()} problem(s))") from None

    def names(self) -> list[str]:
        if not self.clusters_dir.is_dir():
            return []
        return sorted(p.stem for p in self.clusters_dir.glob("*.yaml"))

    def scan(self) -> tuple[list[Inventory], list[InventoryUnreadableError]]:
        """Every inventory that can be read, and an error for each one that cannot: one bad
        file never hides the others (listings show the rest and name the bad ones)."""
        good, bad = [], []
        for name in self.names():
            try:
                good.append(self.load(name))
            except ClusterNotFoundError:
                continue  # removed while we listed
            except InventoryUnreadableError as exc:
                bad.append(exc)
            except UserInputError as exc:  # a file whose name is no cluster name
                path = self.clusters_dir / f"{name}.yaml"
                bad.append(InventoryUnreadableError(
                    f"inventory {str(path)!r} is not named after a cluster ({exc.message})",
                    hint=f"rename it to a valid NAME.yaml or move it away (mv "
                         f"{shlex.quote(str(path))} {shlex.quote(str(path))}.broken)",
                    path=str(path), cluster=name))
        return good, bad

    def all(self) -> list[Inventory]:
        """The readable inventories (`scan` also says which files were skipped)."""
        return self.scan()[0]

    def create(self, inv: Inventory) -> None:
        """Write a new inventory; ClusterExistsError if one with that name exists."""
        if self.exists(inv.name):
            raise ClusterExistsError(f"a cluster named {inv.name!r} already exists", hint="pick "
                                     f"another --name, or remove it first: mgpu-cloud down {inv.name}")
        self.save(inv)

    def save(self, inv: Inventory) -> None:
        """Atomic: readers see the old file or the new one, never half of one."""
        self._ensure_dirs()
        with self._write:
            write_atomic(self.path(inv.name), yaml.dump(inv.model_dump(mode="json"),
                                                        Dumper=_Dumper, sort_keys=False))

    def record(self, inv: Inventory, resource: ResourceRecord) -> None:
        """Add a resource and persist at once (call as soon as the cloud returns its id)."""
        with self._write:
            inv.resources.append(resource)
            self.save(inv)

    def forget(self, inv: Inventory, kind: str, resource_id: str) -> None:
        with self._write:
            inv.resources = [r for r in inv.resources
                             if not (r.kind == kind and r.id == resource_id)]
            self.save(inv)

    def delete(self, name: str) -> None:
        """Remove the inventory, the cluster's keys, its installed ssh config and its lock
        file (the caller may hold the lock: `lock` copes with that). Idempotent. Job records
        and the cost history are kept."""
        for path in (self.path(name), self.ssh_config_path(name),
                     self.clusters_dir / f"{name}.lock"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        shutil.rmtree(self.home / "keys" / name, ignore_errors=True)
        self.clean_stale_locks()

    def clean_stale_locks(self) -> int:
        """Remove lock files of clusters that have no inventory and that nobody holds (e.g.
        left by a `launch` of a name that does not exist). Returns how many were removed."""
        if not self.clusters_dir.is_dir():
            return 0
        removed = 0
        for lock_path in self.clusters_dir.glob("*.lock"):
            if lock_path.with_suffix(".yaml").exists():
                continue
            try:
                fd = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not lock_path.with_suffix(".yaml").exists():
                    lock_path.unlink(missing_ok=True)
                    removed += 1
            except BlockingIOError:
                pass  # held: a command is creating that cluster right now
            finally:
                os.close(fd)
        return removed


def ready_inventory(store: InventoryStore, name: str) -> Inventory:
    """The inventory of cluster `name`, which must be ready for a job."""
    inv = store.load(name)
    if inv.status != "ready":
        raise MgpuError(f"cluster {name!r} is {inv.status}, not ready")
    return inv
