"""Device nodes picked on the node by the kernel driver bound to them, not by index.

A provider that cannot know a node's device numbering asks for devices with a selector word in
the container's `--device` argument (provision/nodes/container.py `by_driver`):

    --device @by-driver:infiniband_verbs:efa

`job start` (remote/jobs.py) replaces each such pair with one `--device PATH` per device of
the sysfs class whose driver is the one named, before anything starts. Why: an AWS B200 node
can carry mlx5 (ConnectX) uverbs devices beside its EFA ones; handing those to the container
makes libfabric's EFA provider fail (`fi_getinfo -61`) and NCCL fall back to TCP sockets
(aws-samples/aws-do-eks PR #63), and EFA devices are then not uverbs0..N-1 either.

Sysfs (Documentation/ABI/testing/sysfs-class-infiniband and sysfs-devices): each device is
/sys/class/CLASS/NAME, `device/driver` links to the bound driver (…/drivers/efa), and `uevent`
names the device node (DEVNAME=infiniband/uverbs3 -> /dev/infiniband/uverbs3).
Stdlib only (runs on the nodes).
"""

from __future__ import annotations

import os
import re

SELECTOR = "@by-driver:"


class DeviceSelectionError(Exception):
    """A selector matched no device (or is malformed): the job must not start without them."""


def _natural(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _devname(entry: str) -> str | None:
    try:
        with open(os.path.join(entry, "uevent")) as fh:
            for line in fh:
                key, _, value = line.strip().partition("=")
                if key == "DEVNAME" and value:
                    return value
    except OSError:
        return None
    return None


def by_driver(sysfs_class: str, driver: str, *, sys_root: str = "/sys",
              dev_root: str = "/dev") -> list[str]:
    """Device node paths of the `sysfs_class` devices bound to `driver`, in natural order
    (uverbs2 before uverbs10). [] when the class does not exist on this machine."""
    class_dir = os.path.join(sys_root, "class", sysfs_class)
    try:
        names = sorted(os.listdir(class_dir), key=_natural)
    except OSError:
        return []
    out = []
    for name in names:
        entry = os.path.join(class_dir, name)
        bound = os.path.basename(os.path.realpath(os.path.join(entry, "device", "driver")))
        if bound != driver:
            continue
        devname = _devname(entry) or name
        out.append(os.path.join(dev_root, devname))
    return out


def expand(argv: list[str], *, sys_root: str = "/sys", dev_root: str = "/dev") -> list[str]:
    """`argv` with every `--device @by-driver:CLASS:DRIVER` pair replaced by one `--device
    PATH` pair per matching device. DeviceSelectionError when a selector matches nothing or
    is malformed (a job that needs EFA must not start silently without it)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if word == "--device" and value.startswith(SELECTOR):
            sysfs_class, _, driver = value[len(SELECTOR):].partition(":")
            if not sysfs_class or not driver:
                raise DeviceSelectionError(f"malformed device selector {value!r}; expected "
                                           f"{SELECTOR}CLASS:DRIVER")
            found = by_driver(sysfs_class, driver, sys_root=sys_root, dev_root=dev_root)
            if not found:
                raise DeviceSelectionError(
                    f"no {sysfs_class} device bound to the {driver!r} driver on this node "
                    f"({os.path.join(sys_root, 'class', sysfs_class)}); the job needs them "
                    "(is the driver loaded? lsmod, dmesg)")
            for path in found:
                out += ["--device", path]
            i += 2
            continue
        out.append(word)
        i += 1
    return out
