"""What the user's machine hands the controller, checked without Docker."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import tarfile
from pathlib import Path

from provision.job.managed.handoff import controller_layout, controller_payload, start_line
from provision.job.managed.supervisor import inside_view
from provision.model.inventory import Inventory, NodeRecord
from provision.model.spec import build_cluster_spec, build_job_spec
from remote.store import parse_url

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py")


def _inv(tmp_path: Path) -> Inventory:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("PRIVATE")
    (keys / "id_ed25519.pub").write_text("ssh-ed25519 AAAA")
    (keys / "known_hosts").write_text("x")
    spec = build_cluster_spec({}, {"name": "c1", "store": "s3://b/runs"})
    return Inventory(name="c1", provider="docker", spec=spec, key_path=str(keys / "id_ed25519"),
                     nodes=[NodeRecord(name="node-0", rank=0, address="127.0.0.1", port=32000,
                                       private_address="node-0")])


def test_the_payload_has_the_code_the_state_and_the_job(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    job = build_job_spec({}, {"script": EXAMPLE, "args": ["--steps", "3"], "max_restarts": 2})
    env = {"AWS_ACCESS_KEY_ID": "AKIA-secret"}
    data = controller_payload(inv, job, "7", env, controller_layout(inv))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}

        def text(name: str) -> str:
            fh = tar.extractfile(members[name])
            assert fh is not None
            return fh.read().decode()

        root = ".mgpu-cloud/controller"
        assert f"{root}/lib/provision/job/managed/supervisor.py" in members
        assert f"{root}/lib/remote/store.py" in members
        assert f"{root}/lib/templates/hostfile.j2" in members
        assert f"{root}/jobs/7/work/train_ddp.py" in members
        assert ".mgpu-cloud/remote.pyz" in members
        assert not any("__pycache__" in n for n in members)
        assert members[f"{root}/home/keys/c1/id_ed25519"].mode == 0o600
        assert f"{root}/home/keys/c1/known_hosts" not in members  # rewritten there
        spec = json.loads(text(f"{root}/jobs/7/job.json"))
        assert spec["script"] == "train_ddp.py" and spec["workdir"] is None
        assert spec["max_restarts"] == 2
        # credentials only in the 0600 env file, never in the inventory
        assert members[f"{root}/home/store-env.json"].mode == 0o600
        assert "AKIA-secret" in text(f"{root}/home/store-env.json")
        assert "AKIA-secret" not in text(f"{root}/home/clusters/c1.yaml")


def test_the_start_line_is_one_quoted_shell_line(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    line = start_line(inv, "3", parse_url("s3://b/it's here"), teardown=True)
    words = subprocess.run(["bash", "-c", f"HOME=/h; printf '%s\\n' {line}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[:4] == ["python3", "/h/.mgpu-cloud/remote.pyz", "job", "start"]
    assert "PYTHONPATH=/h/.mgpu-cloud/controller/lib" in words
    assert words[words.index("--store") + 1] == "s3://b/it's here"
    assert words[-1] == "--teardown"
    assert shlex.split(line)  # parses


def test_the_controller_sees_nodes_at_their_private_addresses() -> None:
    node = NodeRecord(name="node-1", rank=1, address="127.0.0.1", port=32768,
                      private_address="node-1", proxy_jump="u@bastion")
    seen = inside_view(node)
    assert (seen.address, seen.port, seen.proxy_jump) == ("node-1", 22, None)
