"""`mgpu-cloud run` of a 2x2 docker job: the job's own time against the whole command, and
where the rest goes, in one run.

    job      the job itself, the span run_job measures ("job finished on all 2 node(s) in X s":
             from the launch to the last node's exit; the baseline every `run` pays anyway),
             stamped here from its two lines ("launching ..." and "job finished ...") to the
             millisecond, since X is printed to 0.1 s
    run      the whole `python -m provision.cli run --nodes 2 --nproc-per-node 2 SCRIPT`
             (CLI start, plan, create, bootstrap, launch, fetch, keep logs, destroy, cost)
    overhead run - job, per run, then the median (target: <= 1.5 s)
    engine   the Docker engine's own part of it, measured alone in the same run (two
             containers made and removed through the SDK on a network that exists, as on the
             shared one, nothing else; and apart, a network made and removed)

The phase table stamps each line the CLI prints on stderr with the seconds since the command
started (median over the repeats): the gap before a line is the step that line ends. With
--torchx, TorchX's `dist.ddp -j 2x2` on its local_docker scheduler runs the same script in
the same image (goal: run <= 0.9 x torchx); without torchx installed it says so. With
`--against REV` (benchmarks/revisions.py), REV's CLI runs the same job too, interleaved.
Usage: python benchmarks/run_overhead.py [--repeat 5] [--torchx] [--against REV]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from revisions import trees  # noqa: E402
from up_time import node_image  # noqa: E402

SCRIPT = 'import os; print(f"rank {os.environ[\'RANK\']} ran", flush=True)\n'
# The lines that end a step (first match per run), in the order `run` prints them.
MARKS = [
    ("creating", r"^creating \d+ node"),
    ("nodes made", r"^bootstrapping nodes"),
    ("bootstrapped", r"^bootstrapped \d+ node"),
    ("job record", r"^job \d+ \(its log"),
    ("launch", r"^launching "),
    ("job finished", r"^job finished on all"),
    ("outputs back", r"^copied \d+ output file"),
    ("cluster removed", r"^cluster '.*' removed"),
    ("cost line", r"^cost: .* = \$"),
    ("timeline line", r"^run timeline:"),
]


def one_run(work: Path, env: dict[str, str], name: str) -> tuple[float, float, dict[str, float]]:
    """(end to end s, job s, mark -> s since start) of one `run`."""
    argv = [sys.executable, "-m", "provision.cli", "run", "--provider", "docker", "--nodes",
            "2", "--nproc-per-node", "2", "--name", name, "--fabric-check", "off", "job.py"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stderr:
        now = time.perf_counter() - t0
        lines.append(line)
        for label, rx in MARKS:
            if label not in marks and re.search(rx, line.strip()):
                marks[label] = now
                break
    out = proc.stdout.read() if proc.stdout else ""
    code = proc.wait()
    total = time.perf_counter() - t0
    if code != 0 or out.count(" ran") < 4:
        raise SystemExit(f"run failed ({code}):\n{out}\n{''.join(lines)[-3000:]}")
    # The job's time is the span `run` prints ("launching ..." to "job finished ... in X s":
    # the same two instants), stamped here: its printed X has one decimal, and a rounding of
    # up to 0.05 s would go into the overhead.
    job = marks["job finished"] - marks["launch"]
    return total, job, marks


def engine_floor(image: str) -> tuple[float, float]:
    """What the engine alone spends on a 2-node cluster's life, no job, no sshd wait: two
    containers of the node image made and started in parallel on an existing network (SSH
    port published, 1 GB /dev/shm, as the provider makes them on the shared one), then both
    removed. The part of the overhead that no change of this tool's own can cut. Also timed,
    apart: a network made and removed (what each cluster paid when it had its own)."""
    import docker

    api = docker.from_env().api
    net_start = time.perf_counter()
    net = api.create_network("bench-floor-net", driver="bridge")["Id"]
    net_made = time.perf_counter() - net_start

    def one(i: int) -> str:
        cid = api.create_container(
            image, command="sleep 600", name=f"bench-floor-{i}", ports=[22], detach=True,
            host_config=api.create_host_config(port_bindings={22: ("127.0.0.1", None)},
                                               network_mode="bench-floor-net", shm_size="1g"))
        api.start(cid["Id"])
        return str(cid["Id"])

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:
            ids = list(pool.map(one, range(2)))
            list(pool.map(lambda cid: api.remove_container(cid, force=True), ids))
        floor = time.perf_counter() - start
        net_start = time.perf_counter()
        api.remove_network(net)
        return floor, net_made + time.perf_counter() - net_start
    except BaseException:  # after a failure: nothing left on the engine
        subprocess.run(["docker", "rm", "-f", "bench-floor-0", "bench-floor-1"],
                       capture_output=True)
        subprocess.run(["docker", "network", "rm", "bench-floor-net"], capture_output=True)
        raise


def torchx_run(work: Path, image: str) -> float | None:
    if shutil.which("torchx") is None:
        return None
    t0 = time.perf_counter()
    done = subprocess.run(["torchx", "run", "-s", "local_docker", "dist.ddp", "-j", "2x2",
                           "--image", image, "--script", "job.py"], cwd=work,
                          capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    # local_docker leaves its exited containers behind (labelled with the app id), and the
    # image it built of the workspace for them (untagged: one per run)
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=torchx.pytorch.org/app-id"],
                          capture_output=True, text=True).stdout.split()
    if left:
        built = set(subprocess.run(["docker", "inspect", "-f", "{{.Image}}", *left],
                                   capture_output=True, text=True).stdout.split())
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        base = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image],
                              capture_output=True, text=True).stdout.strip()
        if built - {base}:
            subprocess.run(["docker", "rmi", *(built - {base})], capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"torchx failed:\n{done.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--torchx", action="store_true", help="also time TorchX local_docker")
    parser.add_argument("--against", metavar="REV", help="also time `run` of git revision REV")
    args = parser.parse_args()
    tx: list[float] = []
    floors: list[float] = []
    own_nets: list[float] = []
    # tree label -> (totals, jobs, mark -> seconds)
    seen: dict[str, tuple[list[float], list[float], dict[str, list[float]]]] = {}
    image = node_image()  # the one every run, the floor and TorchX use
    with tempfile.TemporaryDirectory() as tmp, trees(args.against) as found:
        work = Path(tmp)
        (work / "job.py").write_text(SCRIPT)
        for i in range(args.repeat):
            # interleaved, the first of each pair alternating: the machine's load, and what
            # the engine still does after the run before, hit both alike
            for tree in found if i % 2 == 0 else found[::-1]:
                env = tree.env(MGPU_CLOUD_HOME=str(work / f"home-{tree.label}"))
                total, job, stamps = one_run(work, env, f"bench-run-{i}")
                totals, jobs, steps = seen.setdefault(tree.label, ([], [], {}))
                totals.append(total)
                jobs.append(job)
                for k, v in stamps.items():
                    steps.setdefault(k, []).append(v)
            floor, own_net = engine_floor(image)
            floors.append(floor)
            own_nets.append(own_net)
            if args.torchx:
                took = torchx_run(work, image)
                if took is not None:
                    tx.append(took)
    med = statistics.median
    print(f"run 2x2 on docker, medians of {args.repeat}, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
          + (f"; trees interleaved: {', '.join(seen)}" if len(seen) > 1 else ""))
    print(f"  engine floor {med(floors):5.2f} s (2 containers made and removed on a network "
          "that exists, no sshd, no job: no change of the tool's own can cut it); a network "
          f"of the cluster's own, made and removed, would add {med(own_nets):.2f} s")
    for label, (totals, jobs, steps) in seen.items():
        overhead = med(t - j for t, j in zip(totals, jobs, strict=True))  # per run, then median
        print(f"  [{label}] job (baseline) {med(jobs):6.2f} s   run {med(totals):6.2f} s   "
              f"overhead {overhead:5.2f} s (target <= 1.5)   jobs {min(jobs):.2f}-"
              f"{max(jobs):.2f} s (torchrun's start here has two modes, ~0.4 s apart)")
        print("  step ending with              at s    step s")
        last = 0.0
        for mark, _ in MARKS:
            if mark in steps:
                at = med(steps[mark])
                print(f"  {mark:<28} {at:6.2f}  {at - last:6.2f}")
                last = at
        print(f"  {'(exit)':<28} {med(totals):6.2f}  {med(totals) - last:6.2f}")
        if args.torchx and tx:
            print(f"  torchx local_docker dist.ddp -j 2x2: {med(tx):.2f} s; run / torchx "
                  f"{med(totals) / med(tx):.2f} (goal <= 0.9)")
    if args.torchx and not tx:
        print("  torchx: NOT ON PATH (python3 -m venv /tmp/txv && /tmp/txv/bin/pip install "
              "torchx docker, then PATH=/tmp/txv/bin:$PATH; its own venv: torchx pins "
              "urllib3<2): no comparison made")


if __name__ == "__main__":
    main()
