"""`remote.pyz store push|pull`: many files between a node's folder and a durable store.

    remote.pyz store push --url URL --root DIR [--env-stdin] [--threads N] [REL...]
    remote.pyz store pull --url URL --root DIR [--env-stdin] [--threads N]

`push` uploads DIR/REL for every REL (default: every file in DIR) to URL/REL; `pull` replaces
DIR with everything under URL. Both work on many files at once (a thread each, up to
--threads) and print one JSON line {"files": N, "bytes": B, "seconds": S, "refused": [...]}.
`--env-stdin`: a JSON object of environment variables (credentials, endpoints) is read from
stdin first, so credentials never appear on a command line or in a file on the node.

What a node wrote is data (remote/storekeys.py): a key from a listing, or a REL, that would
leave its folder (`../x`, `/abs/x`, a symbolic link) is refused and named under "refused" (and
on stderr), never written or read where it points; everything else is still copied, so one
hostile object cannot stop a restore.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from remote.store import THREADS, Store, open_store
from remote.storekeys import UnsafeKey, checked_key, inside


def _safe(keys: Iterable[str], root: str | None, refused: list[str]) -> list[str]:
    """The keys that stay inside their folder (and inside `root` on this machine, links
    followed); the others are added to `refused`, with why on stderr."""
    out = []
    for key in keys:
        try:
            inside(root, key) if root is not None else checked_key(key)
        except UnsafeKey as exc:
            print(f"store: refused: {exc}", file=sys.stderr)
            refused.append(key)
            continue
        out.append(key)
    return out


def push(store: Store, root: str, rels: Iterable[str], threads: int = THREADS) -> dict[str, Any]:
    """Upload root/REL -> REL for every REL in parallel. Returns files, bytes, seconds."""
    refused: list[str] = []
    rels = _safe(sorted(set(rels)), root, refused)
    t0 = time.monotonic()
    sizes = [os.path.getsize(os.path.join(root, r)) for r in rels]
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(rels) or 1))) as pool:
        list(pool.map(lambda r: store.upload_file(os.path.join(root, r), r), rels))
    return {"files": len(rels), "bytes": sum(sizes), "seconds": round(time.monotonic() - t0, 3),
            "refused": refused}


def pull(store: Store, root: str, threads: int = THREADS) -> dict[str, Any]:
    """Replace `root` with everything in the store (downloaded in parallel into a sibling
    folder, then swapped in, so a half-done pull never looks like a checkpoint)."""
    t0 = time.monotonic()
    refused: list[str] = []
    keys = _safe(store.list(), None, refused)
    parent = os.path.dirname(os.path.abspath(root)) or "."
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(dir=parent, prefix=".pull-")

    def one(key: str) -> int:
        target = inside(stage, key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        store.download_file(key, target)
        return os.path.getsize(target)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(keys) or 1))) as pool:
            sizes = list(pool.map(one, keys))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(root, ignore_errors=True)
    os.replace(stage, root)
    return {"files": len(keys), "bytes": sum(sizes), "seconds": round(time.monotonic() - t0, 3),
            "refused": refused}


def _every_file(root: str) -> list[str]:
    return [os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root)
            for n in names]


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"remote.pyz {command}")
    parser.add_argument("action", choices=("push", "pull"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--env-stdin", action="store_true")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("files", nargs="*")
    args = parser.parse_intermixed_args(argv)
    if args.env_stdin:
        env = json.loads(sys.stdin.read() or "{}")
        os.environ.update({str(k): str(v) for k, v in env.items()})
    root = os.path.expanduser(args.root)
    try:
        store = open_store(args.url)
        if args.action == "push":
            result = push(store, root, args.files or _every_file(root), args.threads)
        else:
            result = pull(store, root, args.threads)
    except Exception as exc:  # noqa: BLE001 - reported as one line for the controller
        print(f"store {args.action} {args.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
