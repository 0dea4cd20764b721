"""Polite under Kueue (issue 43): --priority labels the JobSet with its WorkloadPriorityClass,
checked at plan time where the user may read it (cluster-scoped: a ClusterRole) and said
unchecked where not; a replacement while Kueue holds the JobSet suspended (it preempted the
workload) waits for the admission, says why, and counts that wait as queued."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import rbac
from standin import OnLog, Standin

from provision.cluster.providers import get_provider
from provision.model import timeline
from provision.model.errors import SpecError, UserInputError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
CLASSES = "kueue.x-k8s.io/v1beta2/workloadpriorityclasses"


def priority_class(s: Standin, name: str, value: int) -> None:
    s.store.create(CLASSES, "", {"metadata": {"name": name}, "value": value,
                                 "description": "test"})


def test_priority_needs_a_queue_and_labels_the_jobset(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    with pytest.raises(UserInputError, match="--priority low .* needs --queue"):
        get_provider("k8s").plan(make_spec(k8s={"priority": "low"}))
    with pytest.raises(SpecError, match="not a WorkloadPriorityClass name"):
        make_spec(k8s={"priority": "Low_1"})
    standin.add_queue("team-q")
    priority_class(standin, "low", 100)
    up(make_spec(k8s={"queue": "team-q", "priority": "low"}))
    labels = standin.store.get(JOBSETS, "default", "c1")["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/priority-class"] == "low"
    assert labels["kueue.x-k8s.io/queue-name"] == "team-q"


def test_the_plan_checks_the_priority_class_where_the_user_may_read_it(
        standin: Standin, make_spec: Callable[..., ClusterSpec]) -> None:
    standin.add_queue("team-q")
    spec = make_spec(k8s={"queue": "team-q", "priority": "urgent"})
    prov = get_provider("k8s")
    # the optional ClusterRole of the docs bound to the user: a class that is not there
    standin.api.incluster.user_cluster_rules = rbac.role(rbac.OPTIONAL)["rules"]
    with pytest.raises(UserInputError, match="no Kueue WorkloadPriorityClass 'urgent'"):
        prov.plan(spec)
    priority_class(standin, "urgent", 1000)
    assert not any("priority" in n and "not checked" in n for n in prov.plan(spec).notes)
    # only the namespace's Role: a cluster-scoped read is forbidden, the plan says so
    standin.api.incluster.user_cluster_rules = []
    notes = prov.plan(spec).notes
    assert any("--priority urgent: not checked" in n for n in notes), notes
    refused = [r for r in standin.api.requests if r.path.endswith("/urgent")]
    assert refused and all("/workloadpriorityclasses/" in r.path for r in refused)


def test_a_replacement_waits_for_kueue_to_admit_the_workload_again(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory], store: InventoryStore) -> None:
    """Kueue preempts the workload: Evicted, the JobSet suspended, its pods deleted. The
    replacement of a rank says why it waits, until Kueue admits it again."""
    standin.add_queue("team-q")
    priority_class(standin, "low", 100)
    inv = up(make_spec(k8s={"queue": "team-q", "priority": "low"}))
    prov: Any = get_provider("k8s")
    standin.kueue.set_quota(0)  # a higher-priority workload takes the quota ...
    standin.kueue.evict("default", "c1")  # ... and Kueue preempts this one
    lost = inv.nodes[1]
    timeline.begin(inv, "recovery")
    readmit = threading.Timer(1.0, standin.kueue.set_quota, args=(8,))
    once = threading.Lock()  # the higher-priority workload ends a second after the wait began

    def free_the_quota(message: str) -> None:
        if once.acquire(blocking=False):
            readmit.start()

    with OnLog("waiting in queue team-q", free_the_quota) as said:
        with timeline.timed(inv, "replacement"):
            new = prov.replace(inv, store, lost)
    assert new.rank == 1 and new.resource_id != lost.resource_id
    assert any("Preempted" in m for m in said.seen), said.seen
    queued = [p for tl in inv.timelines for p in tl.phases if p.phase == "queued"]
    assert queued and (queued[-1].seconds or 0) >= 0.5, inv.timelines


def test_a_pods_term_is_its_notice_and_it_waits_for_the_job(tmp_path: Any) -> None:
    """The start shell's TERM handler (manifests.START) on this machine's sh: it writes the
    notice the node's job supervisor reads (remote/preempt.py "file"), then ends only once
    the job named by the pidfile has ended."""
    import json
    import os
    import subprocess
    import time

    from provision.cluster.providers.k8s.manifests import NOTICE_DIR, ON_TERM
    from remote.preempt import check

    notice = tmp_path / "notice"
    notice.mkdir()
    (tmp_path / ".mgpu-cloud").mkdir()
    job = subprocess.Popen(["sleep", "60"])
    (tmp_path / ".mgpu-cloud" / "job.pid").write_text(f"{job.pid} {job.pid}\n")
    shell = subprocess.Popen(
        ["sh", "-c", ON_TERM.replace(NOTICE_DIR, str(notice))
         + "sleep 300 & pid=$!; trap on_term TERM; echo ready; wait $pid"],
        env={**os.environ, "HOME": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None and shell.stdout.readline().strip() == "ready"
        shell.terminate()
        deadline = time.monotonic() + 10
        while check("file", str(notice)) is None:
            assert time.monotonic() < deadline, "no notice written"
            time.sleep(0.1)
        found = check("file", str(notice))
        assert found is not None and found.action == "terminate" and found.time
        assert json.loads((notice / "instance-action").read_text())["action"] == "terminate"
        time.sleep(1.5)
        assert shell.poll() is None  # the job still runs: the pod waits for its save
        job.kill()
        job.wait()
        assert shell.wait(timeout=10) == 143  # Failed: its index gets a new pod
    finally:
        job.kill()
        shell.kill()


def test_a_pod_being_deleted_is_alive_until_its_grace_is_over(
        standin: Standin, make_spec: Callable[..., ClusterSpec],
        up: Callable[[ClusterSpec], Inventory]) -> None:
    """It still runs, saving after its notice: the liveness poll must not call it lost
    first. Past the time the API said it would be gone (deletionTimestamp), it is lost."""
    from standin_store import now

    inv = up(make_spec())
    prov: Any = get_provider("k8s")
    node = inv.nodes[1]
    standin.kubelet.lose_node(node.address)  # its kubelet ends nothing: it stays deleting
    standin.api.delete("pods", "default", node.address, 60)
    pod = standin.store.get("pods", "default", node.address)
    assert pod["metadata"]["deletionTimestamp"] > now()  # now + its grace, as the API sets
    assert prov.node_alive(inv, node)
    standin.store.update("pods", "default", node.address, lambda o: o["metadata"].update(
        deletionTimestamp=now(-1)))
    assert not prov.node_alive(inv, node)
