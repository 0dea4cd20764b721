"""`ckpt-manifest`: what is in the job's checkpoint folder, for the controller to keep safe.

    remote.pyz ckpt-manifest DIR   ->  one JSON line {"files": {"rel/path": [size, mtime]},
                                                      "incomplete": ["rel/path", ...],
                                                      "now": the node's clock}

The controller copies the files that changed and have not changed for a moment since (a save
is complete when its files stop changing), judged on the node's own clock. A file whose
format says it was cut short (a zip archive, as torch.save writes, without its end record; a
safetensors file shorter than its header says) is "incomplete": its writer died while
saving, so it stopped changing without being whole. It is never kept, nor restored.

Seals (issue 36, verified resume): a copy to the store ends with a seal written last,
`.mgpu/seals/NODE-TIME.json` {"node", "at", "files": {rel: [size, sha256]}}, so a restore takes
only files a seal vouches for, checked, and only whole steps (`step_of`).
"""

from __future__ import annotations

import json
import os
import re
import struct
import time

SEALS = ".mgpu/seals"  # under the checkpoint folder's store prefix
STEP = re.compile(r"(?:step|global_step|iter|iteration|checkpoint|ckpt)[_-]?(\d+)", re.I)
CHECKED = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".zip")


def step_of(rel: str) -> int | None:
    """The training step a checkpoint file belongs to, from its path (`step_000300.pt`,
    `global_step300/mp_rank_00_model_states.pt`); None for files of no step (`latest`)."""
    found = STEP.findall(rel)
    return int(found[-1]) if found else None


def whole(path: str) -> bool:
    """False when the file's own format shows it was cut short; True otherwise (formats
    this does not know are taken as whole)."""
    if not path.endswith(CHECKED):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if head[:4] == b"PK\x03\x04":
                import zipfile  # here: most polls find no zip (its import: 32 -> 21 ms a poll)

                try:
                    return zipfile.is_zipfile(path)  # finds the end record, or not
                except zipfile.BadZipFile:  # an end record it refuses (a "multi-disk" zip64)
                    return False
            if path.endswith(".safetensors") and len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                header = json.loads(fh.read(n))
                end = max((v["data_offsets"][1] for k, v in header.items()
                           if k != "__metadata__"), default=0)
                return bool(os.path.getsize(path) >= 8 + n + end)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return False
    return True


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
    files = manifest(root)
    incomplete = sorted(rel for rel in files if not whole(os.path.join(root, rel)))
    return {"files": files, "incomplete": incomplete, "now": round(time.time(), 3)}


def sha256(path: str) -> str:
    import hashlib  # seals only: not on a manifest's path

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(command: str, argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: remote.pyz {command} DIR")
        return 2
    print(json.dumps(report(os.path.expanduser(argv[0])), sort_keys=True))
    return 0
