"""The GCP templates: NCCL preset and startup script render with every value (StrictUndefined)."""

from __future__ import annotations

from provision.cluster.providers.gcp.create import nccl_env, startup_script
from provision.cluster.providers.gcp.plan import Layout
from provision.model.keys import generate_ed25519, host_key_only

LAYOUT = Layout(cluster="c1", project="p", region="us-central1", zones=("us-central1-a",),
                nodes=2, machine_type="a2-ultragpu-8g", gpus=8, accelerator_type=None, slots=8,
                image="img", image_family="fam", disk_gb=200, spot=False, max_hours=8.0,
                ssh_cidr="10.0.0.0/8")


def test_nccl_preset_for_a2_is_plain_tcp() -> None:
    assert nccl_env(LAYOUT) == {
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_NTHREADS": "4",
        "NCCL_NSOCKS_PERTHREAD": "4",
        "NCCL_CROSS_NIC": "0",
        "NCCL_DEBUG": "WARN",
    }


def test_startup_script_installs_the_host_key_and_quotes_values() -> None:
    key = generate_ed25519("c1-host")
    text = startup_script(LAYOUT, key)
    assert text.startswith("#!/bin/bash\n")
    assert "GPUDirect" not in text  # a2: nothing to set up
    assert key.private_openssh.strip() in text
    assert f"echo '{host_key_only(key.public_openssh)}' > /etc/ssh/ssh_host_ed25519_key.pub" in text
    assert "chmod 0600 /etc/ssh/ssh_host_ed25519_key" in text
    assert "systemctl restart ssh" in text
