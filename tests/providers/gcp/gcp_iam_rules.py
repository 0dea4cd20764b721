"""Rules for the GCP controller's grants (issue 18): nothing outside its cluster.

Sources: "Understanding roles" (IAM docs): the basic roles roles/owner, roles/editor,
roles/viewer grant the whole project; "Overview of IAM Conditions": a condition on
resource.name limits a binding to the named resources; "Compute Engine IAM permissions":
the permission names used; Cloud Storage object names in conditions are
projects/_/buckets/BUCKET/objects/OBJECT.
"""

from __future__ import annotations

from typing import Any

BASIC = ("roles/owner", "roles/editor", "roles/viewer")
ALLOWED_PERMISSION_PREFIXES = ("compute.instances.", "compute.disks.create",
                               "compute.disks.setLabels", "compute.subnetworks.use",
                               "compute.resourcePolicies.use", "compute.zoneOperations.get")


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
            if f'/instances/{cluster}-")' not in cond:
                out.append(f"{role}: condition does not name {cluster}'s instances: {cond}")
        elif role == "roles/storage.objectAdmin":
            if store_folder is None or f'/objects/{store_folder}/")' not in cond:
                out.append(f"{role}: condition does not name the store's folder: {cond}")
        elif not role.startswith("projects/"):
            out.append(f"{member}: unexpected role {role}")
    return out
