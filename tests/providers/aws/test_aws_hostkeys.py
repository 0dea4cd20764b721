"""Host keys pinned without sending a private key: each node keeps the key it makes at first
boot, and `up` / `replace` read it from the node's console (GetConsoleOutput, hostkeys.py).
The rules layer refuses any RunInstances whose user data carries a private key."""

from __future__ import annotations

import base64

import aws_rules as rules
import pytest
from aws_console import console_output

from provision.cluster.providers.aws import hostkeys, retry
from provision.model.errors import ProvisionError
from provision.model.keys import generate_ed25519, host_key_only

KEY = host_key_only(generate_ed25519().public_openssh)
OTHER = host_key_only(generate_ed25519().public_openssh)


def test_up_pins_the_key_each_node_printed_on_its_console(fakes, spec_for, up_cluster, tagged):
    inv = up_cluster(spec_for(nodes=3))
    assert [n.host_key for n in inv.nodes] == [fakes.host_key(n.resource_id) for n in inv.nodes]
    assert len({n.host_key for n in inv.nodes}) == 3  # every node its own key
    (run,) = fakes.calls("RunInstances")
    assert "PRIVATE KEY" not in base64.b64decode(run["UserData"]).decode()
    reads = fakes.calls("GetConsoleOutput")
    assert {r["InstanceId"] for r in reads} == {n.resource_id for n in inv.nodes}
    assert all(r["Latest"] is True for r in reads)


def test_keys_that_appear_later_are_waited_for(fakes, spec_for, up_cluster):
    fakes.console_delay = 3  # three polls see only boot messages
    inv = up_cluster(spec_for(nodes=2))
    assert all(n.host_key == fakes.host_key(n.resource_id) for n in inv.nodes)
    assert len(fakes.calls("GetConsoleOutput")) == 2 * 4


def test_a_node_whose_key_never_appears_is_refused_and_rolled_back(
        fakes, spec_for, store, tagged):
    from provision.cluster import pipeline

    silent: set[str] = set()  # the first node asked about never prints its keys

    def script(iid: str, n: int) -> str | None:
        if not silent:
            silent.add(iid)
        return console_output(fakes.host_key(iid), with_keys=False) if iid in silent else None

    fakes.console_script = script
    no_wait = retry.RetryPolicy(poll_interval_s=0.0, backoff_initial_s=0.0, backoff_max_s=0.0,
                                busy_interval_s=0.0, host_key_timeout_s=0.0)
    with retry.using(no_wait), pytest.raises(ProvisionError) as err:
        pipeline.up(spec_for(nodes=2), confirm=lambda p: True, store=store, bootstrap=False,
                    log=lambda m: None)
    (iid,) = silent
    assert f"no ed25519 host key on the console of node-0 ({iid})" in err.value.message \
        or f"no ed25519 host key on the console of node-1 ({iid})" in err.value.message
    assert "node-" not in err.value.message.split(f"({iid})", 1)[1].split("after")[0]
    assert tagged() == {}  # rolled back: nothing half-made is left
    assert not store.exists("c1")


def test_a_console_key_contradicting_its_fingerprint_is_refused(fakes, spec_for, store, tagged):
    from provision.cluster import pipeline

    def forged(iid: str, n: int) -> str:
        text = console_output(fakes.host_key(iid))
        return text.replace(fakes.host_key(iid).split()[1], OTHER.split()[1])

    fakes.console_script = forged
    with pytest.raises(ProvisionError, match="does not match the fingerprint"):
        pipeline.up(spec_for(nodes=2), confirm=lambda p: True, store=store, bootstrap=False,
                    log=lambda m: None)
    assert tagged() == {}


# --- the console parser ------------------------------------------------------------------------
def test_parser_reads_cloud_init_blocks_with_or_without_log_prefixes():
    text = console_output(KEY)
    assert hostkeys.ed25519_key(text, "n") == KEY
    bare = text.replace("<14>Aug 11 09:12:41 ec2: ", "")  # older cloud-init: no logger prefix
    assert hostkeys.ed25519_key(bare, "n") == KEY
    assert hostkeys.ed25519_key(console_output(KEY, with_keys=False), "n") is None
    # a block cut off by the 64 KB window (no END marker yet) is not read
    assert hostkeys.ed25519_key(text.split("-----END SSH HOST KEY KEYS")[0], "n") is None


def test_parser_refuses_ambiguous_or_malformed_keys():
    two = console_output(KEY) + console_output(OTHER)
    with pytest.raises(hostkeys.HostKeyRefused, match="2 different ed25519"):
        hostkeys.ed25519_key(two, "node-1 (i-1)")
    bad = console_output(KEY).replace(KEY.split()[1], "AAAAC3NzaC1lZDI1NTE5AAAAIAAA")
    with pytest.raises(hostkeys.HostKeyRefused, match="malformed|fingerprint"):
        hostkeys.ed25519_key(bad, "n")


def test_fingerprint_is_openssh_sha256():
    import hashlib

    blob = base64.b64decode(KEY.split()[1])
    expected = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert hostkeys.fingerprint(KEY.split()[1]) == "SHA256:" + expected


def test_rule_refuses_a_private_key_in_user_data():
    private = generate_ed25519().private_openssh
    data = base64.b64encode(f"#cloud-config\nssh_keys:\n  x: |\n    {private}".encode()).decode()
    (violation,) = rules.check_request("RunInstances", {"InstanceType": "g6.xlarge",
                                                        "UserData": data})
    assert "private key" in violation
    assert rules.check_request("RunInstances", {"InstanceType": "g6.xlarge",
                                                "UserData": "#cloud-config\n"}) == []
