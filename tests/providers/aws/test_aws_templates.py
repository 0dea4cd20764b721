"""Rendered templates: the EFA/NCCL preset (golden) and the cloud-config user data."""

from __future__ import annotations

import yaml

from provision.model.render import parse_env_file, render
from provision.nodes.bootstrap import boot_pull


def test_efa_preset_p4d_golden():
    text = render("nccl/aws-efa.env.j2", instance_type="p4d.24xlarge", efa_interfaces=4,
                  device_rdma=True)
    assert parse_env_file(text) == {
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_NET_PLUGIN": "ofi",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
    }
    assert "NCCL_PROTO" not in parse_env_file(text)  # would disable aws-ofi-nccl's tuner


def test_efa_preset_without_rdma():
    env = parse_env_file(render("nccl/aws-efa.env.j2", instance_type="g5.48xlarge",
                                efa_interfaces=1, device_rdma=False))
    assert "FI_EFA_USE_DEVICE_RDMA" not in env and env["FI_PROVIDER"] == "efa"


def test_user_data_is_valid_cloud_config_and_carries_no_key():
    """cloud-init's schema (schema-cloud-config-v1.json, cc_ssh / cc_keys_to_console):
    ssh_genkeytypes has "minItems": 1 and items in ecdsa/ed25519/rsa; the node makes its own
    keys (no `ssh_keys`) after deleting the AMI's, and prints them on its console."""
    text = render("aws/user-data.yaml.j2", cluster="c1", max_hours="8", max_seconds=28800,
                  max_minutes=480, **boot_pull(None))
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    assert "ssh_keys" not in data and "PRIVATE KEY" not in text
    assert data["ssh_deletekeys"] is True and data["ssh_genkeytypes"] == ["ed25519"]
    assert data["ssh"]["emit_keys_to_console"] is True
    assert data["ssh_key_console_blacklist"] == [] == data["ssh_fp_console_blacklist"]
    assert "--on-active=28800s" in data["bootcmd"][0][2] and "shutdown -P +480" in data["bootcmd"][0][2]
