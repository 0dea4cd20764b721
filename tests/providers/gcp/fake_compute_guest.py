"""What a VM's guest agent publishes, as a mixin of FakeCompute (fake_compute.py): its SSH host
keys as guest attributes, some time after the VM is RUNNING.

Served like the real API (instances.getGuestAttributes, "Set and query guest attributes",
https://cloud.google.com/compute/docs/metadata/manage-guest-attributes):
    - the VM must exist (404) and have metadata enable-guest-attributes=TRUE, else the guest
      agent cannot write and the API refuses (400);
    - the guest agent writes `hostkeys/<type>` = the base64 blob of each host key it made at
      first boot (GoogleCloudPlatform/guest-agent instance_setup.go); until then the query
      answers 404. `hostkey_polls` (default 1) is how many queries per VM come before that:
      the first query after the VM is made finds nothing, as on a VM still booting; a VM named
      in `silent_vms` never publishes (an image without the guest agent);
    - a second writer: on Ubuntu, cloud-init's GCE datasource publishes the keys IT made to
      the same attributes (cloud-init DataSourceGCE.publish_host_keys); with `republish_at`
      = N, the VM's N-th query finds that writer's keys (`second_keys`, made at boot: they
      are what its sshd serves) instead of the first writer's.
Each VM's keys are real key pairs made by the fake (`host_keys[(project, zone, name)]`, the
public halves, "TYPE BASE64"), new for every VM made, also for one that takes an old name.
"""

from __future__ import annotations

import base64
from typing import Any

from fake_compute_catalog import HttpError

GUEST_ROUTES: list[tuple[str, str, str]] = [
    ("GET", r"projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/getGuestAttributes$",
     "_get_guest_attributes"),
]


def new_host_keys() -> dict[str, str]:
    """type -> 'TYPE BASE64' of freshly made ed25519 and ecdsa host keys."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    out = {}
    for key in (ed25519.Ed25519PrivateKey.generate(), ec.generate_private_key(ec.SECP256R1())):
        line = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                             serialization.PublicFormat.OpenSSH).decode()
        out[line.split()[0]] = line
    return out


def _blob_type(line: str) -> str:
    raw = base64.b64decode(line.split()[1])
    return raw[4:4 + int.from_bytes(raw[:4], "big")].decode()


class GuestMixin:
    instances: dict[tuple[str, str, str], dict[str, Any]]
    host_keys: dict[tuple[str, str, str], dict[str, str]]
    guest_polls: dict[tuple[str, str, str], int]
    hostkey_polls: int
    silent_vms: set[str]

    def _init_guest(self) -> None:
        self.host_keys = {}
        self.guest_polls = {}
        self.hostkey_polls = 1
        self.silent_vms = set()
        self.republish_at: int | None = None
        self.second_keys: dict[tuple[str, str, str], dict[str, str]] = {}

    def vm_booted(self, key: tuple[str, str, str]) -> None:
        """A VM was made under `key`: new host keys, nothing published yet."""
        self.host_keys[key] = new_host_keys()
        self.second_keys[key] = new_host_keys()
        self.guest_polls[key] = 0

    def _get_guest_attributes(self, project: str, zone: str, name: str,
                              query: dict[str, str], **_: Any) -> tuple[int, Any]:
        key = (project, zone, name)
        inst = self.instances.get(key)
        if inst is None:
            raise HttpError(404, "notFound", f"instance {name} not found")
        meta = {i["key"]: i["value"] for i in inst.get("metadata", {}).get("items", [])}
        if str(meta.get("enable-guest-attributes", "")).upper() != "TRUE":
            raise HttpError(400, "badRequest", f"guest attributes are disabled for {name}")
        self.guest_polls[key] = self.guest_polls.get(key, 0) + 1
        path = query.get("queryPath", "")
        if (self.guest_polls[key] <= self.hostkey_polls or name in self.silent_vms
                or not path.startswith("hostkeys")):
            raise HttpError(404, "notFound", f"guest attributes {path} of {name} not found")
        if self.guest_polls[key] == self.republish_at:
            self.host_keys[key] = self.second_keys[key]  # the second writer's replace the first
        items = [{"namespace": "hostkeys", "key": _blob_type(line), "value": line.split()[1]}
                 for line in self.host_keys.get(key, {}).values()]
        return 200, {"kind": "compute#guestAttributes", "queryPath": path,
                     "queryValue": {"items": items}}
