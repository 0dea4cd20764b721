"""Where the shipped files are: templates/, Dockerfile, inventories/.

Installed (wheel): they live in provision/_assets/. From a source checkout (editable install or
PYTHONPATH): at the repository's top level, beside provision/.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent  # the provision package


@cache
def assets_root() -> Path:
    installed = _PKG / "_assets"
    if (installed / "templates").is_dir():
        return installed
    return _PKG.parent


def templates_dir() -> Path:
    return assets_root() / "templates"


def dockerfile_path() -> Path:
    return assets_root() / "Dockerfile"


def remote_package_dir() -> Path:
    import remote

    return Path(remote.__file__).resolve().parent
