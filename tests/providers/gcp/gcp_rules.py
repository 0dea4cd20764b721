"""Compute Engine's documented rules that the fake does not enforce, checked on every request
the provider sends (the fake's capture) and on the state `create` leaves. Every GCP test runs
through them (conftest's autouse `gcp_rules` fixture) and fails on a violation.

Request rules are pure functions `(method, path, body, seen) -> [violation, ...]` where `seen`
is the requests before this one (a bulkInsert's policy is checked against the policy insert
that made it). Each rule names its source: the title of the Google document that states it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Body = dict[str, Any]
Request = tuple[str, str, Any]  # method, path (without /compute/v1/), JSON body
# "Naming resources" / Instance.name in the Compute API reference: "1-63 characters long and
# match the regular expression `[a-z]([-a-z0-9]*[a-z0-9])?`".
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# "Requirements for labels" (Resource Manager): keys 1-63 characters, start with a lowercase
# letter; keys and values only lowercase letters, digits, '_' and '-'; values 0-63; at most 64.
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
# Machine-type families that come with GPUs attached ("GPU machine types", Compute docs).
GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")
MAX_RUN_MIN_S, MAX_RUN_MAX_S = 30, 120 * 24 * 3600
INSERT = re.compile(r"projects/[^/]+/zones/([^/]+)/instances$")
BULK = re.compile(r"projects/[^/]+/zones/([^/]+)/instances/bulkInsert$")
POLICY = re.compile(r"projects/[^/]+/regions/([^/]+)/resourcePolicies$")
FIREWALL = re.compile(r"projects/[^/]+/global/firewalls$")
DELETE_INSTANCE = re.compile(r"projects/[^/]+/zones/([^/]+)/instances/([^/]+)$")
NETWORK = re.compile(r"projects/[^/]+/global/networks$")
SUBNETWORK = re.compile(r"projects/[^/]+/regions/([^/]+)/subnetworks$")
# "Maximum transmission unit" (VPC docs): a network's MTU is 1300..8896 bytes.
MTU_MIN, MTU_MAX = 1300, 8896
# Google's A3 set-up (cluster-toolkit examples/machine-learning/a3-highgpu-8g and a3-megagpu-8g
# blueprints; "GPUDirect-TCPX/TCPXO" docs): besides the primary NIC, 4 (A3 High) or 8 (A3 Mega)
# gVNIC data NICs, each in a VPC network of its own with MTU 8244, one subnet in the VMs'
# region and a firewall rule letting the other nodes' data traffic in.
GPU_DIRECT_NICS = {"a3-highgpu-8g": 4, "a3-megagpu-8g": 8}
GPU_DIRECT_MTU = 8244


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _instances(method: str, path: str, body: Any) -> tuple[str, list[str], Body] | None:
    """(zone, names, properties) of an instance insert or bulkInsert, else None."""
    if method != "POST" or not isinstance(body, dict):
        return None
    if m := INSERT.match(path):
        return m.group(1), [body.get("name", "")], body
    if m := BULK.match(path):
        return m.group(1), list(body.get("perInstanceProperties", {})), \
            body.get("instanceProperties", {})
    return None


def names(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    found = _instances(method, path, body)
    if found is not None:
        candidates = found[1]
    elif method == "POST" and (POLICY.match(path) or FIREWALL.match(path)
                               or NETWORK.match(path) or SUBNETWORK.match(path)):
        candidates = [body.get("name", "")]
    else:
        return []
    return [f"{path}: name {n!r} is not a valid resource name" for n in candidates
            if not NAME_RE.match(n)]


def labels(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    found = _instances(method, path, body)
    if found is None:
        return []
    props = found[2]
    sets = [props.get("labels", {})] + [
        d.get("initializeParams", {}).get("labels", {}) for d in props.get("disks", [])]
    out = []
    for label_set in sets:
        if len(label_set) > 64:
            out.append(f"{path}: {len(label_set)} labels; at most 64")
        for key, value in label_set.items():
            if not LABEL_KEY_RE.match(key):
                out.append(f"{path}: label key {key!r} breaks the label rules")
            if not LABEL_VALUE_RE.match(str(value)):
                out.append(f"{path}: label value {value!r} of {key!r} breaks the label rules")
    return out


def scheduling(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    # "GPU machine types" / "Set VM host maintenance policy": VMs with GPUs cannot live
    # migrate, onHostMaintenance must be TERMINATE. "Limit the run time of a VM":
    # maxRunDuration from 30 seconds to 120 days. Scheduling.instanceTerminationAction and
    # "Create and use Spot VMs": a SPOT VM states what happens when it is stopped.
    found = _instances(method, path, body)
    if found is None:
        return []
    props = found[2]
    sched = props.get("scheduling", {})
    machine = str(props.get("machineType", "")).rsplit("/", 1)[-1]
    out = []
    has_gpus = machine.startswith(GPU_FAMILIES) or bool(props.get("guestAccelerators"))
    if has_gpus and sched.get("onHostMaintenance") != "TERMINATE":
        out.append(f"{path}: GPUs with onHostMaintenance {sched.get('onHostMaintenance')!r}")
    if "maxRunDuration" in sched:
        seconds = int(sched["maxRunDuration"].get("seconds", 0))
        if not MAX_RUN_MIN_S <= seconds <= MAX_RUN_MAX_S:
            out.append(f"{path}: maxRunDuration {seconds} s outside 30 s .. 120 days")
    if sched.get("provisioningModel") == "SPOT" and not sched.get("instanceTerminationAction"):
        out.append(f"{path}: a SPOT VM without an instanceTerminationAction")
    return out


def bulk_properties(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    # "InstanceProperties" (Compute API reference): machineType "only accepts a machine type
    # name ... the full or partial URL ... will result in an INTERNAL_ERROR"; resourcePolicies
    # are "names, not URLs"; disk and accelerator types are names in instance properties.
    # "BulkInsertInstanceResource": minCount <= count.
    if method != "POST" or not BULK.match(path):
        return []
    props = body.get("instanceProperties", {})
    out = []
    urls = [("machineType", props.get("machineType", ""))]
    urls += [("resourcePolicies", p) for p in props.get("resourcePolicies", [])]
    urls += [("diskType", d.get("initializeParams", {}).get("diskType", ""))
             for d in props.get("disks", [])]
    urls += [("acceleratorType", a.get("acceleratorType", ""))
             for a in props.get("guestAccelerators", [])]
    out += [f"{path}: {field} {value!r} must be a name, not a URL"
            for field, value in urls if "/" in str(value)]
    count, min_count = int(body.get("count", 0)), int(body.get("minCount", body.get("count", 0)))
    if not 1 <= min_count <= count:
        out.append(f"{path}: minCount {min_count} / count {count}")
    return out


def _policy_of(ref: str, zone: str) -> tuple[str, str]:
    """(region, name) of a resourcePolicies entry (a name means the VMs' region)."""
    m = re.search(r"regions/([^/]+)/resourcePolicies/([^/]+)$", ref)
    return (m.group(1), m.group(2)) if m else (region_of(zone), ref)


def _members(seen: list[Request], region: str, name: str) -> set[tuple[str, str]]:
    """(zone, VM) asked to join the policy by the requests so far and not deleted since."""
    members: set[tuple[str, str]] = set()
    for method, path, body in seen:
        if method in ("DELETE", "GONE") and (m := DELETE_INSTANCE.match(path)):
            members.discard((m.group(1), m.group(2)))
        elif (found := _instances(method, path, body)) is not None:
            zone, vms, props = found
            if (region, name) in {_policy_of(r, zone) for r in props.get("resourcePolicies", [])}:
                members |= {(zone, vm) for vm in vms}
    return members


def collocated(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    # "Placement policies" / ResourcePolicyGroupPlacementPolicy.vmCount: a compact policy with
    # vmCount works "only if it contains this exact number of VMs": it never holds more (a
    # replacement is made after the VM it replaces is deleted; the state rule checks the exact
    # count after `up` and after each replacement); resource policies are regional and apply
    # to VMs of their region ("About placement policies").
    found = _instances(method, path, body)
    if found is None:
        return []
    zone, vms, props = found
    out = []
    for ref in props.get("resourcePolicies", []):
        region, name = _policy_of(ref, zone)
        if region != region_of(zone):
            out.append(f"{path}: policy {name} of {region} used by VMs in {zone}")
        made = [b for meth, p, b in seen if meth == "POST" and (pm := POLICY.match(p))
                and pm.group(1) == region and isinstance(b, dict) and b.get("name") == name]
        count = (made[-1].get("groupPlacementPolicy", {}).get("vmCount") if made else None)
        total = len(_members(seen, region, name) | {(zone, vm) for vm in vms})
        if count is not None and total > int(count):
            out.append(f"{path}: policy {name} has vmCount {count}, {total} VMs use it")
    return out


def _last(seen: list[Request], pattern: re.Pattern[str], name: str,
          region: str | None = None) -> Body | None:
    """The body of the last POST matching `pattern` that made `name` (in `region`)."""
    for method, path, body in reversed(seen):
        m = pattern.match(path)
        if (method == "POST" and m and isinstance(body, dict) and body.get("name") == name
                and (region is None or m.group(1) == region)):
            return body
    return None


def _name_of(link: Any) -> str:
    return str(link or "").rstrip("/").rsplit("/", 1)[-1]


def networks(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    if method != "POST" or not NETWORK.match(path) or not isinstance(body, dict):
        return []
    mtu = int(body.get("mtu", 1460))
    return [] if MTU_MIN <= mtu <= MTU_MAX else [f"{path}: MTU {mtu} outside 1300..8896"]


def gpudirect_nics(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    found = _instances(method, path, body)
    if found is None:
        return []
    zone, _vms, props = found
    machine = _name_of(props.get("machineType"))
    nics = props.get("networkInterfaces", [])
    if machine not in GPU_DIRECT_NICS or len(nics) <= 1:  # one NIC: no GPUDirect (one node)
        return []
    data = GPU_DIRECT_NICS[machine]
    out = []
    if len(nics) != 1 + data:
        out.append(f"{path}: {machine} with {len(nics)} NICs; GPUDirect has 1 + {data}")
    nets = [_name_of(n.get("network")) for n in nics]
    if len(set(nets)) != len(nets):
        out.append(f"{path}: NICs share a VPC network ({', '.join(nets)})")
    out += [f"{path}: NIC {i} is {n.get('nicType')!r}, not GVNIC"
            for i, n in enumerate(nics) if n.get("nicType") != "GVNIC"]
    region = region_of(zone)
    for i, nic in enumerate(nics[1:], 1):
        net = nets[i]
        if nic.get("accessConfigs"):
            out.append(f"{path}: data NIC {i} has an external address")
        made = _last(seen, NETWORK, net)
        if made is None:
            out.append(f"{path}: data NIC {i}: network {net} was not created first")
        elif int(made.get("mtu", 1460)) != GPU_DIRECT_MTU or made.get("autoCreateSubnetworks"):
            out.append(f"{path}: data NIC {i}: network {net} has MTU {made.get('mtu')}, "
                       f"automatic subnets {made.get('autoCreateSubnetworks')}")
        sub = _last(seen, SUBNETWORK, _name_of(nic.get("subnetwork")), region)
        if sub is None or _name_of(sub.get("network")) != net:
            out.append(f"{path}: data NIC {i}: no subnet of {net} in {region}")
        walls = [b for m, p, b in seen if m == "POST" and FIREWALL.match(p)
                 and isinstance(b, dict) and _name_of(b.get("network")) == net
                 and b.get("direction", "INGRESS") == "INGRESS" and b.get("allowed")]
        if sub is not None and not any(sub.get("ipCidrRange") in w.get("sourceRanges", [])
                                       for w in walls):
            out.append(f"{path}: data NIC {i}: no firewall rule lets {net}'s subnet in")
    return out


# "About VM metadata" (https://cloud.google.com/compute/docs/metadata/overview): metadata is
# readable by every process on the VM and by anyone who may read the instance; a private key
# has no place in it. Host keys are published by the VM instead (guest attributes).
PRIVATE_KEY_RE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|\bPuTTY-User-Key-File")


def no_private_keys(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    found = _instances(method, path, body)
    if found is None:
        return []
    items = found[2].get("metadata", {}).get("items", [])
    return [f"{path}: metadata {i.get('key')!r} carries a private key" for i in items
            if PRIVATE_KEY_RE.search(str(i.get("value", "")))]


# How each machine type can be bought ("Consumption options",
# https://cloud.google.com/ai-hypercomputer/docs/consumption-models; "About Flex-start VMs",
# https://cloud.google.com/compute/docs/instances/about-flex-start-vms; "Consume reservations:
# Limitations", https://cloud.google.com/compute/docs/instances/reservations-consume; "About
# reservation-bound instances"): A3 Ultra / A4 / A4X are not sold on demand; flex-start VMs run
# at most 7 days, state a termination action, consume no reservation and are
# accelerator-optimized types (not A4X/G4, not N1 + guest GPUs); Spot VMs consume no
# reservation; RESERVATION_BOUND VMs name their reservation.
NO_ON_DEMAND = ("a3-ultragpu-", "a4-highgpu-", "a4x-")
FLEX_FAMILIES = ("a2-", "a3-", "a4-", "g2-")
FLEX_MAX_S = 7 * 24 * 3600


def purchase(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    found = _instances(method, path, body)
    if found is None:
        return []
    props = found[2]
    machine = _name_of(props.get("machineType"))
    sched = props.get("scheduling", {})
    model = sched.get("provisioningModel", "STANDARD")
    affinity = props.get("reservationAffinity", {}).get("consumeReservationType",
                                                        "ANY_RESERVATION")
    out = []
    if model == "STANDARD" and machine.startswith(NO_ON_DEMAND) and \
            affinity != "SPECIFIC_RESERVATION":
        out.append(f"{path}: {machine} on demand (sold as reservations, flex-start, spot)")
    if model == "FLEX_START":
        seconds = int(sched.get("maxRunDuration", {}).get("seconds", 0))
        if not 0 < seconds <= FLEX_MAX_S:
            out.append(f"{path}: FLEX_START with maxRunDuration {seconds} s (1 s .. 7 days)")
        if not sched.get("instanceTerminationAction"):
            out.append(f"{path}: FLEX_START without an instanceTerminationAction")
        if affinity != "NO_RESERVATION":
            out.append(f"{path}: FLEX_START with reservation affinity {affinity}")
        if not machine.startswith(FLEX_FAMILIES) or props.get("guestAccelerators"):
            out.append(f"{path}: FLEX_START on {machine}")
    if model == "SPOT" and affinity == "SPECIFIC_RESERVATION":
        out.append(f"{path}: a SPOT VM consuming a reservation")
    if model == "RESERVATION_BOUND" and affinity != "SPECIFIC_RESERVATION":
        out.append(f"{path}: RESERVATION_BOUND without a specific reservation")
    if affinity == "SPECIFIC_RESERVATION":
        aff = props["reservationAffinity"]
        if aff.get("key") != "compute.googleapis.com/reservation-name" or not aff.get("values"):
            out.append(f"{path}: SPECIFIC_RESERVATION needs key "
                       "compute.googleapis.com/reservation-name and the reservation's name")
    return out


# "Accelerator-optimized machine family" (https://cloud.google.com/compute/docs/
# accelerator-optimized-machines, supported disk types): A3 Ultra, A4 and A4X take Hyperdisk
# only (no Persistent Disk).
HYPERDISK_ONLY = ("a3-ultragpu-", "a4-", "a4x-")


def disk_types(method: str, path: str, body: Any, seen: list[Request]) -> list[str]:
    found = _instances(method, path, body)
    if found is None:
        return []
    machine = _name_of(found[2].get("machineType"))
    if not machine.startswith(HYPERDISK_ONLY):
        return []
    kinds = [_name_of(d.get("initializeParams", {}).get("diskType", "pd-standard"))
             for d in found[2].get("disks", [])]
    return [f"{path}: {machine} with a {k} disk (Hyperdisk only)" for k in kinds
            if not k.startswith("hyperdisk-")]


REQUEST_RULES: list[Callable[[str, str, Any, list[Request]], list[str]]] = [
    names, labels, scheduling, bulk_properties, collocated, networks, gpudirect_nics,
    no_private_keys, purchase, disk_types,
]


def check_requests(requests: list[Request]) -> list[str]:
    out: list[str] = []
    for i, (method, path, body) in enumerate(requests):
        for rule in REQUEST_RULES:
            out += rule(method, path, body, requests[:i])
    return out


def check_state(instances: dict[tuple[str, str, str], Body],
                policies: dict[tuple[str, str, str], Body]) -> list[str]:
    """After `create`: every compact policy with a vmCount is used by exactly that many VMs,
    all in its region (the same sources as `collocated`)."""
    out = []
    for (project, region, name), policy in policies.items():
        link = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        users = [(z, n) for (p, z, n), inst in instances.items()
                 if any(str(r).endswith(link) for r in inst.get("resourcePolicies", []))]
        count = policy.get("groupPlacementPolicy", {}).get("vmCount")
        if users and count is not None and int(count) != len(users):
            out.append(f"policy {name}: vmCount {count}, used by {len(users)} VMs")
        out += [f"policy {name} of {region} used by {n} in {z}" for z, n in users
                if region_of(z) != region]
    return out
