"""What `up` and `run` import before their first provider call.

Fabric and paramiko (~0.1 s) are imported on a thread while the provider waits on its API
(provision/cluster/pipeline.py `_import_ssh_stack`); a module-level import anywhere on the way
to the first call puts them back in front of it (as provision/nodes/bootstrap.py once did for
`run`, through provision.job.lifecycle: "creating" came 0.2 s later than in round two).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SSH_STACK = ("paramiko", "fabric", "invoke")


def loaded_after(*modules: str) -> list[str]:
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules)
            + f"print(json.dumps([m for m in {list(SSH_STACK)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return list(json.loads(out))


@pytest.mark.parametrize("command, modules", [
    ("up", ("provision.cli.commands", "provision.cluster.pipeline",
            "provision.cluster.providers.docker.provider")),
    ("run", ("provision.cli.commands", "provision.job.lifecycle",
             "provision.cluster.providers.docker.provider")),
])
def test_the_ssh_stack_is_not_imported_before_the_first_provider_call(
        command: str, modules: tuple[str, ...]) -> None:
    assert loaded_after(*modules) == [], f"`{command}` imports the SSH stack up front"


def test_the_check_can_fail() -> None:
    assert "paramiko" in loaded_after("provision.nodes.sshconn")
