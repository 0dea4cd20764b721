"""GcpProvider: the Provider contract for Compute Engine (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from provision.cluster.providers.contract import KeepsSpares, Recoverable, Supervising
from provision.cluster.providers.gcp.options import GcpOptions
from provision.cluster.providers.spares import Estimate
from provision.model.errors import TeardownError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.spec import ClusterSpec
from provision.nodes.pool import provider_waits

if TYPE_CHECKING:  # the plan module loads google.cloud.compute (~1.4 s): only when used
    from provision.cluster.providers.gcp.plan import GcpPlan

log = logging.getLogger(__name__)
# ASSUMED (issue 44: what a warm spare saves, in the plan): an a3/a2 replacement is ready
# ~10 min after it is asked for (insert, boot, GPUDirect NICs, a multi-GB image pull, gate).
REPLACEMENT_S = 600.0


def _project_of(inv: Inventory) -> str | None:
    for rec in inv.resources:
        if rec.extra.get("project"):
            return rec.extra["project"]
    if inv.spec is not None and inv.spec.provider == "gcp":
        return inv.spec.options_as(GcpOptions).project
    return None


IDENTITY_KINDS = ("service-account", "iam-custom-role", "iam-binding")


def _delete_identity(inv: Inventory, store: InventoryStore) -> list[str]:
    """The controller's service account, custom role and bindings, if recorded (issue 18)."""
    from provision.cluster.providers.gcp.controller import IamApi, delete_identity

    records = [r for r in inv.resources if r.kind in IDENTITY_KINDS]
    if not records:
        return []
    return delete_identity(IamApi(), records, lambda kind, rid: store.forget(inv, kind, rid),
                           inv.name)


class GcpProvider(Recoverable["GcpPlan"], KeepsSpares["GcpPlan"], Supervising["GcpPlan"]):
    name = "gcp"

    @contextlib.contextmanager
    def errors(self, action: str, *, planning: bool = False) -> Iterator[None]:
        """The contract's error hook. Every Compute call already goes through clients.Clients,
        which translates google errors where they happen (errors.translate, with the exact
        call named); this only catches what could escape it (e.g. google.auth while the
        clients are built), with the same translation."""
        from provision.cluster.providers.gcp.errors import translate
        from provision.model.errors import ProviderUnavailableError, ProvisionError

        try:
            yield
        except Exception as exc:
            mapped = translate(exc, action, ProviderUnavailableError if planning
                               else ProvisionError)
            if mapped is exc:
                raise
            raise mapped from exc

    def plan_class(self) -> type[GcpPlan]:
        from provision.cluster.providers.gcp.plan import GcpPlan

        return GcpPlan

    def _plan(self, spec: ClusterSpec) -> GcpPlan:
        """Read-only: resolves project, zones (and --regions), machine type, how it is bought,
        reservation, quota, image; prices the cluster. Without credentials: the plan from the
        shipped catalog, listing what is unresolved."""
        from provision.cluster.caller_address import caller_cidr
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.plan import layout_to_plan, offline_layout, region_of
        from provision.cluster.providers.gcp.resolve import resolve
        from provision.model.errors import ProviderUnavailableError, UserInputError

        opts = spec.options_as(GcpOptions)
        if opts.zone:
            region_of(opts.zone)  # a malformed zone fails before credentials are read
        defaulted = spec.max_hours is None
        try:
            clients = build_clients(opts.project)
        except ProviderUnavailableError as exc:
            try:
                ssh_cidr: str | None = spec.ssh_cidr or caller_cidr()
            except UserInputError:
                ssh_cidr = None
            why = f"{exc.message}; {exc.hint}" if exc.hint else exc.message
            layout, unresolved = offline_layout(spec, opts.project, ssh_cidr, why)
            return layout_to_plan(layout, max_hours_defaulted=defaulted, unresolved=unresolved)
        ssh_cidr = spec.ssh_cidr or caller_cidr()
        layout = resolve(spec, clients, ssh_cidr)
        return layout_to_plan(layout, max_hours_defaulted=defaulted)

    def _create(self, spec: ClusterSpec, plan: GcpPlan, inv: Inventory,
                store: InventoryStore) -> None:
        from provision.cluster.providers.gcp import create
        from provision.cluster.providers.gcp.clients import build_clients

        provider_waits()  # the nodes take minutes to boot: bootstrap's imports meanwhile
        clients = build_clients(plan.layout.project)
        create.create(spec, plan, inv, store, clients, log.warning)

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.gcp import teardown
        from provision.cluster.providers.gcp.clients import build_clients

        if not inv.resources:
            return  # every resource is recorded before its insert is sent: nothing was made
        problems = _delete_identity(inv, store)  # first: the controller's grants are revoked
        try:
            teardown.destroy(inv, store, build_clients(_project_of(inv)))
        except TeardownError as exc:
            if problems:  # name the identity's problems too (they are what is left)
                exc.message = f"{'; '.join(problems)}; {exc.message}"
            raise
        if problems:
            raise TeardownError(f"cluster {inv.name!r}: " + "; ".join(problems),
                                hint=f"run `mgpu-cloud down {inv.name}` again")

    # --- recovery (contract.Recoverable) -------------------------------------------------------
    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when Compute says the node's VM is gone (deleted, or stopping / stopped /
        suspended / terminated); True when it runs."""
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import node_alive

        project = _project_of(inv)
        return node_alive(self._client(f"compute/{project}", lambda: build_clients(project)),
                          inv, node)

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """Delete the node's VM, then make one in its place (replace.py). CapacityError /
        ProvisionError when none can be made, with nothing of the attempt left."""
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import replace_node

        return replace_node(build_clients(_project_of(inv)), inv, store, node)

    # --- warm spares (contract.KeepsSpares; issue 44) -------------------------------------------
    def _replacement_estimate(self, spec: ClusterSpec) -> Estimate:
        return Estimate(REPLACEMENT_S, "assumed: a GPU VM's insert and boot, its guest "
                        "agent's host key, the image pull and the gate; not measured here")

    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import retire_node

        retire_node(build_clients(_project_of(inv)), inv, store, node)

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import make_spare

        return make_spare(build_clients(_project_of(inv)), inv, store, spare)

    # --- managed runs (contract.Supervising; controller_vm.py) ----------------------------------
    def _create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.controller_vm import create_controller

        return create_controller(inv, store, build_clients(_project_of(inv)))

    def _teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.controller_vm import teardown_from_inside

        teardown_from_inside(inv, store, build_clients(_project_of(inv)))

    def _remove_controller_from_inside(self, inv: Inventory) -> None:
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.controller_vm import remove_self

        remove_self(inv, build_clients(_project_of(inv)))

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Instances (by label), placement policies and firewall rules (by description) of
        clusters not in `known`, in the project (and the zone / its region when given)."""
        from provision.cluster.providers.gcp import discovery
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.controller import IamApi, identity_orphans

        opts = spec.options_as(GcpOptions)
        clients = build_clients(opts.project)
        found = discovery.tagged_resources(clients, opts.zone)
        return ([r for r in found if r.extra.get("cluster") not in known]
                + identity_orphans(IamApi(), clients.project, known))

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.cluster.providers.gcp import teardown
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.controller import IamApi, delete_identity

        clients = build_clients(spec.options_as(GcpOptions).project)
        identity = [r for r in resources if r.kind in IDENTITY_KINDS]
        failures = delete_identity(IamApi(), identity, lambda kind, rid: None) if identity else []
        # each as `gc` found it: deleted only if still marked for that cluster (extra cluster)
        failures += teardown.delete_records(
            clients, [r for r in resources if r.kind not in IDENTITY_KINDS], cluster=None)
        if failures:
            raise TeardownError("could not delete every orphaned resource: " + "; ".join(failures),
                                hint="run the same `mgpu-cloud gc ... --delete` again")

