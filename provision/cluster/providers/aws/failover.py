"""`up` across regions (--regions): the plan's first region, then the next ones while a region
has no capacity for the whole cluster. What an attempt made in a region (key pair, security
group, placement group, private subnet...) is deleted before the next region is tried, so a
cluster only ever holds resources in the region its nodes run in."""

from __future__ import annotations

from provision.cluster.providers.aws.create import Creator
from provision.cluster.providers.aws.request import AwsPlan
from provision.model.errors import CapacityError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec


def create_cluster(spec: ClusterSpec, plan: AwsPlan, inv: Inventory, store: InventoryStore) -> None:
    """Make everything of `plan` in the first region that has capacity. Raises (MgpuError)
    on failure WITHOUT rolling back the last attempt (the pipeline destroys what the
    inventory holds); a CapacityError lists every region's answer."""
    from provision.cluster.providers.aws.teardown import destroy_cluster

    launches = [plan.launch] + [plan.launch.at(site) for site in plan.launch.fallback]
    failures: list[str] = []
    for i, launch in enumerate(launches):
        try:
            Creator(spec, plan.model_copy(update={"launch": launch}), inv, store).run()
            return
        except CapacityError as exc:
            failures.append(f"{launch.region}: {exc.message}")
            if i == len(launches) - 1:
                if len(launches) == 1:
                    raise
                raise CapacityError("no region had capacity: " + "; ".join(failures),
                                    hint="try fewer --nodes, other --regions, or later") from exc

        def forget(pairs: list[tuple[str, str]]) -> None:
            for kind, rid in pairs:
                store.forget(inv, kind, rid)

        made = [r for r in inv.resources if r.region == launch.region]
        destroy_cluster(launch.region, inv.name, made, forget)
