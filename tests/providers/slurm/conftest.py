"""Fixtures of the slurm provider's tests.

    slurm      (module) ONE emulated Slurm cluster (slurm_emulation.py) for every integration
               test of a module: a login node with slurmctld + slurmdbd (accounting on:
               accounts `default` and `research` for root and user) and 2 compute nodes with
               2 fake GPUs each. The image is built here from the node image (apt over http;
               cached by a content-hash tag), never by the provider. Removed at the end,
               checked to leave no container, network or volume.
    slurm_user (function) the user's side: a known_hosts holding the login node's key and an
               ssh config naming the key (MGPU_CLOUD_SSH_KNOWN_HOSTS / MGPU_CLOUD_SSH_CONFIG),
               so `--login USER@127.0.0.1:PORT` needs no other flag and ~/.ssh is never read.
    cli        run `python -m provision.cli ...` as a separate process (real exit codes).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from engine import unique
from kit import cli as run_cli  # one runner for every test file

sys.path.insert(0, str(Path(__file__).parent))

from slurm_emulation import Cluster, build_image, down, leftovers, up  # noqa: E402

from provision.model.keys import generate_ed25519, write_private_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class SlurmSite:
    cluster: Cluster
    key: Path

    def login(self, user: str) -> str:
        return f"{user}@{self.cluster.ssh_host}:{self.cluster.ssh_port}"

    def sh(self, cmd: str, user: str = "root", host: str = "login",
           check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.exec(cmd, user=user, host=host, check=check)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` of a job (Slurm keeps ended jobs for MinJobAge=300 s)."""
        out = self.sh(f"scontrol show job -o {job_id}").stdout
        return dict(w.split("=", 1) for w in out.split() if "=" in w)

    def ended_job(self, job_id: str, timeout: float = 120) -> dict[str, str]:
        """`job` once it is no longer COMPLETING: after `scancel`, Slurm shows a job as
        COMPLETING (its processes are still being ended on some node) before its end state
        (squeue's "CG": https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES)."""
        deadline = time.monotonic() + timeout
        while (info := self.job(job_id)).get("JobState") == "COMPLETING":
            assert time.monotonic() < deadline, f"job {job_id} still completing: {info}"
            time.sleep(0.5)
        return info


@pytest.fixture(scope="module")
def slurm(node_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSite]:
    image = build_image(node_image, accounting=True)
    key_dir = tmp_path_factory.mktemp("slurm-user")
    pair = generate_ed25519("user@controller")
    write_private_key(key_dir / "id_ed25519", pair)
    name = unique(f"slurmt-{secrets.token_hex(3)}")
    cluster = up(name, 2, pair.public_openssh, image=image, gpus=2, accounting=True)
    try:
        yield SlurmSite(cluster, key_dir / "id_ed25519")
    finally:
        down(name)
        left = leftovers(name)
        assert not any(left.values()), f"the emulated cluster left {left}"


@pytest.fixture
def slurm_user(slurm: SlurmSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    known = tmp_path / "known_hosts"
    known.write_text(slurm.cluster.known_hosts_line() + "\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {slurm.cluster.ssh_host}\n  IdentityFile {slurm.key}\n")
    monkeypatch.setenv("MGPU_CLOUD_SSH_KNOWN_HOSTS", str(known))
    monkeypatch.setenv("MGPU_CLOUD_SSH_CONFIG", str(config))
    return tmp_path


@pytest.fixture
def cli() -> Any:
    return run_cli
