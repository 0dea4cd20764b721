"""SSH provider: the nodes are machines the user already has; nothing is created or billed.

    plan     parse the hosts (hosts.py), resolve every host key against the user's known_hosts
             (hostkeys.py; in parallel, key exchange only, no login) -> all problems at once.
             Writes nothing.
    create   fill the inventory's nodes from the plan (identity files referenced, never
             copied; inter-node SSH left as the user has it), pin the host keys in the
             cluster's known_hosts, check every host (checks.py) -> all problems at once.
    destroy  per host that got something from us: stop our job, remove ~/.mgpu-cloud/ssh/NAME
             (and the now-empty parents we made). Never anything else; an unreachable host
             is reported, not an error.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path

from provision.cluster.providers.contract import Provider
from provision.cluster.providers.ssh.checks import check_hosts, describe_login_error, remote_root
from provision.cluster.providers.ssh.hosts import load_hosts
from provision.cluster.providers.ssh.options import SshOptions
from provision.model.base import StrictModel
from provision.model.errors import MgpuError, ProviderUnavailableError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.keys import known_hosts_line, write_known_hosts
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec
from provision.nodes import (
    Connector,
    NodeConnection,
    NodeGroup,
    NodeStepError,
    RemoteLayout,
    fan_out,
)
from provision.nodes.hostkeys import Endpoint, HostKeyProblem, Jump, Unreachable, resolve_host_key
from provision.nodes.sshconn import write_cluster_known_hosts
from provision.nodes.sshhosts import Host, HostKeys, KeyResolver, split_jump

log = logging.getLogger("mgpu_cloud")

PINNED_KEY_KIND = "pinned-host-key"  # jump hosts' keys (nodes' keys live in NodeRecord)
STOP_GRACE_S = 10


@dataclass(frozen=True)
class _Failure:
    """Why one host cannot be used; kind: 'unknown' | 'changed' | 'unreachable'."""

    kind: str
    text: str


def _plan_error(failures: list[tuple[Host, _Failure]], total: int, keys: HostKeys) -> MgpuError:
    lines = [f"{h.name} ({h.target}): {f.text}" for h, f in failures]
    message = (f"{len(failures)} of {total} host(s) cannot be used; nothing was changed:\n  "
               + "\n  ".join(lines))
    kinds = {f.kind for _, f in failures}
    hint = "; ".join(keys.hint(k) for k in ("changed", "unknown", "unreachable") if k in kinds)
    if "unreachable" in kinds:
        return ProviderUnavailableError(message, hint=hint)
    return UserInputError(message, hint=hint)


JumpKey = tuple[str, str]  # (Host.proxy_jump, the identity file used through it)


def _pin_all(hosts: list[Host], keys: HostKeys
             ) -> tuple[dict[JumpKey, Jump | _Failure], list[tuple[str, str] | _Failure]]:
    """Every host's key, in parallel: jump hosts first (each distinct one once), then every
    host through its jump. A host that cannot be pinned gets a _Failure, never an exception."""

    def resolve_jump(item: JumpKey) -> Jump | _Failure:
        user, endpoint = split_jump(item[0])
        try:
            key, _ = keys.pin(endpoint)
        except HostKeyProblem as exc:
            return _Failure(exc.kind, f"jump host {item[0]}: {exc}")
        except Unreachable as exc:
            return _Failure("unreachable", f"jump host {item[0]} unreachable: {exc}")
        return Jump(endpoint, user, item[1], key)

    def resolve_host(h: Host) -> tuple[str, str] | _Failure:
        jump: Jump | None = None
        if h.proxy_jump:
            found = jumps[(h.proxy_jump, h.identity_file)]
            if isinstance(found, _Failure):
                return found
            jump = found
        try:
            return keys.pin(Endpoint(h.address, h.port), jump)
        except HostKeyProblem as exc:
            return _Failure(exc.kind, str(exc))
        except Unreachable as exc:
            return _Failure("unreachable", f"unreachable: {exc}")

    ordered = sorted({(h.proxy_jump, h.identity_file) for h in hosts if h.proxy_jump})
    jumps = dict(zip(ordered, fan_out(ordered, resolve_jump), strict=True))
    return jumps, fan_out(hosts, resolve_host)


def _planned_resource(h: Host, key: str) -> PlannedResource:
    details = {
        "address": h.address, "port": str(h.port), "user": h.user,
        "identity_file": h.identity_file, "private_address": h.private_address,
        "slots": str(h.slots) if h.slots else "auto (the GPUs found)", "host_key": key,
    }
    if h.proxy_jump:
        details["proxy_jump"] = h.proxy_jump
    return PlannedResource(kind="host", name=h.name, details=details)


class PlannedHost(StrictModel):
    """One host, resolved and with its host key checked: what `create` records."""

    name: str
    address: str
    port: int
    user: str
    identity_file: str
    private_address: str
    slots: int | None  # None: as many as the GPUs preflight finds
    host_key: str
    proxy_jump: str | None = None
    proxy_jump_host_key: str | None = None


class SshPlan(Plan):
    hosts: list[PlannedHost]


class SshProvider(Provider[SshPlan]):
    """Machines the user already has: nothing is billed, nothing can be replaced (a lost host
    can only be waited for: `--on-node-loss restart`)."""

    name = "ssh"
    spares_refused = ("uses the machines you list and cannot make one more: a listed "
                      "machine kept idle as a spare would be one you pay for anyway; a lost "
                      "node is restarted on (--on-node-loss restart) or ends the run")

    def __init__(self, resolve_key: KeyResolver = resolve_host_key,
                 connector: Connector | None = None) -> None:
        self._resolve_key = resolve_key
        self._connector = connector  # None: SSH (tests inject a recording fake)

    def plan_class(self) -> type[SshPlan]:
        return SshPlan

    # ---------------------------------------------------------------------------------- plan
    def _plan(self, spec: ClusterSpec) -> SshPlan:
        hosts = load_hosts(spec)
        keys = HostKeys(spec.options_as(SshOptions).accept_new_host_keys, self._resolve_key)
        jumps, outcomes = _pin_all(hosts, keys)
        failures = [(h, o) for h, o in zip(hosts, outcomes, strict=True)
                    if isinstance(o, _Failure)]
        if failures:
            raise _plan_error(failures, len(hosts), keys)
        resources: list[PlannedResource] = []
        planned: list[PlannedHost] = []
        notes = [
            "existing machines: nothing is created or billed; `down` stops the job and removes "
            f"only ~/{remote_root(spec.name)}",
        ]
        for h, outcome in zip(hosts, outcomes, strict=True):
            assert not isinstance(outcome, _Failure)
            key, how = outcome
            jump = jumps[(h.proxy_jump, h.identity_file)] if h.proxy_jump else None
            assert not isinstance(jump, _Failure)
            planned.append(PlannedHost(
                name=h.name, address=h.address, port=h.port, user=h.user,
                identity_file=h.identity_file, private_address=h.private_address, slots=h.slots,
                host_key=key, proxy_jump=h.proxy_jump,
                proxy_jump_host_key=jump.host_key if jump else None,
            ))
            resources.append(_planned_resource(h, key))
            if how == "accepted":
                notes.append(keys.accepted(h.name, key))
        slots = [h.slots for h in hosts if h.slots]
        return SshPlan(provider="ssh", cluster=spec.name, nodes=len(hosts),
                       slots_per_node=max(slots) if slots else 1, resources=resources,
                       hourly_cost_usd=0.0, max_hours=spec.max_hours, notes=notes,
                       hosts=planned)

    # -------------------------------------------------------------------------------- create
    def _create(self, spec: ClusterSpec, plan: SshPlan, inv: Inventory,
                store: InventoryStore) -> None:
        """Fill the nodes, pin the keys, check every host. On failure it raises; the pipeline
        then calls `destroy`, which removes what the inventory says was placed."""
        from provision.nodes.bootstrap import remote_zipapp

        hosts = plan.hosts
        # The user's machines already trust each other (or not) as they like: ~/.ssh there
        # is never modified. key_path is the user's own key, referenced, never copied.
        inv.inter_node_ssh = False
        inv.remote_root = remote_root(spec.name)
        inv.key_path = hosts[0].identity_file
        inv.nodes = []
        for rank, h in enumerate(hosts):
            inv.nodes.append(NodeRecord(
                name=h.name, rank=rank, address=h.address, port=h.port,
                private_address=h.private_address, user=h.user, slots=h.slots or 1,
                host_key=h.host_key, identity_file=h.identity_file, proxy_jump=h.proxy_jump,
            ))
            if h.proxy_jump and h.proxy_jump_host_key:
                _, endpoint = split_jump(h.proxy_jump)
                pinned = {x.id for x in inv.resources_of(PINNED_KEY_KIND)}
                if endpoint.known_hosts_name not in pinned:
                    inv.resources.append(ResourceRecord(
                        kind=PINNED_KEY_KIND, id=endpoint.known_hosts_name,
                        name=endpoint.address,
                        extra={"port": str(endpoint.port), "key": h.proxy_jump_host_key},
                    ))
        store.save(inv)
        write_pinned_known_hosts(inv, store)

        reports = check_hosts(inv, store, pyz=remote_zipapp(),
                              expected_gpus_per_node=spec.gpus_per_node, log=log.info,
                              connector=self._connector)
        for node, h in zip(inv.nodes, hosts, strict=True):
            if h.slots is None:  # auto: as many slots as GPUs found
                node.slots = max(1, len(reports[node.name].get("gpus") or []))
        store.save(inv)

    # ------------------------------------------------------------------------------- destroy
    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Idempotent. Only hosts with a remote-dir record are contacted."""
        placed = inv.resources_of("remote-dir")
        by_node: dict[str, list[ResourceRecord]] = {}
        for r in placed:
            by_node.setdefault(r.name or r.id.split(":", 1)[0], []).append(r)
        nodes = [n for n in inv.nodes if n.name in by_node]
        if not nodes:
            return
        write_pinned_known_hosts(inv, store)

        def one(conn: NodeConnection, node: NodeRecord) -> None:
            try:
                conn.open()
            except Exception as exc:  # noqa: BLE001 - reported below, never fatal
                raise NodeStepError(describe_login_error(exc, inv, node)) from exc
            res = conn.run(cleanup_script(inv, by_node[node.name]))
            if not res.ok:
                raise NodeStepError(f"cleanup exited {res.exit_code}: {res.tail()}")

        with NodeGroup(inv, nodes, connector=self._connector) as group:
            outcomes = group.each(one)
        for name, outcome in outcomes.items():
            records = by_node[name]
            if not outcome.ok:
                paths = ", ".join(f"~/{r.extra.get('path')}" for r in records)
                # Nothing is billed on the user's own machines: say what is left and go on,
                # so a host that is gone for good never blocks `down`.
                log.warning("ssh: could not clean up %s (%s); left there: %s", name,
                            outcome.why(), paths)
            for r in records:
                store.forget(inv, r.kind, r.id)

    # ---------------------------------------------------------------------------------- gc
    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []  # nothing is billed: there is nothing to collect

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        return None


def cleanup_script(inv: Inventory, records: list[ResourceRecord]) -> str:
    """Shell for one host: stop our job, remove exactly what the records name."""
    q = shlex.quote
    layout = RemoteLayout(inv.remote_root)
    root = layout.root
    lines = ['cd "$HOME" || exit 1']
    for r in records:
        path = r.extra.get("path", "")
        if r.kind == "remote-dir" and path == root:
            pid, pyz = layout.pidfile, layout.pyz
            lines.append(f"if [ -f {q(pid)} ] && [ -f {q(pyz)} ]; then python3 {q(pyz)} stop "
                         f"--pidfile {q(pid)} --grace {STOP_GRACE_S} || true; fi")
            lines.append(f"rm -rf -- {q(root)}")
            parents = [p for p in r.extra.get("parents", "").split(",") if p]
            for parent in sorted(parents, key=len, reverse=True):
                lines.append(f"rmdir -- {q(parent)} 2>/dev/null || true")  # only when empty
    return "\n".join(lines) + "\nexit 0\n"


def write_pinned_known_hosts(inv: Inventory, store: InventoryStore) -> Path:
    """The cluster's known_hosts: the nodes' keys (sshconn) plus the jump hosts' keys."""
    path = write_cluster_known_hosts(inv, store)
    extra = [known_hosts_line([r.name or ""], int(r.extra["port"]), r.extra["key"])
             for r in inv.resources_of(PINNED_KEY_KIND)]
    if extra:
        lines = [ln for ln in path.read_text().splitlines() if ln]
        write_known_hosts(path, lines + [ln for ln in extra if ln not in lines])
    return path
