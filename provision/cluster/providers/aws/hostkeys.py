"""The host keys of new nodes, read from EC2's console output: no private key is ever sent.

Each instance keeps the host keys it generates at first boot (the user data deletes any key
baked into the AMI first: `ssh_deletekeys`). cloud-init's keys_to_console module then prints
them on the serial console (canonical/cloud-init tools/write-ssh-key-fingerprints, through
`logger --stderr`, so every line may carry a syslog prefix such as "<14>Oct 21 ... ec2: "):

    -----BEGIN SSH HOST KEY FINGERPRINTS-----
    256 SHA256:0aBc... root@ip-172-31-0-10 (ED25519)
    -----END SSH HOST KEY FINGERPRINTS-----
    -----BEGIN SSH HOST KEY KEYS-----
    ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI... root@ip-172-31-0-10
    -----END SSH HOST KEY KEYS-----

GetConsoleOutput is an authenticated API call about ONE instance id, and only that instance
writes its console, so the key it shows is the node's own. `Latest=True` returns the most
recent 64 KB at any time on Nitro instances (every GPU type here) instead of a snapshot taken
at state changes ("Instance console output", EC2 User Guide). The output comes back
base64-encoded; botocore decodes it (its `decode_console_output` handler).

Trust on nothing: a node's key is accepted only when its console shows exactly one well-formed
ed25519 key whose SHA256 fingerprint (when the fingerprint block lists one) matches; a node
whose key never shows up within the bounded wait, or shows up inconsistent, is refused with an
error naming it. The caller then rolls back (up) or undoes the replacement.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
import time
from dataclasses import dataclass, field

from provision.cluster.providers.aws import retry
from provision.cluster.providers.aws.api import Ec2
from provision.model.errors import ProvisionError

KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
KEYS_END = "-----END SSH HOST KEY KEYS-----"
FP_BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
FP_END = "-----END SSH HOST KEY FINGERPRINTS-----"
KEY_LINE = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp\d+|ssh-rsa|ssh-dss)\s+([A-Za-z0-9+/]+=*)")
FP_LINE = re.compile(r"\d+\s+(SHA256:[A-Za-z0-9+/]+=*)\s.*\((\w+)\)\s*$")


class HostKeyRefused(ProvisionError):
    """A node's console shows a host key that cannot be trusted (never retried)."""


@dataclass
class ConsoleKeys:
    keys: list[tuple[str, str]] = field(default_factory=list)  # (type, base64), in order
    fingerprints: dict[str, set[str]] = field(default_factory=dict)  # "ED25519" -> {SHA256:..}


def _blocks(text: str, begin: str, end: str) -> list[list[str]]:
    """The lines between every begin/end marker pair (a marker may follow a log prefix)."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for line in text.replace("\r", "").split("\n"):
        if begin in line:
            current = []
        elif end in line:
            if current is not None:
                out.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return out


def parse_console(text: str) -> ConsoleKeys:
    """Every host key and fingerprint cloud-init printed (complete blocks only)."""
    found = ConsoleKeys()
    for block in _blocks(text, KEYS_BEGIN, KEYS_END):
        for line in block:
            match = KEY_LINE.search(line)
            if match:
                found.keys.append((match.group(1), match.group(2)))
    for block in _blocks(text, FP_BEGIN, FP_END):
        for line in block:
            match = FP_LINE.search(line)
            if match:
                found.fingerprints.setdefault(match.group(2).upper(), set()).add(match.group(1))
    return found


def fingerprint(b64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob ('SHA256:...', no padding)."""
    digest = hashlib.sha256(base64.b64decode(b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _is_ed25519_blob(b64: str) -> bool:
    """RFC 8709: string "ssh-ed25519", string key (32 bytes), nothing else."""
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        (n,) = struct.unpack(">I", blob[:4])
        name, rest = blob[4:4 + n], blob[4 + n:]
        (k,) = struct.unpack(">I", rest[:4])
    except struct.error:
        return False
    return name == b"ssh-ed25519" and k == 32 and len(rest) == 4 + 32


def ed25519_key(text: str, node: str) -> str | None:
    """The node's ed25519 host key ('ssh-ed25519 BASE64') from its console output; None while
    cloud-init has not printed it yet. HostKeyRefused when what is printed cannot be trusted:
    a malformed key, two different ed25519 keys, or a key its own fingerprint line contradicts."""
    found = parse_console(text)
    keys = {b64 for kind, b64 in found.keys if kind == "ssh-ed25519"}
    if not keys:
        return None
    if len(keys) > 1:
        raise HostKeyRefused(f"{node}: its console shows {len(keys)} different ed25519 host "
                             "keys; refusing to pick one")
    (b64,) = keys
    if not _is_ed25519_blob(b64):
        raise HostKeyRefused(f"{node}: the ed25519 host key on its console is malformed")
    listed = found.fingerprints.get("ED25519")
    if listed and listed != {fingerprint(b64)}:
        raise HostKeyRefused(
            f"{node}: the ed25519 host key on its console ({fingerprint(b64)}) does not match "
            f"the fingerprint printed with it ({', '.join(sorted(listed))}); refusing it")
    return f"ssh-ed25519 {b64}"


def console_text(ec2: Ec2, instance_id: str) -> str:
    answer = ec2.call("get_console_output", InstanceId=instance_id, Latest=True)
    return str(answer.get("Output") or "")


def wait_host_keys(ec2: Ec2, nodes: dict[str, str]) -> dict[str, str]:
    """{instance id: 'ssh-ed25519 BASE64'} for every instance of `nodes` ({instance id: node
    name}), polling each one's console until its key shows (one GetConsoleOutput per pending
    node and round; EC2 has no batch form). ProvisionError naming the nodes whose key did not show within
    RetryPolicy.host_key_timeout_s; HostKeyRefused at once for an untrustworthy one."""
    p = retry.policy()
    deadline = time.monotonic() + p.host_key_timeout_s
    keys: dict[str, str] = {}
    while True:
        for iid, name in nodes.items():
            if iid not in keys:
                key = ed25519_key(console_text(ec2, iid), f"{name} ({iid})")
                if key is not None:
                    keys[iid] = key
        missing = [f"{name} ({iid})" for iid, name in nodes.items() if iid not in keys]
        if not missing:
            return keys
        if time.monotonic() >= deadline:
            raise ProvisionError(
                f"no ed25519 host key on the console of {', '.join(missing)} after "
                f"{p.host_key_timeout_s:.0f} s: the node cannot be verified, so it is not used",
                hint="cloud-init prints the keys at the end of first boot; a custom --ami "
                     "must run cloud-init with keys_to_console (Ubuntu and the Deep Learning "
                     "AMIs do); look at the node's console: aws ec2 get-console-output "
                     "--latest --instance-id ID")
        # EC2 has no batch form of GetConsoleOutput: keep a large cluster's polling near
        # four calls a second (it shares the account's request rate with everything else)
        time.sleep(p.poll_interval_s * max(1, -(-len(missing) // 20)))
