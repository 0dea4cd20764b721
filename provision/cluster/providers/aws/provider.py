"""AwsProvider: the Provider contract for AWS. The only boundary where botocore errors become
MgpuErrors (errors.map_errors); the modules it calls raise botocore errors or MgpuErrors."""

from __future__ import annotations

from provision.cluster.providers.aws.errors import map_errors
from provision.cluster.providers.aws.options import AwsOptions
from provision.model.errors import MgpuError, TeardownError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec


def _region_of(inv: Inventory) -> str | None:
    for r in inv.resources:
        if r.region:
            return r.region
    if inv.spec is not None and inv.spec.provider == "aws":
        return inv.spec.options_as(AwsOptions).region
    return None


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


class AwsProvider:
    name = "aws"

    def plan(self, spec: ClusterSpec) -> Plan:
        """Read-only: describe calls and an SSM lookup, never a write."""
        from provision.cluster.providers.aws.plan import build_plan

        with map_errors("checking the request with AWS", planning=True):
            return build_plan(spec)

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        """Raises a ProvisionError naming the step and the AWS error code; the pipeline then
        destroys what the inventory holds."""
        from provision.cluster.providers.aws.create import create_cluster
        from provision.cluster.providers.aws.request import AwsPlan

        with map_errors(f"creating cluster {spec.name!r}"):
            create_cluster(spec, plan.expect(AwsPlan), inv, store)

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Idempotent; forgets each record as it is deleted; TeardownError if some remain."""
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
        with map_errors(f"deleting cluster {inv.name!r}"):
            region = _region_of(inv) or new_session().region_name
            if not region:
                if inv.resources:
                    raise TeardownError(f"cluster {inv.name!r}: its inventory names no region")
                return
            destroy_cluster(region, inv.name, list(inv.resources), forget)

    # --- recovery (contract.Recoverable) -------------------------------------------------------
    def node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when EC2 says the node's instance is gone (not listed, or shutting-down,
        terminated, stopping, stopped); True when it runs or EC2 cannot be asked."""
        from provision.cluster.providers.aws.api import Ec2
        from provision.cluster.providers.aws.replace import node_alive

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
        from provision.cluster.providers.aws.replace import replace_node
        from provision.model.errors import ProvisionError

        region = _region_of(inv)
        if region is None:
            raise ProvisionError(f"cluster {inv.name!r}: its inventory names no region")
        with map_errors(f"replacing {node.name} of cluster {inv.name!r}"):
            return replace_node(region, inv, store, node)

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        from provision.cluster.providers.aws.teardown import find_orphans

        with map_errors("looking for orphaned resources", planning=True):
            return find_orphans(_scope_region(spec), known)

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.cluster.providers.aws.teardown import delete_orphans

        with map_errors("deleting orphaned resources"):
            region = resources[0].region if resources and resources[0].region else _scope_region(spec)
            delete_orphans(region, resources)
