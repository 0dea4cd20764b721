"""Removing a cluster's containers and networks: only what the engine labels as the cluster's.

An inventory can name anything: one adopted from a store (cluster.json, written by the
controller, on a filesystem or bucket the nodes may reach) or edited by hand. `down`, the
controller's teardown from inside, `replace` and `gc --delete` therefore ask the engine, at
deletion time, for the labels of each container and network the list names, and remove only
those labelled mgpu-cloud-cluster=CLUSTER; each other one is refused by name and left as it
is. Labels are fixed when a container is created, and removal goes by the full id the engine
answered: what was checked is what is removed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from provision.model.errors import ProvisionError, TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, NodeRecord, ResourceRecord


class Forgetting(Protocol):
    def forget(self, inv: Inventory, kind: str, resource_id: str) -> None: ...


class NotTheClusters(ProvisionError):
    """A container or network a list names that the engine does not label as the cluster's."""


def refusal(kind: str, found: dict[str, Any], labels: dict[str, str], cluster: str) -> str:
    """"container NAME (ID) is labelled ... / has no ... label, not CLUSTER's: left as it is"."""
    owner = labels.get(CLUSTER_TAG)
    whose = (f"is labelled {CLUSTER_TAG}={owner}" if owner is not None
             else f"has no {CLUSTER_TAG} label")
    name = str(found.get("Name", "")).lstrip("/")
    return f"{kind} {name} ({str(found.get('Id', ''))[:12]}) {whose}, not {cluster}'s: left as it is"


def owned_container(api: Any, cluster: str, ref: str) -> str | None:
    """The full id of container `ref` when the engine labels it as `cluster`'s; None when the
    engine has no such container; NotTheClusters naming it otherwise."""
    import docker.errors

    try:
        found = api.inspect_container(ref)
    except docker.errors.NotFound:
        return None
    labels = (found.get("Config") or {}).get("Labels") or {}
    if labels.get(CLUSTER_TAG) != cluster:
        raise NotTheClusters(refusal("container", found, labels, cluster))
    return str(found["Id"])


def owned_network(api: Any, cluster: str, ref: str) -> str | None:
    """As owned_container, for a network (the shared one carries no cluster's label)."""
    import docker.errors

    try:
        found = api.inspect_network(ref)
    except docker.errors.NotFound:
        return None
    labels = found.get("Labels") or {}
    if labels.get(CLUSTER_TAG) != cluster:
        raise NotTheClusters(refusal("network", found, labels, cluster))
    return str(found["Id"])


@dataclass
class Removal:
    """What removal passes did: the (kind, ref) a list named that are gone now, those refused
    (not the cluster's: never its, so dropped from its inventory as well), failures."""

    cluster: str
    done: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, ref, why)
    failures: list[str] = field(default_factory=list)

    def forget(self, inv: Inventory, store: Forgetting) -> None:
        """Drop from `inv` every record that is gone now or was refused."""
        for kind, ref, *_ in [*self.done, *self.refused]:
            if any(r.kind == kind and r.id == ref for r in inv.resources):
                store.forget(inv, kind, ref)

    def raise_for(self, hint: str) -> None:
        """TeardownError naming every failure and refusal; nothing when there are none."""
        if not self.failures and not self.refused:
            return
        parts = self.failures + [why for *_, why in self.refused]
        if self.refused:
            hint = (f"the inventory named {len(self.refused)} resource(s) the engine does not "
                    f"label as {self.cluster}'s (an inventory adopted from a store a node can "
                    "write, or edited by hand?): they are dropped from it; " + hint)
        raise TeardownError(f"could not remove everything of cluster {self.cluster!r}: "
                            + "; ".join(parts), hint=hint)


def remove_containers(api: Any, cluster: str, refs: Iterable[str], *, listed: set[str],
                      keep: Collection[str] = (), first: Collection[str] = (),
                      into: Removal | None = None) -> Removal:
    """Remove the containers `refs` names that carry the cluster's label. `listed`: full ids
    the engine just listed under that label (no second look needed); every other ref is
    inspected. `keep`: full ids left alone (the controller itself); `first`: removed before
    the rest (the controller, so it replaces no node while they go)."""
    import docker.errors

    from provision.nodes import fan_out

    out = into or Removal(cluster)
    full: dict[str, list[str]] = {cid: [cid] for cid in listed}  # full id -> refs naming it
    for ref in dict.fromkeys(refs):
        if ref in full:
            continue
        try:
            cid = owned_container(api, cluster, ref)
        except NotTheClusters as exc:
            out.refused.append(("container", ref, exc.message))
            continue
        except docker.errors.APIError as exc:
            out.failures.append(f"container {ref[:12]}: {exc.explanation or exc}")
            continue
        if cid is None:
            out.done.append(("container", ref))
        else:
            full.setdefault(cid, []).append(ref)

    def remove(cid: str) -> None:
        try:
            api.remove_container(cid, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                out.failures.append(f"container {cid[:12]}: {exc.explanation or exc}")
                return
        out.done.extend(("container", ref) for ref in full[cid])

    wanted = set(full) - set(keep)
    fan_out(sorted(wanted & set(first)), remove)
    fan_out(sorted(wanted - set(first)), remove)
    return out


def remove_networks(api: Any, cluster: str, refs: Iterable[str], *, listed: set[str],
                    into: Removal) -> Removal:
    """As remove_containers, for networks (one after the other: a cluster has at most one)."""
    import docker.errors

    for ref in dict.fromkeys([*listed, *refs]):
        try:
            nid = ref if ref in listed else owned_network(api, cluster, ref)
            if nid is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    api.remove_network(nid)
        except NotTheClusters as exc:
            into.refused.append(("network", ref, exc.message))
            continue
        except docker.errors.APIError as exc:
            into.failures.append(f"network {ref[:12]}: {exc.explanation or exc}")
            continue
        into.done.append(("network", ref))
    return into


def retire_node(api: Any, inv: Inventory, store: Forgetting, node: NodeRecord) -> None:
    """`node`'s container removed (a replacement's first step; a node whose rank went to a
    spare), only when the engine labels it as the cluster's: NotTheClusters otherwise,
    nothing removed. Forgotten in `inv`. Idempotent."""
    import docker.errors

    try:
        cid = owned_container(api, inv.name, node.resource_id) if node.resource_id else None
    except NotTheClusters as exc:
        raise NotTheClusters(
            f"{node.name} of cluster {inv.name!r} is not replaced: its record names a "
            f"container that is not the cluster's ({exc.message})",
            hint="the inventory may come from a store a node can write; check it with "
                 f"`mgpu-cloud status {inv.name}`, then `mgpu-cloud down {inv.name}`",
        ) from None
    if cid:
        with contextlib.suppress(docker.errors.NotFound):  # already gone: fine
            api.remove_container(cid, force=True)
    if node.resource_id:
        store.forget(inv, "container", node.resource_id)


def orphans(client: Any, known: set[str]) -> list[ResourceRecord]:
    """Containers and networks labelled with a cluster that no inventory here knows."""
    found: list[ResourceRecord] = []
    # the SDK inspects each container the engine listed: one removed meanwhile (another
    # cluster's `down`) is gone, not an error
    for c in client.containers.list(all=True, filters={"label": CLUSTER_TAG}, ignore_removed=True):
        owner = c.labels.get(CLUSTER_TAG, "")
        if owner not in known:
            found.append(ResourceRecord(kind="container", id=c.id, name=c.name,
                                        extra={"cluster": owner}))
    for n in client.networks.list(filters={"label": CLUSTER_TAG}):
        owner = (n.attrs.get("Labels") or {}).get(CLUSTER_TAG, "")
        if owner not in known:
            found.append(ResourceRecord(kind="network", id=n.id, name=n.name,
                                        extra={"cluster": owner}))
    return found


def delete_orphans(api: Any, resources: list[ResourceRecord]) -> None:
    """Each as the cluster its label named when `gc` listed it, checked again now."""
    failures: list[str] = []
    for owner in sorted({r.extra.get("cluster", "") for r in resources}):
        mine = [r for r in resources if r.extra.get("cluster", "") == owner]
        done = remove_containers(api, owner, [r.id for r in mine if r.kind == "container"],
                                 listed=set())
        remove_networks(api, owner, [r.id for r in mine if r.kind == "network"],
                        listed=set(), into=done)
        failures += done.failures + [why for *_, why in done.refused]
    if failures:
        raise TeardownError("could not remove every orphan: " + "; ".join(failures),
                            hint="`mgpu-cloud gc --provider docker` lists what is left")
