"""The GCP controller's identity (issue 18; docs/ARCHITECTURE.md, managed runs): a service
account per cluster with the narrowest grant that can delete and insert this cluster's VMs.

    service account   mgpu-ctl-<hash of NAME>@PROJECT.iam.gserviceaccount.com, description
                      "mgpu-cloud-cluster=NAME" (service accounts have no labels: `gc` reads it)
    custom role       projects/PROJECT/roles/mgpu_ctl_NAME_<hash>: only the permissions replacing a
                      node takes (ROLE_PERMISSIONS), stage GA
    bindings          on the project's IAM policy, each with an IAM condition:
                        the custom role   -> resource.name is one of the cluster's own
                                             (`cluster_names`: its VMs, disks, policy, firewall
                                             rules, networks by name, the default subnetwork,
                                             its zone's/region's operations)
                        roles/storage.objectAdmin (a gs:// store) -> only objects under
                                             projects/_/buckets/B/objects/PREFIX/NAME/, and
                                             listing the bucket only with a list prefix
                                             under PREFIX/NAME/ (objectListPrefix)
Each piece is recorded the moment it exists (kinds `service-account`, `iam-custom-role`,
`iam-binding`), so rollback and `down` remove it (`delete_identity`, idempotent: 404 is done)
and `gc` finds it (`identity_orphans`). Plain REST through google-auth's AuthorizedSession (no
extra client library); MGPU_CLOUD_GCP_IAM_ENDPOINT points both APIs at a local fake.
The controller VM that runs as this account is controller_vm.py's; it calls
`create_identity` when it makes the controller (the zone is where the nodes landed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

from provision.model.inventory import CLUSTER_TAG, ResourceRecord
from remote.store import StoreURL

IAM_ENDPOINT_ENV = "MGPU_CLOUD_GCP_IAM_ENDPOINT"
IAM_URL = "https://iam.googleapis.com/v1"
CRM_URL = "https://cloudresourcemanager.googleapis.com/v3"
DESCRIPTION = f"{CLUSTER_TAG}="
# Replacing a node (provision/cluster/providers/gcp/replace.py): read, delete and insert
# instances (one instances.insert and instances.get per VM: each names the VM, which the
# resource-name condition can match; never bulkInsert or a zone-wide list, which name only
# the zone's collection), the boot disk that comes with one, attach it to the
# cluster's subnetwork and compact placement policy, set its metadata and labels, read its host
# key (guest attributes), wait for the operations. Deleting the cluster from inside
# (controller_vm.py): its placement policy, firewall rules and GPUDirect networks too.
ROLE_PERMISSIONS = [
    "compute.instances.get", "compute.instances.create",
    "compute.instances.delete", "compute.instances.setMetadata", "compute.instances.setLabels",
    "compute.instances.setScheduling", "compute.instances.setTags",
    "compute.instances.getGuestAttributes",
    "compute.disks.create", "compute.disks.setLabels",
    "compute.subnetworks.use", "compute.subnetworks.useExternalIp",
    "compute.resourcePolicies.use", "compute.zoneOperations.get",
    "compute.resourcePolicies.delete", "compute.firewalls.delete", "compute.networks.delete",
    "compute.subnetworks.delete", "compute.regionOperations.get",
    "compute.globalOperations.get",
    # each resource is read before it is deleted: only the cluster's own goes (teardown.owner)
    "compute.resourcePolicies.get", "compute.firewalls.get", "compute.networks.get",
    "compute.subnetworks.get",
]
Record = Callable[[ResourceRecord], None]


def account_id(cluster: str, nonce: str) -> str:
    """6-30 characters, [a-z][a-z0-9-]*[a-z0-9] ("Create service accounts", IAM docs); unique
    per cluster AND per creation (`nonce`: random, recorded through the resource ids)."""
    return f"mgpu-ctl-{hashlib.sha256((cluster + nonce).encode()).hexdigest()[:16]}"


def role_id(cluster: str, nonce: str) -> str:
    """[a-zA-Z0-9_.], 3-64 characters ("Create and manage custom roles"). A deleted custom
    role's ID cannot be used again for 37 days (same page), so a cluster of the same name made
    again needs another one: the random `nonce` is part of it."""
    return f"mgpu_ctl_{cluster.replace('-', '_')}_{nonce[:8]}"


def bindings(project: str, zone: str, cluster: str, member: str, role: str,
             store: StoreURL | None) -> list[dict[str, Any]]:
    """The conditional bindings the account gets on the project's IAM policy."""
    out = [{
        "role": role, "members": [member],
        "condition": {"title": f"mgpu-cloud {cluster} only",
                      "expression": condition(project, zone, cluster)},
    }]
    if store is not None and store.scheme == "gs":
        out.append({
            "role": "roles/storage.objectAdmin", "members": [member],
            "condition": {"title": f"mgpu-cloud {cluster} store",
                          "expression": store_condition(store, cluster)},
        })
    return out


def store_condition(store: StoreURL, cluster: str) -> str:
    """Objects under PREFIX/NAME/, and listing them. storage.objects.list is checked on the
    BUCKET (resource.name projects/_/buckets/B), so a condition on object names alone never
    allows a listing; the list's prefix is the API attribute
    storage.googleapis.com/objectListPrefix ("IAM Conditions" for Cloud Storage: "Use
    objectListPrefix to limit listing to a prefix"; Resource attributes for IAM Conditions)."""
    folder = "/".join(p for p in (store.prefix, cluster) if p)
    bucket = f"projects/_/buckets/{store.bucket}"
    return (f'resource.name.startsWith("{bucket}/objects/{folder}/") || '
            f'(resource.name == "{bucket}" && api.getAttribute('
            f'"storage.googleapis.com/objectListPrefix", "").startsWith("{folder}/"))')


def cluster_names(project: str, zone: str, cluster: str) -> list[tuple[str, str]]:
    """("prefix" | "exact", resource name) of everything the custom role may act on: the
    cluster's VMs and their boot disks (NAME-node-R, NAME-controller), its placement policy,
    firewall rules and GPUDirect networks/subnets by name (layout.py, gpudirect.py); the
    region's default subnetwork its VMs join; the operations of its zone, region and of the
    project's global scope (read-only; their names are random). Nothing zone- or
    project-wide: a replacement inserts and reads back its one VM by name (replace.py)."""
    p, region = f"projects/{project}", zone.rsplit("-", 1)[0]
    z, r = f"{p}/zones/{zone}", f"{p}/regions/{region}"
    return [
        ("prefix", f"{z}/instances/{cluster}-node-"), ("exact", f"{z}/instances/{cluster}-controller"),
        ("prefix", f"{z}/disks/{cluster}-node-"), ("exact", f"{z}/disks/{cluster}-controller"),
        ("exact", f"{r}/resourcePolicies/{cluster}-compact"),
        ("exact", f"{r}/subnetworks/default"), ("prefix", f"{r}/subnetworks/{cluster}-gpunet-"),
        ("exact", f"{p}/global/firewalls/{cluster}-ssh"),
        ("exact", f"{p}/global/firewalls/{cluster}-internal"),
        ("prefix", f"{p}/global/firewalls/{cluster}-gpunet-"),
        ("prefix", f"{p}/global/networks/{cluster}-gpunet-"),
        ("prefix", f"{z}/operations/"), ("prefix", f"{r}/operations/"),
        ("prefix", f"{p}/global/operations/"),
    ]


def condition(project: str, zone: str, cluster: str) -> str:
    """The custom role's IAM condition ("Overview of IAM Conditions": resource.name with
    startsWith / ==): nothing but `cluster_names`."""
    return " || ".join(f'resource.name.startsWith("{name}")' if how == "prefix"
                       else f'resource.name == "{name}"'
                       for how, name in cluster_names(project, zone, cluster))


class IamApi:
    """The two REST APIs (IAM, Resource Manager) with one authorized session."""

    def __init__(self) -> None:
        # the IAM seam, else the one every Compute client uses (clients.py): a fake then
        # serves both, or answers 404 (no IAM there: nothing to find)
        endpoint = os.environ.get(IAM_ENDPOINT_ENV) or os.environ.get("MGPU_CLOUD_GCP_ENDPOINT")
        if endpoint:
            import requests

            self.session: Any = requests.Session()
            self.iam, self.crm = f"{endpoint}/v1", f"{endpoint}/v3"
        else:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
            self.session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
            self.iam, self.crm = IAM_URL, CRM_URL

    def call(self, method: str, url: str, body: dict[str, Any] | None = None,
             missing_ok: bool = False) -> dict[str, Any]:
        """The JSON answer; {} for a 404 with `missing_ok`; IamError for any other error."""
        res = self.session.request(method, url, json=body, timeout=60)
        if missing_ok and res.status_code == 404:
            return {}
        if res.status_code >= 400:
            raise IamError(res.status_code, f"{method} {url}: HTTP {res.status_code}: "
                                            f"{res.text[:300]}")
        return dict(res.json()) if res.content else {}


class IamError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def create_identity(api: IamApi, project: str, zone: str, cluster: str,
                    store: StoreURL | None, record: Record) -> str:
    """Service account + custom role + conditional bindings; returns the account's email.
    Raises IamError (the caller maps it; rollback is `delete_identity`)."""
    import secrets

    nonce = secrets.token_hex(4)
    sa = api.call("POST", f"{api.iam}/projects/{project}/serviceAccounts", {
        "accountId": account_id(cluster, nonce),
        "serviceAccount": {"displayName": f"mgpu-cloud controller {cluster}"[:100],
                           "description": f"{DESCRIPTION}{cluster}"}})
    email = str(sa["email"])
    record(ResourceRecord(kind="service-account", id=email, name=cluster,
                          extra={"project": project}))
    role = api.call("POST", f"{api.iam}/projects/{project}/roles", {
        "roleId": role_id(cluster, nonce),
        "role": {"title": f"mgpu-cloud controller {cluster}"[:100],
                 "description": f"{DESCRIPTION}{cluster}",
                 "includedPermissions": ROLE_PERMISSIONS, "stage": "GA"}})
    record(ResourceRecord(kind="iam-custom-role", id=str(role["name"]), name=cluster,
                          extra={"project": project}))
    wanted = bindings(project, zone, cluster, f"serviceAccount:{email}", str(role["name"]),
                      store)
    for b in wanted:  # recorded before the policy write: a lost answer is still cleaned up
        record(ResourceRecord(kind="iam-binding", id=f"{b['role']}|{b['members'][0]}",
                              name=cluster, extra={"project": project}))
    _edit_policy(api, project, lambda bs: bs + wanted)
    return email


def _edit_policy(api: IamApi, project: str,
                 change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    """Read-modify-write of the project's policy (etag: a concurrent edit fails, 409)."""
    policy = api.call("POST", f"{api.crm}/projects/{project}:getIamPolicy",
                      {"options": {"requestedPolicyVersion": 3}})
    policy["bindings"] = change(list(policy.get("bindings", [])))
    policy["version"] = 3  # conditional bindings need policy version 3
    api.call("POST", f"{api.crm}/projects/{project}:setIamPolicy", {"policy": policy})


def _marked(api: IamApi, project: str, r: ResourceRecord) -> str | None:
    """The cluster an account / custom role / binding's account is marked for ("description"
    mgpu-cloud-cluster=NAME, read now); "" when it is gone (nothing to delete)."""
    if r.kind == "iam-custom-role":
        found = api.call("GET", f"{api.iam}/{r.id}", missing_ok=True)
        if not found or found.get("deleted"):
            return ""
        return _owner(found.get("description"))
    email = r.id if r.kind == "service-account" else r.id.split("|", 1)[1].removeprefix(
        "serviceAccount:")
    found = api.call("GET", f"{api.iam}/projects/{project}/serviceAccounts/{email}",
                     missing_ok=True)
    return _owner(found.get("description")) if found else ""


def delete_identity(api: IamApi, records: list[ResourceRecord],
                    forget: Callable[[str, str], None], cluster: str | None = None) -> list[str]:
    """Bindings, then the custom role, then the account: each only if IAM shows it (a
    binding: its account) marked for `cluster` (None: each record's `name`, as `gc` found it)
    at that moment; a record naming another cluster's or an unmarked one is refused by name,
    left alone and forgotten. Idempotent; returns problems."""
    problems = []
    by_project: dict[str, list[ResourceRecord]] = {}
    for r in records:
        by_project.setdefault(r.extra.get("project", ""), []).append(r)
    for project, recs in by_project.items():
        mine = []
        for r in recs:
            want = cluster if cluster is not None else r.name
            try:
                marked = _marked(api, project, r)
            except IamError as exc:
                problems.append(f"{r.kind} {r.id}: {exc}")
                continue
            if marked not in ("", want):
                problems.append(f"refused to delete {r.kind} {r.id}: it is marked "
                                f"{DESCRIPTION}{marked}, not {want} (left alone)")
                forget(r.kind, r.id)
            elif marked == "" and r.kind != "iam-binding":
                forget(r.kind, r.id)  # gone already
            else:
                mine.append(r)
        problems += _delete_marked(api, project, mine, forget)
    return problems


def _delete_marked(api: IamApi, project: str, recs: list[ResourceRecord],
                   forget: Callable[[str, str], None]) -> list[str]:
    problems = []
    drop = {r.id for r in recs if r.kind == "iam-binding"}
    if drop:
        try:
            _edit_policy(api, project, _without(drop))
            for rid in drop:
                forget("iam-binding", rid)
        except IamError as exc:
            problems.append(f"bindings in {project}: {exc}")
    for r in (r for r in recs if r.kind == "iam-custom-role"):
        try:
            api.call("DELETE", f"{api.iam}/{r.id}", missing_ok=True)
            forget(r.kind, r.id)
        except IamError as exc:
            problems.append(f"custom role {r.id}: {exc}")
    for r in (r for r in recs if r.kind == "service-account"):
        try:
            api.call("DELETE", f"{api.iam}/projects/{project}/serviceAccounts/{r.id}",
                     missing_ok=True)
            forget(r.kind, r.id)
        except IamError as exc:
            problems.append(f"service account {r.id}: {exc}")
    return problems


def _without(drop: set[str]) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """A policy edit removing our members from the bindings named in `drop`."""

    def change(bs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for b in bs:
            members = [m for m in b.get("members", []) if f"{b['role']}|{m}" not in drop]
            if members:
                out.append({**b, "members": members})
        return out

    return change


def _owner(description: str | None) -> str | None:
    text = description or ""
    return text[len(DESCRIPTION):] if text.startswith(DESCRIPTION) else None


def identity_orphans(api: IamApi, project: str, known: set[str]) -> list[ResourceRecord]:
    """Controller accounts, custom roles and their bindings of clusters not in `known`."""
    found: list[ResourceRecord] = []
    extra = {"project": project}
    accounts = api.call("GET", f"{api.iam}/projects/{project}/serviceAccounts",
                        missing_ok=True)
    emails = {}
    for sa in accounts.get("accounts", []):
        owner = _owner(sa.get("description"))
        if owner is not None and owner not in known:
            emails[f"serviceAccount:{sa['email']}"] = owner
            found.append(ResourceRecord(kind="service-account", id=sa["email"], name=owner,
                                        extra=extra))
    for role in api.call("GET", f"{api.iam}/projects/{project}/roles",
                         missing_ok=True).get("roles", []):
        owner = _owner(role.get("description"))
        if owner is not None and owner not in known and not role.get("deleted"):
            found.append(ResourceRecord(kind="iam-custom-role", id=role["name"], name=owner,
                                        extra=extra))
    policy = api.call("POST", f"{api.crm}/projects/{project}:getIamPolicy",
                      {"options": {"requestedPolicyVersion": 3}}, missing_ok=True)
    for b in policy.get("bindings", []):
        for member in b.get("members", []):
            if member in emails:
                found.append(ResourceRecord(kind="iam-binding", id=f"{b['role']}|{member}",
                                            name=emails[member], extra=extra))
    return found
