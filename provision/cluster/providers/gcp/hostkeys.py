"""The VMs' own SSH host keys, read through the authenticated Compute API (no private key ever
leaves a VM, and none is sent to one).

The guest agent makes the VM's host keys at its first boot and, when the instance metadata has
`enable-guest-attributes=TRUE`, writes each public key as the guest attribute
`hostkeys/<type>` = the base64 blob (GoogleCloudPlatform/guest-agent instance_setup.go,
generateSSHKeys: `writeGuestAttributes("hostkeys/"+vals[0], vals[1])`). The controller reads
them with instances.getGuestAttributes(queryPath="hostkeys/") ("Set and query guest attributes",
https://cloud.google.com/compute/docs/metadata/manage-guest-attributes; `gcloud compute ssh
--strict-host-key-checking` does the same). Until the agent has written them the call answers
404 (or no items): polled, with a bounded wait.

Two writers: on Ubuntu images cloud-init's GCE datasource also publishes the host keys it
makes at first boot to the same guest attributes (cloud-init DataSourceGCE,
publish_host_keys), and the guest agent may make and publish its own: the attribute can change
once after it first appears, and the last writer's keys are the ones sshd serves. So a key is
pinned once two consecutive reads, a poll apart, show the same one (a key that changed is read
again); when the wait runs out, the last key read is pinned.

Trust: the key comes from Compute over TLS, authenticated with the caller's credentials, about
the VM Compute named; it is pinned (sshconn.py) and nothing else is accepted.
"""

from __future__ import annotations

import base64
import os
import struct
import time
from typing import Any

from provision.cluster.providers.gcp.clients import Clients
from provision.model.errors import ProvisionError

DEADLINE_ENV = "MGPU_CLOUD_GCP_HOSTKEY_DEADLINE_S"
POLL_ENV = "MGPU_CLOUD_GCP_HOSTKEY_POLL_S"
DEADLINE_S = 600.0  # boot + the guest agent's first start; GPU images take a few minutes
POLL_S = 5.0
QUERY_PATH = "hostkeys/"
# The key pinned per node: the strongest type the VM published.
PREFERRED = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa")


def _seconds(env: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(env, default)))
    except ValueError:
        return default


def key_line(key_type: str, blob: str) -> str | None:
    """'TYPE BASE64' when `blob` is a well-formed public key of `key_type`, else None."""
    try:
        raw = base64.b64decode(blob.strip(), validate=True)
        (length,) = struct.unpack(">I", raw[:4])
        inner = raw[4:4 + length].decode()
    except (ValueError, struct.error, UnicodeDecodeError):
        return None
    return f"{inner} {blob.strip()}" if inner == key_type else None


def published_key(attributes: Any) -> str | None:
    """The preferred host key among a GuestAttributes answer's `hostkeys/` items."""
    found: dict[str, str] = {}
    for item in attributes.query_value.items if attributes.query_value else []:
        if item.namespace in ("hostkeys", "") and item.key in PREFERRED:
            line = key_line(item.key, item.value)
            if line is not None:
                found[item.key] = line
    return next((found[t] for t in PREFERRED if t in found), None)


def _query(clients: Clients, project: str, zone: str, instance: str) -> str | None:
    from google.cloud import compute_v1

    answer = clients.call_or_none(
        clients.instances.get_guest_attributes,
        compute_v1.GetGuestAttributesInstanceRequest(project=project, zone=zone,
                                                     instance=instance, query_path=QUERY_PATH),
        f"reading the host keys of {instance} (guest attributes)")
    return published_key(answer) if answer is not None else None


def _status(clients: Clients, project: str, zone: str, instance: str) -> str:
    from google.cloud import compute_v1

    inst = clients.call_or_none(clients.instances.get, compute_v1.GetInstanceRequest(
        project=project, zone=zone, instance=instance), f"looking up {instance}")
    return "it no longer exists" if inst is None else f"it is {inst.status}"


def read_host_keys(clients: Clients, zone: str, nodes: dict[str, str],
                   project: str | None = None) -> dict[str, str]:
    """instance name -> 'TYPE BASE64' of every VM in `nodes` (instance name -> node name, for
    messages), polled until each has published its keys. ProvisionError naming every node
    still without one when the wait (MGPU_CLOUD_GCP_HOSTKEY_DEADLINE_S, 600 s) runs out."""
    project = project or clients.project
    deadline = time.monotonic() + _seconds(DEADLINE_ENV, DEADLINE_S)
    poll = _seconds(POLL_ENV, POLL_S)
    keys: dict[str, str] = {}
    seen: dict[str, str] = {}  # the last key read per VM, not yet read twice
    while True:
        for instance in nodes:
            if instance not in keys:
                key = _query(clients, project, zone, instance)
                if key is not None and seen.get(instance) == key:
                    keys[instance] = key  # the same key twice in a row: settled
                elif key is not None:
                    seen[instance] = key
        waiting = [i for i in nodes if i not in keys]
        if not waiting:
            return keys
        if time.monotonic() > deadline:
            keys.update({i: seen[i] for i in waiting if i in seen})  # read once: the last
            waiting = [i for i in nodes if i not in keys]
            if not waiting:
                return keys
            lines = [f"{nodes[i]} ({i}: {_status(clients, project, zone, i)})" for i in waiting]
            raise ProvisionError(
                "no SSH host key was published by " + "; ".join(lines) + f" within "
                f"{_seconds(DEADLINE_ENV, DEADLINE_S):.0f} s (guest attribute {QUERY_PATH}, "
                "written by the VM's guest agent)",
                hint="the boot image needs Google's guest agent (every Deep Learning VM and "
                "public image has it); its serial console says why it did not start: `gcloud "
                f"compute instances get-serial-port-output {waiting[0]} --zone {zone}`")
        time.sleep(poll)
