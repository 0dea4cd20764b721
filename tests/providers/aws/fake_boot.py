"""A fake first boot of a cloud controller (issue 38): its set-up script, exactly as sent in
the user data / startup script (provision/cluster/providers/controller_boot.py), run by `sh`
on this machine with the image's python3 standing in, so a test sees whether the supervisor
would get a python the code supports (pyproject: requires-python >= 3.11; datetime.UTC).

What the image brings is a table read from the image's NAME (the fake cannot boot an AMI):

    image (name contains)              python3     source
    "Ubuntu 22.04" / "jammy-22.04"     3.10.12     Ubuntu 22.04 (jammy) python3 3.10 (packages.ubuntu.com/jammy/python3);
                                                   the Deep Learning Base AMI (Ubuntu 22.04) ships
                                                   the distribution's python3 (its release notes)
    "Ubuntu 24.04" / "noble-24.04"     3.12.3      Ubuntu 24.04 (noble) python3 3.12 (packages.ubuntu.com/noble/python3)
    "debian-12"                        3.11.2      Debian 12 (bookworm) python3 3.11 (packages.debian.org/bookworm/python3)

The sandbox: the script's absolute paths (/var/lib/mgpu-cloud, /opt/mgpu-cloud,
/etc/environment) are moved under a temporary root; PATH holds only the shell utilities the
script uses, a recording `apt-get`, and `python3` of the image's version. That `python3` is a
shim run by this interpreter: `-m venv DIR` makes DIR/bin/python (the same shim) and a
recording DIR/bin/pip; `-c CODE` runs CODE, with sys.version_info / sys.version of the image
when CODE reads them (an import check runs on this interpreter as it is).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

IMAGE_PYTHON = (("Ubuntu 22.04", "3.10.12"), ("jammy-22.04", "3.10.12"),
                ("Ubuntu 24.04", "3.12.3"), ("noble-24.04", "3.12.3"),
                ("debian-12", "3.11.2"))
MOVED = ("/var/lib/mgpu-cloud", "/opt/mgpu-cloud", "/etc/environment")
TOOLS = ("mkdir", "tail", "touch", "grep", "mv", "cat", "rm", "ln", "env", "true", "false")

SHIM = """#!{python}
import os, sys
VERSION = {version!r}
args = sys.argv[1:]
if args[:2] == ["-m", "venv"]:
    bindir = os.path.join(args[2], "bin")
    os.makedirs(bindir, exist_ok=True)
    for name in ("python", "python3"):
        if not os.path.exists(os.path.join(bindir, name)):
            os.symlink({shim!r}, os.path.join(bindir, name))
    with open(os.path.join(bindir, "pip"), "w") as fh:
        fh.write("#!/bin/sh\\necho \\"$@\\" >> {root}/pip.log\\n")
    os.chmod(os.path.join(bindir, "pip"), 0o755)
    sys.exit(0)
if args[:1] == ["-c"]:
    if "sys.version" in args[1]:  # what asks for the version sees the image's; imports run
        parts = tuple(int(p) for p in VERSION.split("."))  # on this interpreter as they are
        sys.version_info = parts + ("final", 0)
        sys.version = VERSION + " (the image's python3, emulated)"
    exec(compile(args[1], "<string>", "exec"), {{"__name__": "__main__"}})
    sys.exit(0)
sys.exit("python3 shim: unexpected arguments " + repr(args))
"""


def python_of(image_name: str) -> str:
    for needle, version in IMAGE_PYTHON:
        if needle in image_name:
            return version
    raise AssertionError(f"the fake boot does not know the python3 of image {image_name!r}")


@dataclass
class Booted:
    ready: bool
    failed: str  # the FAILED file (the set-up log's tail), "" when none
    python: str  # the venv's python, as the image has it
    path: str  # the PATH line of /etc/environment after the set-up ("" when not written)
    pip: str  # what pip was asked to install


def boot(script: str, python: str, root: Path) -> Booted:
    """Run the set-up `script` as an image whose python3 is `python` would."""
    for moved in MOVED:
        script = script.replace(moved, f"{root}{moved}")
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "environment").write_text('PATH="/usr/bin:/bin"\nLANG=C.UTF-8\n')
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        os.symlink(found, bindir / tool)
    (bindir / "apt-get").write_text(f"#!/bin/sh\necho apt-get \"$@\" >> {root}/apt.log\n")
    shim = bindir / "python3"
    shim.write_text(SHIM.format(python=sys.executable, version=python, shim=str(shim),
                                root=root))
    for exe in (bindir / "apt-get", shim):
        exe.chmod(0o755)
    sh = shutil.which("sh")
    assert sh
    subprocess.run([sh, "-c", script], env={"PATH": str(bindir), "HOME": str(root)},
                   check=True, timeout=120)
    state = root / "var/lib/mgpu-cloud"
    failed = state / "controller-failed"
    env = (root / "etc/environment").read_text()
    pip = root / "pip.log"
    return Booted(ready=(state / "controller-ready").exists(),
                  failed=failed.read_text() if failed.exists() else "", python=python,
                  path=next((line for line in env.splitlines() if line.startswith("PATH=")),
                            ""),
                  pip=pip.read_text() if pip.exists() else "")


def supports(python: str, minimum: tuple[int, int]) -> bool:
    return tuple(int(p) for p in python.split(".")[:2]) >= minimum
