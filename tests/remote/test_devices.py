"""remote/devices.py: uverbs devices picked by the driver bound to them (a fake sysfs tree
shaped like an AWS B200 node, whose mlx5 devices sit beside the EFA ones), and `job start`
refusing to start when a selector matches nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote import devices

ROOT = Path(__file__).resolve().parents[2]


def fake_sysfs(root: Path, drivers: dict[str, str]) -> Path:
    """/sys/class/infiniband_verbs/uverbsN -> ../../devices/pci.../infiniband_verbs/uverbsN,
    each with a `device/driver` link to /sys/bus/pci/drivers/DRIVER and a uevent naming the
    node, as the kernel lays it out (Documentation/ABI/testing/sysfs-class-infiniband)."""
    sys_root = root / "sys"
    cls = sys_root / "class" / "infiniband_verbs"
    cls.mkdir(parents=True)
    for i, (name, driver) in enumerate(drivers.items()):
        drv = sys_root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        pci = sys_root / "devices" / "pci0000:00" / f"0000:00:{i + 16:02x}.0"
        dev = pci / "infiniband_verbs" / name
        dev.mkdir(parents=True)
        (pci / "driver").symlink_to(os.path.relpath(drv, pci))
        (dev / "device").symlink_to(os.path.relpath(pci, dev))
        (dev / "uevent").write_text(f"MAJOR=231\nMINOR={192 + i}\nDEVNAME=infiniband/{name}\n")
        (cls / name).symlink_to(os.path.relpath(dev, cls))
    return sys_root


B200 = {"uverbs0": "mlx5_core", "uverbs1": "mlx5_core", **{f"uverbs{i}": "efa"
                                                            for i in range(2, 10)},
        "uverbs10": "efa", "uverbs11": "efa"}


def test_by_driver_picks_the_efa_devices_not_the_mlx5_ones(tmp_path):
    sys_root = fake_sysfs(tmp_path, B200)
    found = devices.by_driver("infiniband_verbs", "efa", sys_root=str(sys_root))
    assert found == [f"/dev/infiniband/uverbs{i}" for i in range(2, 12)]  # natural order
    assert devices.by_driver("infiniband_verbs", "mlx5_core", sys_root=str(sys_root)) == [
        "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
    assert devices.by_driver("no_such_class", "efa", sys_root=str(sys_root)) == []


def test_expand_replaces_only_the_selector_pairs(tmp_path):
    sys_root = fake_sysfs(tmp_path, {"uverbs0": "mlx5_core", "uverbs1": "efa", "uverbs2": "efa"})
    argv = ["sudo", "-n", "docker", "run", "--device", "/dev/fuse", "--device",
            "@by-driver:infiniband_verbs:efa", "-v", "/a:/a", "img", "python3", "x.py"]
    assert devices.expand(argv, sys_root=str(sys_root)) == [
        "sudo", "-n", "docker", "run", "--device", "/dev/fuse",
        "--device", "/dev/infiniband/uverbs1", "--device", "/dev/infiniband/uverbs2",
        "-v", "/a:/a", "img", "python3", "x.py"]


def test_expand_refuses_a_selector_that_matches_nothing(tmp_path):
    sys_root = fake_sysfs(tmp_path, {"uverbs0": "mlx5_core"})
    with pytest.raises(devices.DeviceSelectionError, match="no infiniband_verbs device bound"):
        devices.expand(["--device", "@by-driver:infiniband_verbs:efa"], sys_root=str(sys_root))
    with pytest.raises(devices.DeviceSelectionError, match="malformed"):
        devices.expand(["--device", "@by-driver:infiniband_verbs"], sys_root=str(sys_root))


def test_job_start_refuses_before_starting_when_this_node_has_no_efa(tmp_path):
    """This machine has no EFA: the job must not start (and must not run without it)."""
    marker = tmp_path / "ran"
    res = subprocess.run(
        [sys.executable, "-m", "remote", "job", "start", "--dir", str(tmp_path / "job"),
         "--cwd", str(tmp_path), "--attach", "--", "--device", "@by-driver:infiniband_verbs:efa",
         "touch", str(marker)],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2 and "no infiniband_verbs device bound to the 'efa' driver" in res.stderr
    assert not marker.exists() and not (tmp_path / "job").exists()
