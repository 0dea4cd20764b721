"""Rules for the GCP controller's grants (issue 18): nothing outside its cluster.

Sources: "Understanding roles" (IAM docs): the basic roles roles/owner, roles/editor,
roles/viewer grant the whole project; "Overview of IAM Conditions": a condition on
resource.name limits a binding to the named resources; "Compute Engine IAM permissions":
the permission names used; Cloud Storage object names in conditions are
projects/_/buckets/BUCKET/objects/OBJECT.
"""

from __future__ import annotations

import re
from typing import Any

BASIC = ("roles/owner", "roles/editor", "roles/viewer")
ALLOWED_PERMISSION_PREFIXES = ("compute.instances.", "compute.disks.create",
                               "compute.disks.setLabels", "compute.subnetworks.use",
                               "compute.resourcePolicies.use", "compute.zoneOperations.get",
                               # deleting the cluster from inside (its own names only)
                               "compute.resourcePolicies.delete", "compute.firewalls.delete",
                               "compute.networks.delete", "compute.subnetworks.delete",
                               "compute.regionOperations.get", "compute.globalOperations.get",
                               # reading each one first: is it the cluster's own (issue 34)
                               "compute.resourcePolicies.get", "compute.firewalls.get",
                               "compute.networks.get", "compute.subnetworks.get")
TERM = re.compile(r'^resource\.name(?:\.startsWith\("([^"]+)"\)| == "([^"]+)")$')
# names that are not the cluster's but that it must use or read: the region's default
# subnetwork, operations (random names, read-only)
SHARED = (re.compile(r"^projects/[^/]+/regions/[^/]+/subnetworks/default$"),
          re.compile(r"^projects/[^/]+/(zones/[^/]+/|regions/[^/]+/|global/)operations/$"))


def condition_terms(cond: str) -> list[str] | None:
    """The names of a disjunction of resource.name tests; None when a term is anything else
    (e.g. `resource.type != ...`, which grants every other resource type in the project)."""
    names = []
    for term in cond.split(" || "):
        m = TERM.match(term.strip())
        if m is None:
            return None
        names.append(m.group(1) or m.group(2))
    return names


def _outside(cluster: str, names: list[str]) -> list[str]:
    return [n for n in names if not any(rx.match(n) for rx in SHARED)
            and not n.rsplit("/", 1)[-1].startswith(f"{cluster}-")]


def check_grants(cluster: str, member: str, policy: dict[str, Any],
                 roles: dict[str, dict[str, Any]], store_folder: str | None) -> list[str]:
    out = []
    for b in policy.get("bindings", []):
        if member not in b.get("members", []):
            continue
        role, cond = b["role"], (b.get("condition") or {}).get("expression", "")
        if role in BASIC or role == "roles/compute.admin":
            out.append(f"{member} has the project-wide role {role}")
        if not cond:
            out.append(f"{member}: {role} without a condition")
        if role.startswith("projects/"):
            perms = roles.get(role, {}).get("includedPermissions", [])
            wide = [p for p in perms if "*" in p or not p.startswith(ALLOWED_PERMISSION_PREFIXES)]
            if wide:
                out.append(f"{role}: permissions beyond replacing a node: {wide}")
            names = condition_terms(cond)
            if names is None:
                out.append(f"{role}: condition has a term beyond resource names: {cond}")
            elif not any(f"/instances/{cluster}-" in n for n in names):
                out.append(f"{role}: condition does not name {cluster}'s instances: {cond}")
            elif _outside(cluster, names):
                out.append(f"{role}: condition names what is not {cluster}'s: "
                           f"{_outside(cluster, names)}")
        elif role == "roles/storage.objectAdmin":
            if store_folder is None or f'/objects/{store_folder}/")' not in cond:
                out.append(f"{role}: condition does not name the store's folder: {cond}")
        elif not role.startswith("projects/"):
            out.append(f"{member}: unexpected role {role}")
    return out


# --- an evaluator over the Compute requests a test made --------------------------------------
# Sources: "Compute Engine IAM permissions" / the API reference's "IAM permissions" section of
# each method: instances.insert / bulkInsert need compute.instances.create on each VM,
# compute.disks.create on its boot disk, compute.subnetworks.use (+ useExternalIp with an
# access config) on the subnetwork, compute.instances.setMetadata / setLabels / setTags /
# setServiceAccount for what the body sets, compute.resourcePolicies.use on its policies;
# get, delete, getGuestAttributes: compute.instances.<method>; operations: compute.
# {zone,region,global}Operations.get. The resource name is the path without /compute/v1/.
# A request on a collection (bulkInsert, list) names no single resource ("Resource attributes
# for IAM Conditions" gives instance names as projects/P/zones/Z/instances/NAME and documents
# none for such requests): the evaluator checks it against the collection's own name
# (.../instances), which a condition naming the cluster's VMs never matches: unverifiable is
# refused, never assumed allowed.
OPS = re.compile(r"^(projects/[^/]+/(?:zones/[^/]+|regions/[^/]+|global))/operations/[^/]+"
                 r"(?:/wait)?$")
SCOPE_OF = {"zones": "zoneOperations", "regions": "regionOperations", "global": "globalOperations"}
DELETES = {"firewalls": "compute.firewalls.delete", "networks": "compute.networks.delete",
           "subnetworks": "compute.subnetworks.delete",
           "resourcePolicies": "compute.resourcePolicies.delete",
           "instances": "compute.instances.delete"}


def _created(project: str, zone: str, name: str, props: dict[str, Any]) -> list[tuple[str, str]]:
    region = zone.rsplit("-", 1)[0]
    z = f"projects/{project}/zones/{zone}"
    out = [("compute.instances.create", f"{z}/instances/{name}"),
           ("compute.disks.create", f"{z}/disks/{name}")]
    for nic in props.get("networkInterfaces", []):
        sub = nic.get("subnetwork") or "default"
        sub_name = f"projects/{project}/regions/{region}/subnetworks/{sub.rsplit('/', 1)[-1]}"
        out.append(("compute.subnetworks.use", sub_name))
        if nic.get("accessConfigs"):
            out.append(("compute.subnetworks.useExternalIp", sub_name))
    for key, perm in (("metadata", "setMetadata"), ("labels", "setLabels"), ("tags", "setTags"),
                      ("serviceAccounts", "setServiceAccount")):
        if props.get(key):
            out.append((f"compute.instances.{perm}", f"{z}/instances/{name}"))
    for link in props.get("resourcePolicies", []):
        out.append(("compute.resourcePolicies.use",
                    f"projects/{project}/regions/{region}/resourcePolicies/"
                    f"{link.rsplit('/', 1)[-1]}"))
    return out


def needed(method: str, path: str, body: Any) -> list[tuple[str, str]] | None:
    """(permission, resource name) pairs one request needs; None: no row for it here."""
    if (m := OPS.match(path)) is not None:
        scope = m.group(1).split("/")[2]
        return [(f"compute.{SCOPE_OF[scope]}.get", path.removesuffix("/wait"))]
    parts = path.split("/")
    if method == "POST" and re.match(r"^projects/[^/]+/zones/[^/]+/instances/bulkInsert$", path):
        return [("compute.instances.create", path.removesuffix("/bulkInsert"))]
    if method == "POST" and re.match(r"^projects/[^/]+/zones/[^/]+/instances$", path):
        return _created(parts[1], parts[3], body["name"], body)
    if method == "GET" and re.match(r"^projects/[^/]+/zones/[^/]+/instances$", path):
        return [("compute.instances.list", path)]  # the collection (see above)
    if re.match(r"^projects/[^/]+/zones/[^/]+/instances/[^/]+$", path):
        return [("compute.instances.get" if method == "GET" else DELETES["instances"], path)]
    if re.match(r"^projects/[^/]+/zones/[^/]+/instances/[^/]+/getGuestAttributes$", path):
        return [("compute.instances.getGuestAttributes", path.rsplit("/", 1)[0])]
    if method == "DELETE" and len(parts) >= 4 and parts[-2] in DELETES:
        return [(DELETES[parts[-2]], path)]
    if method == "GET" and len(parts) >= 4 and parts[-2] in DELETES:  # get: read before delete
        return [(DELETES[parts[-2]].replace(".delete", ".get"), path)]
    return None


def condition_allows(cond: str, resource: str) -> bool:
    for term in cond.split(" || "):
        m = TERM.match(term.strip())
        if m is not None and (resource.startswith(m.group(1)) if m.group(1)
                              else resource == m.group(2)):
            return True
    return False


def denied(requests: list[tuple[str, str, Any]], permissions: list[str],
           cond: str) -> list[str]:
    """Each request the custom role (its permissions, its binding's condition) would refuse."""
    out = []
    for method, path, body in requests:
        pairs = needed(method, path, body)
        if pairs is None:
            out.append(f"{method} {path}: no permission table entry")
            continue
        for perm, resource in pairs:
            if perm not in permissions:
                out.append(f"{method} {path}: the role lacks {perm}")
            elif not condition_allows(cond, resource):
                out.append(f"{method} {path}: the condition refuses {perm} on {resource}")
    return out


# --- Cloud Storage under a condition -----------------------------------------------------------
# "IAM Conditions" for Cloud Storage / "Resource attributes for IAM Conditions": object
# permissions are checked on projects/_/buckets/B/objects/NAME; storage.objects.list on the
# bucket, projects/_/buckets/B, with the list's prefix in the API attribute
# storage.googleapis.com/objectListPrefix (empty when the list has none).
STORAGE_TERM = re.compile(
    r'^(?:resource\.name\.startsWith\("([^"]+)"\)|resource\.name == "([^"]+)"|'
    r'api\.getAttribute\("storage\.googleapis\.com/objectListPrefix", ""\)'
    r'\.startsWith\("([^"]+)"\))$')


def _storage_term(term: str, resource: str, prefix: str) -> bool:
    m = STORAGE_TERM.match(term.strip())
    if m is None:
        raise ValueError(f"a condition term this evaluator does not read: {term!r}")
    starts, equals, list_prefix = m.groups()
    if starts is not None:
        return resource.startswith(starts)
    if equals is not None:
        return resource == equals
    return prefix.startswith(list_prefix)


def storage_allows(cond: str, permission: str, bucket: str, name: str = "",
                   prefix: str = "") -> bool:
    """Whether `cond` allows `permission` on object `name` of `bucket` (storage.objects.list:
    on the bucket, listing with `prefix`). Disjunctions of terms or of (a && b) groups."""
    resource = (f"projects/_/buckets/{bucket}" if permission == "storage.objects.list"
                else f"projects/_/buckets/{bucket}/objects/{name}")
    for part in cond.split(" || "):
        part = part.strip()
        if part.startswith("("):  # a group: (a && b)
            part = part[1:].removesuffix(")")
        terms = part.split(" && ")
        if all(_storage_term(t, resource, prefix) for t in terms):
            return True
    return False
