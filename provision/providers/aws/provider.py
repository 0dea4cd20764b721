"""AwsProvider: the Provider contract for AWS. The only boundary where botocore errors become
MgpuErrors (errors.map_errors); the modules it calls raise botocore errors or MgpuErrors."""

from __future__ import annotations

from provision.errors import MgpuError, ProvisionError, TeardownError
from provision.inventory import Inventory, InventoryStore, ResourceRecord
from provision.plan import Plan
from provision.providers.aws.errors import map_errors
from provision.spec import ClusterSpec


def _region_of(inv: Inventory) -> str | None:
    for r in inv.resources:
        if r.region:
            return r.region
    aws = inv.spec.get("aws") or {}
    region = aws.get("region") if isinstance(aws, dict) else None
    return str(region) if region else None


def _scope_region(spec: ClusterSpec) -> str:
    from provision.providers.aws.clients import new_session, require_credentials, resolve_region

    session = new_session()
    region = resolve_region(session, spec.aws.region)
    require_credentials(session)
    return region


class AwsProvider:
    name = "aws"

    def plan(self, spec: ClusterSpec) -> Plan:
        """Read-only: describe calls and an SSM lookup, never a write."""
        from provision.providers.aws.plan import build_plan

        with map_errors("checking the request with AWS", planning=True):
            return build_plan(spec)

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        """All-or-nothing: on any failure (Ctrl-C included) destroys what the inventory holds,
        then raises the failure (a ProvisionError naming the step and the AWS error code)."""
        from provision.providers.aws.create import create_cluster

        try:
            with map_errors(f"creating cluster {spec.name!r}"):
                create_cluster(spec, plan, inv, store)
        except BaseException as exc:
            try:
                self.destroy(inv, store)
            except MgpuError as rollback:
                raise TeardownError(
                    f"{exc}; rolling back also failed: {rollback.message}",
                    hint=rollback.hint,
                ) from exc
            if isinstance(exc, MgpuError):
                exc.message += " (everything created so far was deleted)"
                raise
            if isinstance(exc, Exception):
                raise ProvisionError(
                    f"creating cluster {spec.name!r} failed: {type(exc).__name__}: {exc} "
                    "(everything created so far was deleted)"
                ) from exc
            raise

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

        with map_errors(f"deleting cluster {inv.name!r}"):
            region = _region_of(inv) or new_session().region_name
            if not region:
                if inv.resources:
                    raise TeardownError(f"cluster {inv.name!r}: its inventory names no region")
                return
            destroy_cluster(region, inv.name, list(inv.resources), forget)

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        from provision.providers.aws.teardown import find_orphans

        with map_errors("looking for orphaned resources", planning=True):
            return find_orphans(_scope_region(spec), known)

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.providers.aws.teardown import delete_orphans

        with map_errors("deleting orphaned resources"):
            region = resources[0].region if resources and resources[0].region else _scope_region(spec)
            delete_orphans(region, resources)
