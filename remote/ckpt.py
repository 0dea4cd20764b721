"""`ckpt-manifest`: what is in the job's checkpoint folder, for the controller to keep safe.

    remote.pyz ckpt-manifest DIR   ->  one JSON line {"files": {"rel/path": [size, mtime]},
                                                      "now": the node's clock}

The controller copies the files that changed and have not changed for a moment since (a save
is complete when its files stop changing), judged on the node's own clock.
"""

from __future__ import annotations

import json
import os
import time


def manifest(root: str) -> dict[str, list[float]]:
    files: dict[str, list[float]] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # removed while we looked
            files[os.path.relpath(path, root)] = [st.st_size, round(st.st_mtime, 3)]
    return files


def report(root: str) -> dict[str, object]:
    """What `ckpt-manifest` prints (and an attached job's end line carries, remote/jobs.py)."""
    return {"files": manifest(root), "now": round(time.time(), 3)}


def main(command: str, argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: remote.pyz {command} DIR")
        return 2
    print(json.dumps(report(os.path.expanduser(argv[0])), sort_keys=True))
    return 0
