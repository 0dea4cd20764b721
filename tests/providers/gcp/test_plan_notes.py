"""What a GCP plan says about buying and fabric, held to what Compute does (issue 38).

--flex-start: the nodes come from one bulkInsert; the field
that makes a flex-start request wait for capacity, InstanceParams.request_valid_for_duration,
belongs to instances.insert's Instance only (google-cloud-compute's compute_v1 types:
Instance.params; BulkInsertInstanceResource and InstanceProperties have no such field), so a
bulkInsert is never queued: Compute gives every node at once or answers with a stockout. The
plan says so, and a stockout moves `up` to the next zone at once.

GPUDirect RDMA (a3-ultragpu, a4-highgpu): not built, and a multi-node plan says so."""

from __future__ import annotations

from fake_compute import FakeCompute

from provision.cluster.providers import get_provider

FLEX = {"machine_type": "a3-highgpu-8g", "flex_start": True}


def test_only_a_single_vm_insert_can_wait_for_capacity() -> None:
    from google.cloud import compute_v1

    def fields(message: type) -> set[str]:
        return {f.name for f in message.meta.fields.values()}  # type: ignore[attr-defined]

    assert "request_valid_for_duration" in fields(compute_v1.InstanceParams)
    assert "params" in fields(compute_v1.Instance)
    assert "params" not in fields(compute_v1.InstanceProperties)
    assert not {"params", "request_valid_for_duration"} & fields(
        compute_v1.BulkInsertInstanceResource)


def test_the_plan_says_flex_start_does_not_wait(fake: FakeCompute, make_spec) -> None:
    """Before: "`up` waits until Compute has placed all nodes (it gives up after 30 min per
    zone)", which nothing in the request made true."""
    plan = get_provider("gcp").plan(make_spec(max_hours=24, gcp=FLEX))
    (note,) = [n for n in plan.notes if n.startswith("flex-start")]
    assert "does not queue" in note and "next zone at once" in note
    assert "waits until" not in " ".join(plan.notes)


def test_a_flex_start_stockout_moves_to_the_next_zone_at_once(fake: FakeCompute, make_spec,
                                                             up) -> None:
    fake.stockout("us-central1-a")
    inv = up(make_spec(max_hours=24, gcp=FLEX))
    assert {n.zone for n in inv.nodes} == {"us-central1-c"}
    first, second = fake.sent("POST", r"instances/bulkInsert$")
    assert "us-central1-a" in first.path and "us-central1-c" in second.path
    for sent in (first, second):
        props = sent.body["instanceProperties"]
        assert props["scheduling"]["provisioningModel"] == "FLEX_START"
        assert "params" not in props  # no such field in a bulkInsert


def test_multi_node_rdma_types_say_their_rdma_is_not_set_up(fake: FakeCompute, make_spec) -> None:
    """a3-ultragpu and a4-highgpu talk over GPUDirect RDMA (RoCE, gIB), which `up` does not
    build: a multi-node plan says so (before: only a3-ultragpu did, a4 said nothing)."""
    for machine in ("a3-ultragpu-8g", "a4-highgpu-8g"):
        plan = get_provider("gcp").plan(make_spec(
            max_hours=24, gcp={"machine_type": machine, "flex_start": True}))
        assert any(n.startswith(f"{machine}: GPUDirect RDMA") and "NOT set up" in n
                   for n in plan.notes), (machine, plan.notes)
    one = get_provider("gcp").plan(make_spec(
        nodes=1, max_hours=24, gcp={"machine_type": "a4-highgpu-8g", "flex_start": True}))
    assert not any("GPUDirect RDMA" in n for n in one.notes)
