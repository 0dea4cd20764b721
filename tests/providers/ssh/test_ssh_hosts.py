"""Parsing the ssh provider's input: hosts YAML, hostfile, ~/.ssh/config (no network)."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from provision.cluster.providers.ssh.hosts import load_hosts, read_inventory_file
from provision.model.errors import UserInputError
from provision.model.spec import build_cluster_spec

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_user_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never read the real ~/.ssh/config; HOME points at an empty folder (no default keys)."""
    config = tmp_path / "ssh_config"
    config.write_text("")
    monkeypatch.setenv("MGPU_CLOUD_SSH_CONFIG", str(config))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return config


def key(tmp_path: Path, name: str = "id_test") -> Path:
    p = tmp_path / name
    p.write_text("not read by these tests\n")
    return p


def spec(**ssh: object) -> object:
    extra = {k: ssh.pop(k) for k in ("nodes", "gpus_per_node") if k in ssh}
    return build_cluster_spec({}, {"provider": "ssh", "name": "t", "ssh": ssh, **extra})


def test_inventory_yaml_precedence_and_defaults(tmp_path: Path) -> None:
    key(tmp_path, "default_key")
    (tmp_path / "keys").mkdir()
    key(tmp_path / "keys", "alice")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "user: ubuntu\nidentity_file: default_key\nport: 2200\n"
        "hosts:\n"
        "  - name: gpu1\n    address: 10.0.0.11\n    slots: 8\n"
        "  - address: 10.0.0.12\n    port: 22\n    private_address: 192.168.0.12\n"
        "  - name: gpu3\n    address: 192.168.0.13\n    user: alice\n"
        "    identity_file: keys/alice\n    proxy_jump: ops@login:2022\n"
    )
    hosts = load_hosts(spec(inventory=str(inv)))  # type: ignore[arg-type]
    assert [h.name for h in hosts] == ["gpu1", "10.0.0.12", "gpu3"]
    gpu1, second, gpu3 = hosts
    assert (gpu1.user, gpu1.port, gpu1.slots) == ("ubuntu", 2200, 8)
    assert gpu1.identity_file == str(tmp_path / "default_key")  # relative to the file
    assert gpu1.private_address == "10.0.0.11" and gpu1.proxy_jump is None
    assert second.port == 22 and second.slots is None  # per-host value beats the default
    assert second.private_address == "192.168.0.12"
    assert (gpu3.user, gpu3.identity_file) == ("alice", str(tmp_path / "keys" / "alice"))
    assert gpu3.proxy_jump == "ops@login:2022"
    assert gpu1.source == f"{inv}:5"


def test_flags_beat_file_defaults_but_not_host_entries(tmp_path: Path) -> None:
    flag_key = key(tmp_path, "flag_key")
    key(tmp_path, "file_key")
    inv = tmp_path / "hosts.yaml"
    inv.write_text("user: fileuser\nidentity_file: file_key\nhosts:\n"
                   "  - address: h1\n  - address: h2\n    user: own\n")
    h1, h2 = load_hosts(spec(inventory=str(inv), user="flaguser",  # type: ignore[arg-type]
                             identity_file=str(flag_key)))
    assert (h1.user, h1.identity_file) == ("flaguser", str(flag_key))
    assert h2.user == "own"


@pytest.mark.parametrize(
    "text,line,message",
    [
        ("hosts:\n  - address: a\n    slot: 8\n", 3, "unknown setting"),
        ("hosts:\n  - address: a\n  - address: b\n    port: 99999\n", 4, "less than or equal"),
        ("hosts:\n  - name: a\n", 2, "address: Field required"),
        ("hosts: []\n", 1, "at least 1"),
        ("hosts:\n  - address: a\n   port: 1\n", 3, "not valid YAML"),
    ],
)
def test_inventory_errors_name_the_line(tmp_path: Path, text: str, line: int,
                                        message: str) -> None:
    inv = tmp_path / "bad.yaml"
    inv.write_text(text)
    with pytest.raises(UserInputError) as err:
        load_hosts(spec(inventory=str(inv)))  # type: ignore[arg-type]
    assert f"{inv}:{line}" in err.value.message and message in err.value.message


def test_hostfile_with_user_and_key_from_flags(tmp_path: Path) -> None:
    k = key(tmp_path)
    hf = tmp_path / "hostfile"
    hf.write_text("# lab\nnode1 slots=8\n\nnode2 slots=4   # the small one\nnode3\n")
    hosts = load_hosts(spec(hostfile=str(hf), user="me", identity_file=str(k)))  # type: ignore[arg-type]
    assert [(h.name, h.address, h.slots, h.user, h.port) for h in hosts] == [
        ("node1", "node1", 8, "me", 22), ("node2", "node2", 4, "me", 22),
        ("node3", "node3", None, "me", 22),
    ]
    assert all(h.identity_file == str(k) for h in hosts)


def test_hostfile_takes_login_settings_from_ssh_config(tmp_path: Path, no_user_ssh: Path) -> None:
    k = key(tmp_path)
    no_user_ssh.write_text(
        f"Host node1\n  HostName 10.1.0.1\n  User admin\n  Port 2222\n  IdentityFile {k}\n"
        "  ProxyJump login\n"
        "Host login\n  HostName login.example.org\n  User ops\n"
        f"Host *\n  IdentityFile {k}\n"
    )
    hf = tmp_path / "hostfile"
    hf.write_text("node1 slots=2\nnode2 slots=2\n")
    node1, node2 = load_hosts(spec(hostfile=str(hf)))  # type: ignore[arg-type]
    assert (node1.name, node1.address, node1.user, node1.port) == ("node1", "10.1.0.1", "admin", 2222)
    assert node1.identity_file == str(k)
    assert node1.proxy_jump == "ops@login.example.org:22"
    assert node1.private_address == "node1"  # the hostfile name: how nodes know each other
    assert (node2.address, node2.user, node2.proxy_jump) == ("node2", getpass.getuser(), None)


@pytest.mark.parametrize(
    "text,message",
    [
        ("node1 slots=8\nnode2 slots=x\n", "hostfile:2: expected `HOST slots=N`"),
        ("node1 slots=8\nnode1 slots=8\n", "hostfile:2: host 'node1' is listed twice"),
        ("node1 slots=0\n", "hostfile:1: slots must be at least 1"),
        ("# nothing\n", "lists no hosts"),
    ],
)
def test_hostfile_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    hf = tmp_path / "hostfile"
    hf.write_text(text)
    with pytest.raises(UserInputError) as err:
        load_hosts(spec(hostfile=str(hf), identity_file=str(key(tmp_path))))  # type: ignore[arg-type]
    assert message in err.value.message


def test_missing_key_and_missing_source_are_clear(tmp_path: Path) -> None:
    hf = tmp_path / "hostfile"
    hf.write_text("node1 slots=1\n")
    with pytest.raises(UserInputError) as err:
        load_hosts(spec(hostfile=str(hf)))  # type: ignore[arg-type]
    assert "no SSH key for host 'node1'" in err.value.message and "-i" in str(err.value.hint)
    with pytest.raises(UserInputError) as err:
        load_hosts(spec())  # type: ignore[arg-type]
    assert "--inventory" in str(err.value.hint)
    with pytest.raises(UserInputError) as err:
        load_hosts(spec(hostfile=str(hf), inventory=str(hf)))  # type: ignore[arg-type]
    assert "several were given" in err.value.message


def test_nodes_flag_takes_the_first_hosts(tmp_path: Path) -> None:
    hf = tmp_path / "hostfile"
    hf.write_text("a slots=1\nb slots=1\nc slots=1\n")
    k = str(key(tmp_path))
    assert [h.name for h in load_hosts(spec(hostfile=str(hf), identity_file=k, nodes=2))] == [  # type: ignore[arg-type]
        "a", "b"]
    with pytest.raises(UserInputError, match="only 3 host"):
        load_hosts(spec(hostfile=str(hf), identity_file=k, nodes=4))  # type: ignore[arg-type]


def test_duplicate_names_and_multi_hop_jumps_are_refused(tmp_path: Path) -> None:
    k = key(tmp_path)
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"identity_file: {k}\nhosts:\n  - {{name: x, address: a}}\n"
                   "  - {name: x, address: b}\n")
    with pytest.raises(UserInputError, match="host name 'x' is used twice"):
        load_hosts(spec(inventory=str(inv)))  # type: ignore[arg-type]
    inv.write_text(f"identity_file: {k}\nhosts:\n  - {{address: a, proxy_jump: 'j1,j2'}}\n")
    with pytest.raises(UserInputError, match="several hops"):
        load_hosts(spec(inventory=str(inv)))  # type: ignore[arg-type]


def test_the_shipped_example_inventory_is_valid() -> None:
    parsed, sources = read_inventory_file(str(ROOT / "inventories" / "onprem.example.yaml"))
    assert [h.name for h in parsed.hosts] == ["gpu1", "gpu2", "gpu3"]
    assert parsed.hosts[2].proxy_jump and parsed.hosts[1].port == 2222
    assert all(":" in s for s in sources)


def test_loopback_rendezvous_address_is_refused_for_several_hosts(tmp_path: Path) -> None:
    k = key(tmp_path)
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"identity_file: {k}\nhosts:\n  - {{name: a, address: 127.0.0.1, port: 2201}}\n"
                   "  - {name: b, address: 127.0.0.1, port: 2202, private_address: b}\n")
    with pytest.raises(UserInputError) as err:
        load_hosts(spec(inventory=str(inv)))  # type: ignore[arg-type]
    assert f"{inv}:3: host 'a'" in err.value.message and "private_address" in str(err.value.hint)
    inv.write_text(f"identity_file: {k}\nhosts:\n  - {{name: a, address: 127.0.0.1}}\n")
    assert load_hosts(spec(inventory=str(inv)))[0].private_address == "127.0.0.1"  # type: ignore[arg-type]
