"""AwsProvider: the Provider contract for AWS. The only boundary where botocore errors become
MgpuErrors (errors.map_errors); the modules it calls raise botocore errors or MgpuErrors."""

from __future__ import annotations

from typing import Any

from provision.errors import MgpuError, TeardownError
from provision.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.plan import Plan
from provision.providers.aws.errors import map_errors
from provision.providers.aws.options import AwsOptions
from provision.spec import ClusterSpec


def _region_of(inv: Inventory) -> str | None:
    for r in inv.resources:
        if r.region:
            return r.region
    if inv.spec is not None and inv.spec.provider == "aws":
        return inv.spec.options_as(AwsOptions).region
    return None


def _scope_region(spec: ClusterSpec) -> str:
    from provision.providers.aws.clients import new_session, require_credentials, resolve_region

    session = new_session()
    region = resolve_region(session, spec.options_as(AwsOptions).region)
    require_credentials(session)
    return region


def _iam(region: str) -> Any:
    from provision.providers.aws.clients import make_client, new_session

    return make_client(new_session(), "iam", region)


def _delete_identity(inv: Inventory, store: InventoryStore) -> None:
    """The controller's role and instance profile, if recorded (issue 18). TeardownError
    naming what is left."""
    from provision.providers.aws.controller import delete_identity

    records = [r for r in inv.resources if r.kind in ("iam-role", "iam-instance-profile")]
    if not records:
        return
    region = _region_of(inv) or "us-east-1"  # IAM is global; the client needs a region
    problems = delete_identity(_iam(region), records,
                               lambda kind, rid: store.forget(inv, kind, rid))
    if problems:
        raise TeardownError(f"cluster {inv.name!r}: " + "; ".join(problems),
                            hint=f"run `mgpu-cloud down {inv.name}` again")


class AwsProvider:
    name = "aws"

    def plan(self, spec: ClusterSpec) -> Plan:
        """Read-only: describe calls and an SSM lookup, never a write."""
        from provision.providers.aws.plan import build_plan

        with map_errors("checking the request with AWS", planning=True):
            return build_plan(spec)

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        """Raises a ProvisionError naming the step and the AWS error code; the pipeline then
        destroys what the inventory holds."""
        from provision.providers.aws.create import create_cluster
        from provision.providers.aws.plan import AwsPlan

        with map_errors(f"creating cluster {spec.name!r}"):
            create_cluster(spec, plan.expect(AwsPlan), inv, store)

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Idempotent; forgets each record as it is deleted; TeardownError if some remain."""
        from provision.providers.aws.clients import new_session
        from provision.providers.aws.teardown import destroy_cluster

        def forget(pairs: list[tuple[str, str]]) -> None:
            gone = set(pairs)
            before = len(inv.resources)
            inv.resources = [r for r in inv.resources if (r.kind, r.id) not in gone]
            if len(inv.resources) != before:
                store.save(inv)

        if not inv.resources and inv.key_path is None:
            return  # `create` stores key_path before its first AWS call: none was made
        with map_errors(f"deleting cluster {inv.name!r}"):
            region = _region_of(inv) or new_session().region_name
            if not region:
                if inv.resources:
                    raise TeardownError(f"cluster {inv.name!r}: its inventory names no region")
                return
            try:
                destroy_cluster(region, inv.name, list(inv.resources), forget)
            finally:  # after the instances: the controller's identity (issue 18)
                _delete_identity(inv, store)

    # --- recovery (contract.Recoverable) -------------------------------------------------------
    def node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when EC2 says the node's instance is gone (not listed, or shutting-down,
        terminated, stopping, stopped); True when it runs or EC2 cannot be asked."""
        from provision.providers.aws.api import Ec2
        from provision.providers.aws.replace import node_alive

        region = _region_of(inv)
        if region is None:
            return True
        try:
            with map_errors(f"looking up {node.name} of cluster {inv.name!r}"):
                return node_alive(Ec2(region), node)
        except MgpuError:
            return True  # cannot tell: the recovery loop tries to log in

    def replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """One new instance in the lost one's place (replace.py); CapacityError /
        ProvisionError when none can be made, with nothing of the attempt left."""
        from provision.errors import ProvisionError
        from provision.providers.aws.replace import replace_node

        region = _region_of(inv)
        if region is None:
            raise ProvisionError(f"cluster {inv.name!r}: its inventory names no region")
        with map_errors(f"replacing {node.name} of cluster {inv.name!r}"):
            return replace_node(region, inv, store, node)

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        from provision.providers.aws.controller import identity_orphans
        from provision.providers.aws.teardown import find_orphans

        with map_errors("looking for orphaned resources", planning=True):
            region = _scope_region(spec)
            return find_orphans(region, known) + identity_orphans(_iam(region), known)

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.providers.aws.controller import delete_identity
        from provision.providers.aws.teardown import delete_orphans

        iam_kinds = ("iam-role", "iam-instance-profile")
        with map_errors("deleting orphaned resources"):
            region = resources[0].region if resources and resources[0].region else _scope_region(spec)
            delete_orphans(region, [r for r in resources if r.kind not in iam_kinds])
            problems = delete_identity(_iam(region), resources, lambda kind, rid: None)
            if problems:
                raise TeardownError("; ".join(problems))
