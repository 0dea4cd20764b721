"""remote.pyz carries its modules' bytecode (provision/nodes/bootstrap.py remote_zipapp): a
node whose python is this one's imports it; a node whose python differs, or a module whose
source differs from its bytecode, imports the source, as a zipapp without bytecode does."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from provision.nodes.bootstrap import remote_zipapp

# Which file each module was imported from, and a command that works (its help).
PROBE = ("import sys, remote.ckpt, remote.jobs; print(remote.ckpt.__file__); "
         "print(remote.jobs.__file__)")


def _members() -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(remote_zipapp())) as z:
        return {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}


def _write(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _imported_from(pyz: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(pyz)!r}); "
                          + PROBE], capture_output=True, text=True, check=True)
    return [line.rsplit("/", 1)[-1] for line in out.stdout.split()]


def test_every_module_has_checked_hash_bytecode_of_this_python() -> None:
    members = _members()
    sources = sorted(n for n in members if n.startswith("remote/") and n.endswith(".py"))
    assert "remote/jobs.py" in sources and "remote/ckpt.py" in sources
    for name in sources:
        pyc = members[name[:-3] + ".pyc"]
        assert pyc[:4] == importlib.util.MAGIC_NUMBER, name
        assert int.from_bytes(pyc[4:8], "little") == 0b11, name  # hash-based, checked
        assert pyc[8:16] == importlib.util.source_hash(members[name]), name


def test_a_node_with_this_python_imports_the_bytecode_and_its_commands_work(
        tmp_path: Path) -> None:
    pyz = tmp_path / "remote.pyz"
    pyz.write_bytes(remote_zipapp())
    assert _imported_from(pyz) == ["ckpt.pyc", "jobs.pyc"]
    res = subprocess.run([sys.executable, str(pyz), "ckpt-manifest", str(tmp_path)],
                         capture_output=True, text=True)
    assert res.returncode == 0 and '"files": {' in res.stdout, res.stdout + res.stderr


def test_another_pythons_bytecode_is_skipped_for_the_source(tmp_path: Path) -> None:
    """A node whose python has another magic number (3.10, 3.12: a cloud image's own)."""
    members = _members()
    for name in [n for n in members if n.endswith(".pyc")]:
        members[name] = b"\x00\x00\r\n" + members[name][4:]
    assert _imported_from(_write(tmp_path / "remote.pyz", members)) == ["ckpt.py", "jobs.py"]


def test_a_source_that_differs_from_its_bytecode_is_imported_from_the_source(
        tmp_path: Path) -> None:
    """The check is the source's hash: a pyc left beside an edited module is never run."""
    members = _members()
    members["remote/ckpt.py"] += b"\nEDITED = True\n"
    pyz = _write(tmp_path / "remote.pyz", members)
    assert _imported_from(pyz) == ["ckpt.py", "jobs.pyc"]
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(pyz)!r}); "
                          "import remote.ckpt; print(remote.ckpt.EDITED)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_a_controller_run_with_python_oo_still_ships_the_docstrings(tmp_path: Path) -> None:
    """The node's help texts are docstrings: -OO on this machine must not strip them there."""
    pyz = tmp_path / "remote.pyz"
    subprocess.run([sys.executable, "-OO", "-c", "from provision.nodes.bootstrap import "
                    f"remote_zipapp; open({str(pyz)!r}, 'wb').write(remote_zipapp())"],
                   check=True)
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(pyz)!r}); "
                          "import remote.jobs as j; print(j.__file__); print(bool(j.__doc__))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == [f"{pyz}/remote/jobs.pyc", "True"], out.stdout
