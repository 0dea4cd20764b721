"""Rendered templates: the EFA/NCCL preset (golden) and the cloud-config user data."""

from __future__ import annotations

import yaml

from provision.model.keys import generate_ed25519, host_key_only
from provision.model.render import parse_env_file, render


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


def test_user_data_is_valid_cloud_config():
    """cloud-init's schema (schema-cloud-config-v1.json, cc_ssh): ssh_genkeytypes has
    "minItems": 1 and items in ecdsa/ed25519/rsa; with ssh_keys given, no key is generated."""
    key = generate_ed25519("host")
    text = render("aws/user-data.yaml.j2", cluster="c1", host_private_key=key.private_openssh.strip(),
                  host_public_key=host_key_only(key.public_openssh), max_hours="8",
                  max_seconds=28800, max_minutes=480)
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    assert data["ssh_keys"]["ed25519_private"].strip() == key.private_openssh.strip()
    assert data["ssh_keys"]["ed25519_public"] == host_key_only(key.public_openssh)
    assert data["ssh_deletekeys"] is True and data["ssh_genkeytypes"] == ["ed25519"]
    assert "--on-active=28800s" in data["bootcmd"][0][2] and "shutdown -P +480" in data["bootcmd"][0][2]
