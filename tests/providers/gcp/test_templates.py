"""The GCP templates: NCCL preset and startup script render with every value (StrictUndefined)."""

from __future__ import annotations

import subprocess

from provision.cluster.providers.gcp.bodies import startup_script
from provision.cluster.providers.gcp.create import nccl_env
from provision.cluster.providers.gcp.plan import Layout

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


def test_startup_script_carries_no_key_and_leaves_sshd_alone() -> None:
    text = startup_script(LAYOUT)
    assert text.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert "GPUDirect" not in text  # a2: nothing to set up
    assert "PRIVATE KEY" not in text and "ssh-ed25519" not in text
    assert "/etc/ssh" not in text and "restart ssh" not in text  # the VM keeps its own keys
    assert "usermod -aG docker mgpu" in text
