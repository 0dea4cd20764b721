"""What `up` and `run` import before their first provider call, and what the CLI's models
cost to build (pydantic's plugin scan, turned off in provision/cli/__init__.py).

Fabric and paramiko (~0.2 s) are imported on a thread while the provider waits on its API
(provision/nodes/pool.py `import_ssh_stack_while_waiting`); a module-level import anywhere on the way
to the first call puts them back in front of it (as provision/nodes/bootstrap.py once did for
`run`, through provision.job.lifecycle: "creating" came 0.2 s later than in round two).
"""

from __future__ import annotations

import json
import os
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


def test_the_ssh_stack_waits_for_the_provider() -> None:
    """Asked for before `create`, imported only once the provider says it waits."""
    code = ("import sys, threading, time\n"
            "from provision.nodes import pool\n"
            "pool.import_ssh_stack_while_waiting()\n"
            "time.sleep(0.5)\n"
            "before = 'paramiko' in sys.modules\n"
            "pool.provider_waits()\n"
            "end = time.monotonic() + 60\n"
            "while 'fabric' not in sys.modules and time.monotonic() < end:\n"
            "    time.sleep(0.01)\n"
            "print(before, 'fabric' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.split() == ["False", "True"]


def pydantic_plugin_scans(env_value: str | None) -> list[str]:
    """The entry-point groups scanned while a CLI command builds its models (`up --nodes 0`
    is refused by the spec's validation: the models are built, nothing is asked of Docker)."""
    code = (
        "import json, sys\n"
        "import pydantic.plugin._loader as loader\n"
        "seen = []\n"
        "real = loader.entry_points\n"
        "loader.entry_points = lambda **kw: seen.append(kw.get('group')) or real(**kw)\n"
        "sys.argv = ['mgpu-cloud', 'up', '--provider', 'docker', '--nodes', '0']\n"
        "from provision.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'provision.model.spec' in sys.modules, 'no model was built'\n"
        "print(json.dumps(seen))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if env_value is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = env_value
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_cli_does_not_scan_for_pydantic_plugins() -> None:
    assert pydantic_plugin_scans(None) == []


def test_the_plugin_check_can_fail() -> None:
    # a value the caller set is kept: "" (not a "disable" word) lets pydantic scan
    assert pydantic_plugin_scans("") == ["pydantic"]
