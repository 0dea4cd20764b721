"""Goodput under steady faults (issue 44): a job on docker nodes for a fixed time, a random
node killed every M seconds (and, in a managed run, the controller once), the run's ledger
against the wall clock x nodes, and the checkpoint interval it advises beside the measured
optimum of a sweep.

    python benchmarks/steady_faults.py [--nodes 4] [--minutes 10] [--every 120]
        [--save-every 25 50 100] [--how relaunch] [--spares 0] [--managed] [--seed 1]

One run per --save-every value (steps between checkpoints: the sweep), each `mgpu-cloud run
--nodes N --max-restarts 1000 --nproc-per-node 1` of the script (--sleep 0.1 s a step, a step
line every 10), for --minutes of wall clock from the CLI's start:
  faults   once the first checkpoint is kept, every --every s a random rank's container is
           killed (`docker kill` of the container the inventory names for that rank); a kill
           waits for the run to train again ("resumed from step") after the last one
  managed  (--managed) `run --detach --store file://...`: the cluster's controller
           supervises; its container is killed once, half-way, and `mgpu-cloud jobs` every
           10 s takes the job back (after its 45 s of silence), as a user's next command does
  end      attached: SIGTERM (the run closes its ledger, then tears the cluster down);
           managed: `mgpu-cloud cancel`, then the store's final record
Per run: the ledger's buckets (node-seconds; the job record, or the store's control/ledger),
their sum against the wall clock measured here x (nodes + spares), goodput, the seconds
between checkpoints measured from the save lines, and the ledger's advice (arXiv 2410.18124:
Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2) from the run's own save time, time between failures
and recovery time); then the measured optimum, the swept interval with the best goodput.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_time import SCRIPTS  # noqa: E402
from revisions import current  # noqa: E402

from provision.model.inventory import InventoryStore  # noqa: E402
from provision.model.jobstore import JobStore  # noqa: E402

SAVED = re.compile(r"\[node-\d+\] checkpoint saved: step \d+")


@dataclass
class Lines:
    """A run's output lines as they arrive, timestamped (monotonic)."""

    seen: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, text: str) -> None:
        with self.lock:
            self.seen.append((time.monotonic(), text))

    def since(self, t: float, pattern: str) -> float | None:
        """When a line matching `pattern` first arrived after `t` (None: not yet)."""
        with self.lock:
            return next((at for at, text in self.seen if at >= t and re.search(pattern, text)),
                        None)

    def interval_s(self) -> float | None:
        """The median time between two checkpoint saves of one attempt."""
        with self.lock:  # a restart's "resumed" line ends one attempt's run of saves
            marks = [(at, bool(SAVED.search(text))) for at, text in self.seen
                     if SAVED.search(text) or "resumed from step" in text]
        gaps = [b[0] - a[0] for a, b in zip(marks, marks[1:], strict=False) if a[1] and b[1]]
        return statistics.median(gaps) if gaps else None


def kill_a_rank(home: str, name: str, rng: random.Random) -> str:
    """`docker kill` of a random rank's container, as the inventory names it now."""
    inv = InventoryStore(Path(home)).load(name)
    node = rng.choice(inv.nodes)
    subprocess.run(["docker", "kill", node.resource_id or f"{name}-{node.name}"], check=True,
                   capture_output=True)
    return node.name


def faults(args: argparse.Namespace, lines: Lines, home: str, name: str, t0: float,
           rng: random.Random, side: object = None) -> int:
    """Kill a random rank every --every s from the first checkpoint on, until the end of the
    window; returns how many were killed. `side()`: called every second (managed: `jobs`,
    the controller's kill)."""
    end = t0 + args.minutes * 60
    kills, last = 0, None
    next_at: float | None = None
    while time.monotonic() < end:
        time.sleep(1.0)
        if callable(side):
            side()
        if next_at is None:
            first = lines.since(t0, r"checkpoint saved")
            next_at = None if first is None else first + args.every
            continue
        back = last is None or lines.since(last, r"resumed from step") is not None
        if time.monotonic() >= next_at and back:
            who = kill_a_rank(home, name, rng)
            last, kills = time.monotonic(), kills + 1
            next_at = last + args.every
            print(f"  {last - t0:7.1f} s: killed {who}", flush=True)
    return kills


def attached(args: argparse.Namespace, every_steps: int, tmp: str,
             rng: random.Random) -> dict[str, object]:
    name = f"bench-sf-{os.getpid()}-{every_steps}"
    home = f"{tmp}/home-{every_steps}"
    tree = current()
    lines = Lines()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*tree.cli(), "run", "--nodes", str(args.nodes), "--name", name, "--max-restarts",
         "1000", "--nproc-per-node", "1", *spares(args), SCRIPTS[args.how], *job(every_steps)],
        cwd=tmp, env=tree.env(MGPU_CLOUD_HOME=home, PYTHONUNBUFFERED="1"), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    out = proc.stdout
    reader = threading.Thread(target=lambda: [lines.add(x) for x in out], daemon=True)
    reader.start()
    try:
        kills = faults(args, lines, home, name, t0, rng)
    finally:
        proc.send_signal(signal.SIGTERM)  # the run closes its ledger, then tears down
        proc.wait(timeout=900)
        reader.join(30)
    ended = lines.since(t0, r"node-hours: ") or time.monotonic()
    ledger = JobStore(Path(home)).latest(name).ledger or {}
    return report(args, every_steps, ended - t0, ledger, kills, lines.interval_s())


def managed(args: argparse.Namespace, every_steps: int, tmp: str,
            rng: random.Random) -> dict[str, object]:
    name = f"bench-sfm-{os.getpid()}-{every_steps}"
    home, store = f"{tmp}/mhome-{every_steps}", Path(f"{tmp}/store-{every_steps}")
    store.mkdir(parents=True)
    tree = current()
    env = tree.env(MGPU_CLOUD_HOME=home)
    lines, t0 = Lines(), time.monotonic()
    subprocess.run([*tree.cli(), "run", "--detach", "--store", f"file://{store}", "--nodes",
                    str(args.nodes), "--name", name, "--max-restarts", "1000",
                    "--nproc-per-node", "1", *spares(args), SCRIPTS[args.how],
                    *job(every_steps)], cwd=tmp, env=env, check=True, capture_output=True)
    job_dir = store / name / "jobs" / "1"
    done: set[Path] = set()
    state = {"jobs_at": 0.0, "controller": False}

    def side() -> None:
        for log in sorted((job_dir / "log").glob("*.log")):  # the controller's log objects
            if log not in done:
                done.add(log)
                for text in log.read_text(errors="replace").splitlines():
                    lines.add(text)
        now = time.monotonic()
        if not state["controller"] and now - t0 >= args.minutes * 30:
            subprocess.run(["docker", "kill", f"{name}-controller"], capture_output=True)
            state["controller"] = True
            print(f"  {now - t0:7.1f} s: killed the controller", flush=True)
        if now - float(state["jobs_at"]) >= 10:  # a user's next command takes the job back
            state["jobs_at"] = now
            subprocess.run([*tree.cli(), "jobs", name], env=env, capture_output=True)

    kills = faults(args, lines, home, name, t0, rng, side)
    subprocess.run([*tree.cli(), "cancel", name, "1"], env=env, capture_output=True)
    ended = None
    while ended is None or not any("torn_down" in p.read_text() for p in
                                   (job_dir / "events").glob("*.json")):
        time.sleep(1.0)
        finals = [p for p in (job_dir / "events").glob("*.json")
                  if json.loads(p.read_text()).get("state") == "cancelled"]
        ended = ended or (time.monotonic() if finals else None)
        side()
        if time.monotonic() - t0 > args.minutes * 60 + 900:
            raise SystemExit(f"{name}: no final record in the store")
    ledger = json.loads((job_dir / "control" / "ledger").read_text())
    led = {"node_seconds": ledger["seconds"], "spares": ledger["spares"]}
    from provision.job.ledger import Ledger

    data = Ledger.resume(ledger).to_json()
    led.update({k: data[k] for k in ("goodput", "advice_s", "save_cost_s", "recovery_s",
                                     "failures")})
    return report(args, every_steps, ended - t0, led, kills, lines.interval_s())


def spares(args: argparse.Namespace) -> list[str]:
    return ["--spares", str(args.spares)] if args.spares else []


def job(every_steps: int) -> list[str]:
    return ["--steps", "100000000", "--save-every", str(every_steps), "--sleep", "0.1",
            "--log-every", "10"]


def report(args: argparse.Namespace, every_steps: int, wall: float, led: dict[str, object],
           kills: int, interval: float | None) -> dict[str, object]:
    secs = led.get("node_seconds") or {}
    assert isinstance(secs, dict)
    total = sum(float(v) for v in secs.values())
    paid = wall * (args.nodes + args.spares)
    return {"save_every": every_steps, "interval_s": interval, "wall_s": wall, "kills": kills,
            "failures": led.get("failures"), "goodput": led.get("goodput"),
            "advice_s": led.get("advice_s"), "save_s": led.get("save_cost_s"),
            "recovery_s": led.get("recovery_s"), "buckets": secs,
            "reconciled": (total - paid) / paid if paid else None}


def show(r: dict[str, object]) -> None:
    secs = r["buckets"]
    assert isinstance(secs, dict)
    total = sum(float(v) for v in secs.values()) or 1.0
    parts = ", ".join(f"{k} {100 * float(v) / total:.1f}%" for k, v in secs.items()
                      if float(v) > 0)
    interval = r["interval_s"]
    print(f"save every {r['save_every']} steps (~{interval or 0:.1f} s): goodput "
          f"{100 * float(r['goodput'] or 0):.1f}%, {r['kills']} kill(s) / {r['failures']} "
          f"failure(s) in {float(r['wall_s']):.0f} s; buckets {parts}; their sum vs wall x "
          f"nodes: {100 * float(r['reconciled'] or 0):+.2f}%; Ts {r['save_s']} s, Tr "
          f"{r['recovery_s']} s -> advice ~{r['advice_s']} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=120.0, help="seconds between kills")
    ap.add_argument("--save-every", type=int, nargs="+", default=[25, 50, 100])
    ap.add_argument("--how", choices=sorted(SCRIPTS), default="relaunch")
    ap.add_argument("--spares", type=int, default=0)
    ap.add_argument("--managed", action="store_true", help="run --detach --store, and kill "
                    "the controller once")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"{args.nodes} nodes x 1 process, {args.spares} spare(s), {args.how}, "
          f"{'managed' if args.managed else 'attached'}; {args.minutes:g} min each, a node "
          f"killed every {args.every:g} s; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for every_steps in args.save_every:
            run = managed if args.managed else attached
            results.append(run(args, every_steps, tmp, rng))
            show(results[-1])
    best = max(results, key=lambda r: float(r["goodput"] or 0))
    advised = [r["advice_s"] for r in results if r["advice_s"] is not None]
    print(f"measured optimum: every {best['save_every']} steps (~{best['interval_s'] or 0:.1f} "
          f"s between saves), goodput {100 * float(best['goodput'] or 0):.1f}%; the ledger's "
          f"advice: ~{statistics.median(float(a) for a in advised) if advised else 0:.1f} s "
          f"(median over the runs); load {os.getloadavg()[0]:.1f} at the end", flush=True)


if __name__ == "__main__":
    main()
