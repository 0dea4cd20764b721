"""AwsProvider: the Provider contract for AWS. Its `errors` hook (errors.map_errors) is the only
boundary where botocore errors become MgpuErrors; the modules it calls raise botocore errors or
MgpuErrors."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from provision.cluster.providers.aws.errors import map_errors
from provision.cluster.providers.aws.options import AwsOptions
from provision.cluster.providers.aws.request import AwsPlan
from provision.cluster.providers.contract import KeepsSpares, Recoverable, Supervising
from provision.cluster.providers.spares import Estimate
from provision.model.errors import ProvisionError, TeardownError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.spec import ClusterSpec
from provision.nodes.pool import provider_waits

# ASSUMED (issue 44: what a warm spare saves, in the plan): a p4d/p5 replacement is ready
# ~10 min after it is asked for (launch, boot, EFA, a multi-GB image pull, the gate).
REPLACEMENT_S = 600.0


def _region_of(inv: Inventory) -> str | None:
    for r in inv.resources:
        if r.region:
            return r.region
    if inv.spec is not None and inv.spec.provider == "aws":
        return inv.spec.options_as(AwsOptions).region
    return None


def _required_region(inv: Inventory) -> str:
    region = _region_of(inv)
    if region is None:
        raise ProvisionError(f"cluster {inv.name!r}: its inventory names no region")
    return region


def _scope_region(spec: ClusterSpec) -> str:
    from provision.cluster.providers.aws.clients import (
        new_session,
        require_credentials,
        resolve_region,
    )

    session = new_session()
    region = resolve_region(session, spec.options_as(AwsOptions).region)
    require_credentials(session)
    return region


def _iam(region: str) -> Any:
    from provision.cluster.providers.aws.clients import make_client, new_session

    return make_client(new_session(), "iam", region)


def _delete_identity(inv: Inventory, store: InventoryStore) -> None:
    """The controller's role and instance profile, if recorded (issue 18). TeardownError
    naming what is left."""
    from provision.cluster.providers.aws.controller import delete_identity

    records = [r for r in inv.resources if r.kind in ("iam-role", "iam-instance-profile")]
    if not records:
        return
    region = _region_of(inv) or "us-east-1"  # IAM is global; the client needs a region
    problems = delete_identity(_iam(region), records,
                               lambda kind, rid: store.forget(inv, kind, rid), inv.name)
    if problems:
        raise TeardownError(f"cluster {inv.name!r}: " + "; ".join(problems),
                            hint=f"run `mgpu-cloud down {inv.name}` again")


class AwsProvider(Recoverable[AwsPlan], KeepsSpares[AwsPlan], Supervising[AwsPlan]):
    name = "aws"

    def plan_class(self) -> type[AwsPlan]:
        return AwsPlan

    def errors(self, action: str, *, planning: bool = False) -> AbstractContextManager[Any]:
        return map_errors(action, planning=planning)

    def _plan(self, spec: ClusterSpec) -> AwsPlan:
        """Read-only: describe calls and an SSM lookup, never a write."""
        from provision.cluster.providers.aws.plan import build_plan

        return build_plan(spec)

    def _create(self, spec: ClusterSpec, plan: AwsPlan, inv: Inventory,
                store: InventoryStore) -> None:
        """Raises a ProvisionError naming the step and the AWS error code; the pipeline then
        destroys what the inventory holds."""
        from provision.cluster.providers.aws.failover import create_cluster

        provider_waits()  # the nodes take minutes to boot: bootstrap's imports meanwhile
        create_cluster(spec, plan, inv, store)

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Forgets each record as it is deleted; TeardownError if some remain."""
        from provision.cluster.providers.aws.clients import new_session
        from provision.cluster.providers.aws.teardown import destroy_cluster

        def forget(pairs: list[tuple[str, str]]) -> None:
            gone = set(pairs)
            before = len(inv.resources)
            inv.resources = [r for r in inv.resources if (r.kind, r.id) not in gone]
            if len(inv.resources) != before:
                store.save(inv)

        if not inv.resources and inv.key_path is None:
            return  # `create` stores key_path before its first AWS call: none was made
        region = _region_of(inv) or new_session().region_name
        if not region:
            if inv.resources:
                raise TeardownError(f"cluster {inv.name!r}: its inventory names no region")
            return
        # Normally one region; records of another one are left by a --regions attempt that
        # was interrupted before it cleaned up after itself.
        regions = list(dict.fromkeys([region] + [r.region for r in inv.resources if r.region]))
        problems = []
        try:
            for where in regions:
                records = [r for r in inv.resources if (r.region or region) == where]
                try:
                    destroy_cluster(where, inv.name, records, forget)
                except TeardownError as exc:
                    problems.append(exc)
        finally:  # after the instances: the controller's identity (issue 18)
            _delete_identity(inv, store)
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise TeardownError("; ".join(p.message for p in problems), hint=problems[0].hint)

    # --- recovery (contract.Recoverable) -------------------------------------------------------
    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when EC2 says the node's instance is gone (not listed, or shutting-down,
        terminated, stopping, stopped); True when it runs or EC2 cannot be asked."""
        from provision.cluster.providers.aws.api import Ec2
        from provision.cluster.providers.aws.replace import node_alive

        region = _region_of(inv)
        return True if region is None else node_alive(
            self._client(f"ec2/{region}", lambda: Ec2(region)), node)

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """One new instance in the lost one's place (replace.py)."""
        from provision.cluster.providers.aws.replace import replace_node

        return replace_node(_required_region(inv), inv, store, node)

    # --- warm spares (contract.KeepsSpares; issue 44) -------------------------------------------
    def _replacement_estimate(self, spec: ClusterSpec) -> Estimate:
        return Estimate(REPLACEMENT_S, "assumed: a GPU instance's launch and boot, its EFA "
                        "interfaces, the image pull and the gate; not measured here")

    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        """Its instance terminated and its Elastic IP released (replace.py retire_old)."""
        from provision.cluster.providers.aws.api import Ec2
        from provision.cluster.providers.aws.replace import Replacer

        Replacer(Ec2(_required_region(inv)), inv, store, node).retire_old()

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        """One more instance launched as a replacement is (replace.py), nothing retired."""
        from provision.cluster.providers.aws.api import Ec2
        from provision.cluster.providers.aws.replace import Replacer

        return Replacer(Ec2(_required_region(inv)), inv, store, spare).run(spare=True)

    # --- managed runs (contract.Supervising; controller_vm.py) ----------------------------------
    def _create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        from provision.cluster.providers.aws.controller_vm import create_controller

        return create_controller(inv, store, _required_region(inv))

    def _teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.aws.controller_vm import teardown_from_inside

        teardown_from_inside(inv, store, _required_region(inv))

    def _remove_controller_from_inside(self, inv: Inventory) -> None:
        from provision.cluster.providers.aws.controller_vm import remove_self

        remove_self(inv, _required_region(inv))

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        from provision.cluster.providers.aws.controller import identity_orphans
        from provision.cluster.providers.aws.teardown import find_orphans

        region = _scope_region(spec)
        return find_orphans(region, known) + identity_orphans(_iam(region), known)

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.cluster.providers.aws.controller import delete_identity
        from provision.cluster.providers.aws.teardown import delete_orphans

        iam_kinds = ("iam-role", "iam-instance-profile")
        region = resources[0].region if resources and resources[0].region else _scope_region(spec)
        delete_orphans(region, [r for r in resources if r.kind not in iam_kinds])
        problems = delete_identity(_iam(region), resources, lambda kind, rid: None)
        if problems:
            raise TeardownError("; ".join(problems))
