"""A non-editable install finds templates, the Dockerfile and the `remote` package."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_carries_assets_and_works_installed(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("mgpu_cloud-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("provision/_assets/Dockerfile", "provision/_assets/templates/hostfile.j2",
                     "provision/_assets/templates/docker/node-entrypoint.sh",
                     "provision/_assets/templates/nccl/aws-efa.env.j2",
                     "provision/_assets/inventories/onprem.example.yaml",
                     "remote/cli.py", "remote/supervise.py", "provision/cli/__init__.py",
                     "provision/operations/dashboard/templates/base.html",
                     "provision/operations/dashboard/templates/job.html",
                     "provision/operations/dashboard/static/dashboard.js",
                     "provision/operations/dashboard/static/pages.js",
                     "provision/operations/dashboard/static/dashboard.css",
                     "provision/operations/dashboard/static/vendor/uPlot.iife.min.js",
                     "provision/operations/dashboard/static/vendor/uPlot.min.css",
                     "provision/operations/dashboard/static/vendor/uPlot.LICENSE"):
        assert required in names, required
    assert any(n.endswith("entry_points.txt") for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    probe = (
        "from provision.model.assets import assets_root, dockerfile_path, templates_dir\n"
        "from provision.nodes.bootstrap import remote_zipapp\n"
        "from provision.model.render import render\n"
        "print(assets_root()); assert dockerfile_path().is_file()\n"
        "assert (templates_dir() / 'hostfile.j2').is_file()\n"
        "assert len(remote_zipapp()) > 1000\n"
        "assert render('nccl/tcp.env.j2')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(target / "provision" / "_assets")
