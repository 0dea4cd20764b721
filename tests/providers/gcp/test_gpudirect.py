"""a3-highgpu-8g (GPUDirect-TCPX) and a3-megagpu-8g (GPUDirect-TCPXO) against the Compute fake:
the data networks, subnets and firewall rules (made before the VMs, rolled back, deleted), the
VMs' NICs, the node set-up in the startup script, the container words and the NCCL preset. The
rules layer (gcp_rules.gpudirect_nics) checks every VM request against Google's A3 set-up.
What needs real A3 VMs (the guest kernel, the RxDM, NCCL's choice) is not tested here."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_compute import FakeCompute

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.gcp.plan import Layout
from provision.model.errors import ProvisionError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]


def test_a3_highgpu_gets_its_data_networks_nics_node_set_up_and_preset(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    """Through the fake for a3-highgpu-8g (a3-megagpu-8g's requests go through the same code
    and the rules in test_gcp_rules' catalog test; its own pieces are checked below)."""
    k, lib = 4, "/var/lib/tcpx/lib64"
    inv = up(make_spec(gcp={"machine_type": "a3-highgpu-8g"}))

    posts = [r for r in fake.requests if r.method == "POST" and not r.path.endswith("/wait")]
    kinds = [r.path.rsplit("/", 1)[-1] for r in posts]
    first_bulk = kinds.index("bulkInsert")
    assert kinds.count("networks") == kinds.count("subnetworks") == k
    assert max(i for i, kind in enumerate(kinds) if kind in ("networks", "subnetworks")) \
        < first_bulk  # recorded and made before the VMs
    nets = [r.body for r in posts if r.path.endswith("/global/networks")]
    assert all(n["mtu"] == 8244 and n["autoCreateSubnetworks"] is False for n in nets)
    subs = [r.body for r in posts if r.path.endswith("/regions/us-central1/subnetworks")]
    ranges = [ipaddress.ip_network(s["ipCidrRange"]) for s in subs]
    assert all(r.prefixlen == 20 and r.subnet_of(ipaddress.ip_network("10.0.0.0/9"))
               for r in ranges)
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1:])
    walls = {r.body["name"]: r.body for r in posts if r.path.endswith("/global/firewalls")}
    for j in range(k):
        wall = walls[f"c1-gpunet-{j}-internal"]
        assert wall["network"] == f"global/networks/c1-gpunet-{j}"
        assert wall["sourceRanges"] == [subs[j]["ipCidrRange"]]
    (bulk,) = [r.body for r in fake.sent("POST", r"instances/bulkInsert$")]
    nics = bulk["instanceProperties"]["networkInterfaces"]
    assert len(nics) == 1 + k and nics[0]["accessConfigs"]
    assert [n["network"] for n in nics[1:]] == [f"global/networks/c1-gpunet-{j}"
                                                  for j in range(k)]
    assert all(n["nicType"] == "GVNIC" and "accessConfigs" not in n for n in nics[1:])

    # the node set-up: a valid shell script that installs the plugin and starts the RxDM
    meta = {i["key"]: i["value"] for i in bulk["instanceProperties"]["metadata"]["items"]}
    script = meta["startup-script"]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "gpudirect-tcpx/nccl-plugin-gpudirecttcpx-dev:" in script
    assert "gpudirect-tcpx/tcpgpudmarxd-dev:" in script
    assert "install --install-nccl" in script and "touch /run/mgpu-cloud/gpudirect.done" in script
    assert "gpu_rxq_configuration.textproto" in script and "modprobe import-helper" not in script

    # what jobs get
    assert inv.container_library_path == [lib]
    args = " ".join(inv.container_args)
    assert f"-v {lib}:{lib}:ro" in args and "-v /run/tcpx:/run/tcpx" in args
    assert "--mount type=bind,source=/run/mgpu-cloud/gpudirect.done," in args
    # the NIC names come from the node (found by PCI address), not from the controller
    assert "--env-file /run/mgpu-cloud/gpudirect-nics.env" in args
    env = inv.nccl_env
    assert env["NCCL_CROSS_NIC"] == "0" and env["NCCL_NET"] == "GPUDirectTCPX_v7"
    assert not {"NCCL_SOCKET_IFNAME", "NCCL_GPUDIRECTTCPX_CTRL_DEV",
                "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "NCCL_GPUDIRECTTCPX_TX_BINDINGS",
                "NCCL_GPUDIRECTTCPX_RX_BINDINGS"} & set(env)
    assert env["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"] == "/run/tcpx"
    assert inv.fabric is not None and (inv.fabric.transport, inv.fabric.busbw_gbps) == (
        "tcpx", 88.18)
    kinds_recorded = sorted(r.kind for r in store.load("c1").resources)
    assert kinds_recorded.count("network") == kinds_recorded.count("subnetwork") == k
    assert kinds_recorded.count("firewall") == 2 + k

    # a replacement gets the same NICs (the rules check its request too)
    get_provider("gcp").replace(inv, store, inv.nodes[1])
    again = [r.body for r in fake.sent("POST", r"instances/bulkInsert$")][-1]
    assert again["instanceProperties"]["networkInterfaces"] == nics

    fake.requests.clear()
    pipeline.down("c1", store=store, log=lambda m: None)
    deletes = [r.path.split("/")[-2] for r in fake.requests if r.method == "DELETE"]
    assert deletes == (["instances"] * 2 + ["resourcePolicies"] + ["firewalls"] * (2 + k)
                       + ["subnetworks"] * k + ["networks"] * k)
    assert fake.all_resources() == [] and not store.exists("c1")


def test_a_failed_data_subnet_rolls_back_every_network(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    fake.fail_operation("POST", r"subnetworks/c1-gpunet-2$", "INVALID_FIELD_VALUE")
    with pytest.raises(ProvisionError, match="subnetwork c1-gpunet-2"):
        up(make_spec(gcp={"machine_type": "a3-highgpu-8g"}))
    assert fake.all_resources() == [] and not store.exists("c1")
    assert fake.sent("POST", r"instances/bulkInsert$") == []


def test_the_plan_lists_the_networks_and_says_what_is_not_verified(fake: FakeCompute,
                                                                  make_spec: MakeSpec) -> None:
    fake.networks_quota = 16
    plan = get_provider("gcp").plan(make_spec(gcp={"machine_type": "a3-megagpu-8g"}))
    kinds = [r.kind for r in plan.resources]
    assert kinds.count("network") == kinds.count("subnetwork") == 8
    assert kinds.count("firewall") == 2 + 8
    notes = " | ".join(plan.notes)
    assert "GPUDirect-TCPXO: 8 extra gVNIC data NICs" in notes
    assert "NOT verified" in notes and "--image-family" in notes
    one = Layout.model_validate({**plan.layout.model_dump(), "nodes": 1})  # type: ignore[attr-defined]
    assert one.gpu_direct is None and one.data_networks == []  # one node: plain TCP


def test_a3_megagpu_node_set_up_container_and_preset_are_tcpxo() -> None:
    from provision.cluster.providers.gcp import gpudirect
    from provision.cluster.providers.gcp.bodies import startup_script
    from provision.cluster.providers.gcp.create import nccl_env

    layout = Layout(cluster="c1", project="p", region="us-central1", zones=["us-central1-a"],
                    nodes=2, machine_type="a3-megagpu-8g", gpus=8, accelerator_type=None,
                    slots=8, image="img", image_family="fam", disk_gb=200, spot=False,
                    max_hours=8.0, ssh_cidr="10.0.0.0/8")
    assert len(layout.data_networks) == 8
    script = startup_script(layout)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "modprobe import-helper" in script and "1ae0:0084" in script
    assert "gpudirect-tcpxo/tcpgpudmarxd-dev:" in script and "--num_nics=8" in script
    assert "Buffer manager initialization complete" in script
    env = nccl_env(layout)
    assert not {"NCCL_FASTRAK_IFNAME", "NCCL_FASTRAK_CTRL_DEV", "NCCL_SOCKET_IFNAME"} & set(env)
    assert env["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
    assert env["NCCL_TUNER_CONFIG_PATH"].startswith("/var/lib/tcpxo/lib64/")
    assert env["NCCL_CROSS_NIC"] == "0" and "NCCL_NET" not in env
    args = " ".join(gpudirect.container_args(layout.gpu_direct))
    assert "-v /var/lib/tcpxo/lib64:/var/lib/tcpxo/lib64:ro" in args
    assert "-v /dev/aperture_devices:/dev/aperture_devices" in args and "/run/tcpx" not in args
    assert gpudirect.library_path(layout.gpu_direct) == ["/var/lib/tcpxo/lib64"]


# --- the node finds its NICs by PCI address (templates/gcp/gpudirect-nics.sh.j2) -------------
def _sysfs(root: Path, names: dict[str, str]) -> Path:
    """A sysfs tree with one network interface per PCI address: pci -> name."""
    for pci, name in names.items():
        (root / "sys" / "bus" / "pci" / "devices" / pci / "net" / name).mkdir(parents=True)
        (root / "sys" / "class" / "net" / name).mkdir(parents=True)
    stub = root / "bin" / "ip"  # `ip -4 -o addr show dev NIC`: every NIC has an address
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "2: $6    inet 10.0.0.2/32 scope global $6"\n')
    stub.chmod(0o755)
    return root


def _find_nics(root: Path, stack_name: str) -> subprocess.CompletedProcess[str]:
    import os

    from provision.cluster.providers.gcp import gpudirect
    from provision.model.render import render

    stack = gpudirect.TCPX if stack_name == "tcpx" else gpudirect.TCPXO
    script = render("gcp/gpudirect-nics.sh.j2", gpudirect=stack, nic_wait_s=1,
                    nics_env=str(root / "nics.env"))
    env = dict(os.environ, MGPU_SYSFS=str(root / "sys"),
               PATH=f"{root / 'bin'}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-euo", "pipefail"], input=script, text=True,
                          capture_output=True, env=env, check=False)


@pytest.mark.parametrize("suffix", ["f0", ""])  # Ubuntu 24.04 accelerator images / 22.04
def test_the_node_finds_the_tcpx_nics_by_pci_address_whatever_their_names(
        tmp_path: Path, suffix: str) -> None:
    from provision.cluster.providers.gcp import gpudirect

    names = {"0000:00:0c.0": "enp0s12", "0000:06:00.0": f"enp6s0{suffix}",
             "0000:0c:00.0": f"enp12s0{suffix}", "0000:86:00.0": f"enp134s0{suffix}",
             "0000:8c:00.0": f"enp140s0{suffix}", "0000:00:04.0": "ens4"}  # + an unrelated NIC
    done = _find_nics(_sysfs(tmp_path, names), "tcpx")
    assert done.returncode == 0, done.stdout + done.stderr
    env = dict(line.split("=", 1) for line in (tmp_path / "nics.env").read_text().splitlines())
    data = [f"enp{n}s0{suffix}" for n in (6, 12, 134, 140)]
    assert env == {
        "NCCL_SOCKET_IFNAME": "enp0s12", "NCCL_GPUDIRECTTCPX_CTRL_DEV": "enp0s12",
        "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": ",".join(data),
        "NCCL_GPUDIRECTTCPX_TX_BINDINGS": ";".join(
            f"{d}:{c}" for d, c in zip(data, gpudirect.TCPX.tx_cpus, strict=True)),
        "NCCL_GPUDIRECTTCPX_RX_BINDINGS": ";".join(
            f"{d}:{c}" for d, c in zip(data, gpudirect.TCPX.rx_cpus, strict=True)),
    }


def test_the_node_finds_the_tcpxo_nics_and_names_a_missing_one(tmp_path: Path) -> None:
    from provision.cluster.providers.gcp import gpudirect

    names = dict(zip(gpudirect.TCPXO.data_pcis,
                     [f"{n}f0" for n in gpudirect.TCPXO.data_nics], strict=True))
    names["0000:00:0c.0"] = "enp0s12"
    done = _find_nics(_sysfs(tmp_path / "ok", names), "tcpxo")
    assert done.returncode == 0, done.stdout + done.stderr
    env = (tmp_path / "ok" / "nics.env").read_text()
    assert "NCCL_FASTRAK_IFNAME=enp6s0f0,enp7s0f0,enp13s0f0,enp14s0f0,enp134s0f0" in env
    assert "NCCL_FASTRAK_CTRL_DEV=enp0s12" in env

    del names["0000:8e:00.0"]  # enp142s0 never shows up
    missing = _find_nics(_sysfs(tmp_path / "bad", names), "tcpxo")
    assert missing.returncode == 1
    assert "found control NIC 'enp0s12' and 7 data NIC(s)" in missing.stdout
    assert "0000:8e:00.0" in missing.stdout and "enp141s0f0" in missing.stdout
    assert not (tmp_path / "bad" / "nics.env").exists()


def test_the_pci_addresses_are_the_documented_names_bus_and_slot() -> None:
    from provision.cluster.providers.gcp import gpudirect

    assert gpudirect.TCPX.ctrl_pci == "0000:00:0c.0"
    assert gpudirect.TCPX.data_pcis == ("0000:06:00.0", "0000:0c:00.0", "0000:86:00.0",
                                        "0000:8c:00.0")  # the RxDM's nic_pci_addr values
    assert gpudirect.pci_of("enp6s0f0") == gpudirect.pci_of("enp6s0") == "0000:06:00.0"
    assert gpudirect.TCPXO.data_pcis[-1] == "0000:8e:00.0"
