"""plan() with a scripted key resolver, known_hosts lookups, and the cleanup script (no docker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import paramiko
import pytest

from provision.cluster.providers.ssh.checks import remote_root
from provision.cluster.providers.ssh.provider import SshProvider, cleanup_script
from provision.model.errors import ProviderUnavailableError, UserInputError
from provision.model.inventory import Inventory, ResourceRecord
from provision.model.keys import generate_ed25519, host_key_only
from provision.model.spec import build_cluster_spec
from provision.nodes.hostkeys import (
    Endpoint,
    HostKeyProblem,
    Jump,
    Unreachable,
    fingerprint,
    known_keys,
    load_known_hosts,
)


class ScriptedKeys:
    """Stands in for hostkeys.resolve_host_key: outcome per 'address:port', calls recorded."""

    def __init__(self, outcomes: dict[str, Any]) -> None:
        self.outcomes = outcomes
        self.calls: list[tuple[str, str | None, bool]] = []

    def __call__(self, endpoint: Endpoint, known: Any, *, accept_new: bool,
                 known_hosts_file: Path, jump: Jump | None = None) -> tuple[str, str]:
        where = f"{endpoint.address}:{endpoint.port}"
        self.calls.append((where, jump.endpoint.address if jump else None, accept_new))
        outcome = self.outcomes[where]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[no-any-return]


@pytest.fixture
def hosts_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MGPU_CLOUD_SSH_CONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("MGPU_CLOUD_SSH_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    (tmp_path / "id").write_text("x\n")
    inv = tmp_path / "hosts.yaml"
    inv.write_text("user: root\nidentity_file: id\nhosts:\n"
                   "  - {name: a, address: 10.0.0.1, slots: 2}\n"
                   "  - {name: b, address: 10.0.0.2, port: 2222, slots: 2}\n"
                   "  - {name: c, address: 10.0.0.3, proxy_jump: 'root@login:22'}\n")
    return inv


def spec(inv: Path, **extra: Any) -> Any:
    return build_cluster_spec({}, {"provider": "ssh", "name": "lab",
                                   "ssh": {"inventory": str(inv), **extra}})


KEY = host_key_only(generate_ed25519().public_openssh)


def test_plan_pins_keys_and_writes_nothing(hosts_file: Path, mgpu_home: Path) -> None:
    keys = ScriptedKeys({"login:22": (KEY, "known_hosts"), "10.0.0.1:22": (KEY, "known_hosts"),
                         "10.0.0.2:2222": (KEY, "known_hosts"), "10.0.0.3:22": (KEY, "accepted")})
    plan = SshProvider(resolve_key=keys).plan(spec(hosts_file, accept_new_host_keys=True))
    assert plan.provider == "ssh" and plan.nodes == 3 and plan.hourly_cost_usd == 0
    hosts = {h.name: h for h in plan.hosts}  # the typed plan `create` consumes
    assert hosts["b"].port == 2222 and hosts["a"].host_key == KEY
    assert hosts["c"].proxy_jump == "root@login:22"
    assert hosts["c"].proxy_jump_host_key == KEY and hosts["c"].slots is None
    shown = {r.name: r.details for r in plan.resources}  # what people see
    assert shown["c"]["proxy_jump"] == "root@login:22" and shown["c"]["slots"].startswith("auto")
    assert ("10.0.0.3:22", "login", True) in keys.calls  # c was resolved through its jump
    assert any(f"c: new host key {fingerprint(KEY)}" in n for n in plan.notes)
    assert f"~/{remote_root('lab')}" in plan.render()
    assert not mgpu_home.exists()  # plan never writes


def test_plan_reports_every_bad_host_at_once(hosts_file: Path) -> None:
    keys = ScriptedKeys({
        "login:22": (KEY, "known_hosts"),
        "10.0.0.1:22": HostKeyProblem("changed", "host key CHANGED: old vs new"),
        "10.0.0.2:2222": HostKeyProblem("unknown", "unknown host key: [10.0.0.2]:2222"),
        "10.0.0.3:22": (KEY, "known_hosts"),
    })
    with pytest.raises(UserInputError) as err:
        SshProvider(resolve_key=keys).plan(spec(hosts_file))
    msg = err.value.message
    assert "2 of 3 host(s) cannot be used" in msg
    assert "a (root@10.0.0.1): host key CHANGED" in msg
    assert "b (root@10.0.0.2:2222): unknown host key" in msg
    assert "ssh-keygen -R" in str(err.value.hint) and "--accept-new-host-keys" in str(err.value.hint)


def test_unreachable_jump_host_names_every_host_behind_it(hosts_file: Path) -> None:
    keys = ScriptedKeys({"login:22": Unreachable("connection refused"),
                         "10.0.0.1:22": (KEY, "known_hosts"),
                         "10.0.0.2:2222": Unreachable("connection timed out")})
    with pytest.raises(ProviderUnavailableError) as err:
        SshProvider(resolve_key=keys).plan(spec(hosts_file))
    msg = err.value.message
    assert "c (root@10.0.0.3): jump host root@login:22 unreachable: connection refused" in msg
    assert "b (root@10.0.0.2:2222): unreachable: connection timed out" in msg
    assert "a (" not in msg


def test_known_hosts_lookup_understands_ports_and_hashed_names(tmp_path: Path) -> None:
    k1, k2 = generate_ed25519(), generate_ed25519()
    hashed = paramiko.HostKeys.hash_host("[10.0.0.9]:2222")
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.8 {host_key_only(k1.public_openssh)}\n"
                    f"{hashed} {host_key_only(k2.public_openssh)}\n"
                    "@cert-authority *.example.org ssh-ed25519 AAAA\n")
    known = load_known_hosts(path)
    assert [fingerprint(k) for k in known_keys(known, Endpoint("10.0.0.8", 22))] == [
        fingerprint(host_key_only(k1.public_openssh))]
    assert len(known_keys(known, Endpoint("10.0.0.9", 2222))) == 1
    assert known_keys(known, Endpoint("10.0.0.9", 22)) == []
    assert known_keys(known, Endpoint("10.0.0.8", 2222)) == []
    # Same fingerprint text as OpenSSH prints.
    pub = tmp_path / "k.pub"
    pub.write_text(k1.public_openssh + "\n")
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                         check=True)
    assert fingerprint(host_key_only(k1.public_openssh)) == out.stdout.split()[1]


def test_cleanup_script_removes_only_what_was_placed(tmp_path: Path) -> None:
    """The real shell script, run against a fake home."""
    home = tmp_path / "home"
    root = remote_root("lab")
    (home / root / "work").mkdir(parents=True)
    (home / root / "work" / "train.py").write_text("x")
    (home / ".mgpu-cloud" / "clusters").mkdir()  # the controller's own state: must stay
    (home / "keep.txt").write_text("mine")
    (home / ".deepspeed_env").write_text("MGPU_CLUSTER=lab\nX=1\n")  # the user's: never ours
    inv = Inventory(name="lab", provider="ssh", remote_root=root)
    records = [
        ResourceRecord(kind="remote-dir", id=f"n0:~/{root}", name="n0",
                       extra={"path": root, "parents": ".mgpu-cloud,.mgpu-cloud/ssh"}),
    ]
    script = cleanup_script(inv, records)
    env = {**os.environ, "HOME": str(home)}
    assert subprocess.run(["sh", "-c", script], env=env).returncode == 0
    assert not (home / root).exists() and not (home / ".mgpu-cloud" / "ssh").exists()
    assert (home / ".mgpu-cloud" / "clusters").is_dir()  # not empty: rmdir left it
    assert (home / "keep.txt").read_text() == "mine"
    assert (home / ".deepspeed_env").exists()
    # idempotent
    assert subprocess.run(["sh", "-c", script], env=env).returncode == 0


def test_destroy_contacts_only_hosts_where_something_was_placed(mgpu_home: Path) -> None:
    from fake_nodes import FakeConnector

    from provision.model.inventory import InventoryStore, NodeRecord

    store = InventoryStore()
    nodes = [NodeRecord(name=n, rank=r, address=f"203.0.113.{r + 1}",
                        private_address=f"203.0.113.{r + 1}", identity_file="/k")
             for r, n in enumerate(["a", "b"])]
    inv = Inventory(name="lab", provider="ssh", nodes=nodes, remote_root=remote_root("lab"))
    store.create(inv)
    fake = FakeConnector()
    SshProvider(connector=fake).destroy(inv, store)  # no remote-dir records
    assert fake.connected == []
    inv.resources.append(ResourceRecord(kind="remote-dir", id="b:~/x", name="b",
                                        extra={"path": inv.remote_root}))
    SshProvider(connector=fake).destroy(inv, store)
    assert fake.connected == ["b"]
    fake.assert_ran("b", r"rm -rf -- \.mgpu-cloud/ssh/lab")
    assert inv.resources == []  # forgotten once cleaned
