"""`remote.pyz store push|pull`: many files between a node's folder and a durable store.

    remote.pyz store push --url URL --root DIR [--env-stdin] [--threads N] [--seal NODE] [REL...]
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

Verified resume (issue 36, remote/ckpt.py): `push --seal NODE` skips files cut short (named
under "incomplete") and writes, last, a seal of what it copied (sizes, sha256). `pull` of a
folder with seals restores only what a seal vouches for and what matches it; a step with a
file missing, unsealed or different (a copy cut by a crash) is left out whole, and said
("skipped"), so the job loads the newest complete checkpoint. A folder without seals (made
before them) is pulled as it is.
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

from remote.ckpt import SEALS, sha256, step_of, whole
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


def push(store: Store, root: str, rels: Iterable[str], threads: int = THREADS,
         seal: str | None = None) -> dict[str, Any]:
    """Upload root/REL -> REL for every REL in parallel. With `seal` (the node's name): files
    cut short are skipped, and a seal of the others is written last. Returns files, bytes,
    seconds, refused, incomplete."""
    refused: list[str] = []
    rels = _safe(sorted(set(rels)), root, refused)
    incomplete = [r for r in rels if seal and not whole(os.path.join(root, r))]
    rels = [r for r in rels if r not in incomplete]
    t0 = time.monotonic()

    def one(rel: str) -> tuple[int, str]:
        path = os.path.join(root, rel)
        digest = sha256(path) if seal else ""
        store.upload_file(path, rel)
        return os.path.getsize(path), digest

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(rels) or 1))) as pool:
        done = dict(zip(rels, pool.map(one, rels), strict=True))
    if seal and done:
        at = time.time()
        body = {"node": seal, "at": at, "files": {r: [n, d] for r, (n, d) in done.items()}}
        store.put_bytes(f"{SEALS}/{seal}-{at:.6f}.json", json.dumps(body).encode())
    return {"files": len(rels), "bytes": sum(n for n, _ in done.values()),
            "seconds": round(time.monotonic() - t0, 3), "refused": refused,
            "incomplete": incomplete}


def _vouched(store: Store, seals: list[str]) -> dict[str, tuple[int, str]]:
    """rel -> (size, sha256) by the newest seal naming it."""
    found: list[dict[str, Any]] = []
    for key in seals:
        try:
            found.append(json.loads(store.get_bytes(key) or b"{}"))
        except ValueError:
            continue
    out: dict[str, tuple[int, str]] = {}
    for seal in sorted(found, key=lambda s: float(s.get("at") or 0)):
        for rel, (size, digest) in dict(seal.get("files") or {}).items():
            out[str(rel)] = (int(size), str(digest))
    return out


def pull(store: Store, root: str, threads: int = THREADS) -> dict[str, Any]:
    """Replace `root` with everything in the store (downloaded in parallel into a sibling
    folder, then swapped in, so a half-done pull never looks like a checkpoint); with seals,
    only whole, vouched steps (see the module doc)."""
    t0 = time.monotonic()
    refused: list[str] = []
    listed = _safe(store.list(), None, refused)
    seals = [k for k in listed if k.startswith(SEALS + "/")]
    keys = [k for k in listed if not k.startswith(".mgpu/")]
    vouch = _vouched(store, seals) if seals else None
    bad: dict[str, str] = {}  # rel -> why it cannot be restored
    if vouch is not None:
        bad.update({k: "not sealed (its copy did not finish)" for k in keys if k not in vouch})
        bad.update({k: "missing" for k in vouch if k not in keys})
    parent = os.path.dirname(os.path.abspath(root)) or "."
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(dir=parent, prefix=".pull-")

    def one(key: str) -> int:
        target = inside(stage, key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        store.download_file(key, target)
        size = os.path.getsize(target)
        if vouch is not None and (size, sha256(target)) != vouch[key]:
            bad[key] = "its bytes differ from its seal"
        return size

    wanted = [k for k in keys if k not in bad]
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(wanted) or 1))) as pool:
            sizes = dict(zip(wanted, pool.map(one, wanted), strict=True))
        skipped = _drop_broken_steps(stage, list(sizes), bad)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(root, ignore_errors=True)
    os.replace(stage, root)
    kept = [k for k in sizes if os.path.exists(os.path.join(root, k))]
    return {"files": len(kept), "bytes": sum(sizes[k] for k in kept),
            "seconds": round(time.monotonic() - t0, 3), "refused": refused,
            "skipped": skipped, "newest_step": max(
                (s for s in map(step_of, kept) if s is not None), default=None)}


def _drop_broken_steps(stage: str, pulled: list[str], bad: dict[str, str]) -> list[str]:
    """Remove from `stage` every file of a step that has a bad file; what was skipped, said."""
    broken = {step_of(rel): why for rel, why in bad.items()}
    out = []
    for step, why in sorted(broken.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        files = [r for r in pulled if step is not None and step_of(r) == step]
        for rel in files:
            os.unlink(os.path.join(stage, rel))
        what = f"step {step}" if step is not None else "a file of no step"
        out.append(f"{what}: {why}")
        print(f"store: checkpoint {what} is incomplete ({why}): skipped", file=sys.stderr)
    return out


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
    parser.add_argument("--seal", help="push: seal what was copied, as this node")
    parser.add_argument("files", nargs="*")
    args = parser.parse_intermixed_args(argv)
    if args.env_stdin:
        env = json.loads(sys.stdin.read() or "{}")
        os.environ.update({str(k): str(v) for k, v in env.items()})
    root = os.path.expanduser(args.root)
    try:
        store = open_store(args.url)
        if args.action == "push":
            result = push(store, root, args.files or _every_file(root), args.threads,
                          seal=args.seal)
        else:
            result = pull(store, root, args.threads)
    except Exception as exc:  # noqa: BLE001 - reported as one line for the controller
        print(f"store {args.action} {args.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
