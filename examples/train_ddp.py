"""A small, real DDP training: regression on data it generates, on CPU (gloo) or GPU (nccl).

Runs unchanged on one machine, on emulated docker nodes, or on a GPU cluster:
    torchrun --nproc_per_node 2 examples/train_ddp.py --steps 50
    mgpu-cloud run --provider docker --nodes 2 examples/train_ddp.py --steps 50
    mgpu-cloud run --nodes 2 --max-restarts 3 examples/train_ddp.py --steps 500 --save-every 50

Rank 0 prints the loss and saves the final model to $MGPU_OUTPUT_DIR (default ./outputs).
Every rank prints one line `rank R/W on HOST: ...` so a test (or you) can account for all ranks.

Checkpoints (the pattern mgpu-cloud's recovery expects, in a few lines): rank 0 saves to
$MGPU_CHECKPOINT_DIR every --save-every steps and when SIGUSR1 arrives (a preemption notice);
at start every rank loads the newest checkpoint there, if any. mgpu-cloud keeps that folder
safe off the nodes and puts it back on every node before a restart.

Rank 0 ends with `samples/s=X`: global samples per second after the first (warm-up) step,
the metric `mgpu-cloud scale` compares across cluster sizes.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CKPT_DIR = os.environ.get("MGPU_CHECKPOINT_DIR", "checkpoints")
RESTART = int(os.environ.get("MGPU_RESTART_COUNT", "0"))
save_requested = False


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: off)")
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    p.add_argument("--fail-at-step", type=int, default=-1, help="raise on rank 0 (testing)")
    p.add_argument("--fail-once-at-step", type=int, default=-1,
                   help="raise on rank 0, first attempt only (testing recovery)")
    p.add_argument("--hold-once-at-step", type=int, default=-1,
                   help="every rank stops at this step until killed, in one attempt only "
                        "(--hold-in-restart; testing: a node lost mid-run is lost before the "
                        "job can end)")
    p.add_argument("--hold-in-restart", type=int, default=0,
                   help="the attempt (MGPU_RESTART_COUNT) that --hold-once-at-step holds "
                        "(the first)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (testing)")
    p.add_argument("--compute-every", type=int, default=0,
                   help="every N steps each rank prints `step S compute=SECONDS` (its forward "
                        "pass, which waits for no other rank: how mgpu-cloud tells a slow node)")
    p.add_argument("--start-after", default="",
                   help="wait (at most 10 min) for this file on the node before starting "
                        "(testing: a job that cannot end before its test lets it)")
    p.add_argument("--ignore-checkpoint", action="store_true",
                   help="start at step 0 even with a checkpoint there (testing the resume check)")
    return p.parse_args()


def say(text: str) -> None:
    """One write per line: ranks sharing a pipe must not interleave halves of lines."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def request_save(signum: int, frame: object) -> None:
    global save_requested
    save_requested = True


def latest_checkpoint() -> str | None:
    found = sorted(glob.glob(os.path.join(CKPT_DIR, "step_*.pt")))
    return found[-1] if found else None


def save_checkpoint(model: DDP, opt: torch.optim.Optimizer, step: int) -> None:
    os.makedirs(CKPT_DIR, exist_ok=True)
    path = os.path.join(CKPT_DIR, f"step_{step:06d}.pt")
    began = time.time()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
               path + ".tmp")
    os.replace(path + ".tmp", path)  # a reader never sees half a file
    say(f"checkpoint saved: step {step} -> {path} ({time.time() - began:.3f} s)")


def init_distributed() -> tuple[int, int, int, torch.device]:
    """Joins the process group; returns (rank, world size, local rank, device)."""
    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    say(f"rank {rank}/{world} on {socket.gethostname()}: local_rank={local_rank} "
        f"backend={dist.get_backend()} device={device}")
    return rank, world, local_rank, device


def resume(model: DDP, opt: torch.optim.Optimizer, device: torch.device, rank: int,
           ignore_checkpoint: bool) -> int:
    """Loads the newest checkpoint, if any; returns the step to start at."""
    latest = None if ignore_checkpoint else latest_checkpoint()
    if not latest:
        return 0
    # every rank loads it (mgpu-cloud put the folder on every node)
    state = torch.load(latest, map_location=device)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    if rank == 0:
        say(f"resumed from step {state['step']} ({latest}), restart {RESTART}")
    return int(state["step"]) + 1


def save_due(args: argparse.Namespace, step: int, device: torch.device) -> bool:
    """Save when it is time, or when any rank got the signal (all ranks agree: one tiny
    all-reduce, because a signal may reach only some ranks)."""
    global save_requested
    due = args.save_every > 0 and (step + 1) % args.save_every == 0
    flag = torch.tensor([1.0 if due or save_requested else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        save_requested = False
        return True
    return False


def train(args: argparse.Namespace, model: DDP, opt: torch.optim.Optimizer,
          true_w: torch.Tensor, device: torch.device, rank: int, start: int,
          t0: float) -> tuple[torch.Tensor, float]:
    """Runs steps start..args.steps-1 on data made from true_w; returns the last loss and
    the time the first step ended (t0 if none ran)."""
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data
    loss = torch.tensor(0.0)
    t_warm = t0  # after the first step: connection set-up and first-step costs are not throughput
    for step in range(start, args.steps):
        while step == args.hold_once_at_step and RESTART == args.hold_in_restart:
            time.sleep(0.1)  # until the test's kill makes the tool stop this attempt
        x = torch.randn(args.batch_size, 16, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(args.batch_size, 1, generator=gen)
        x, y = x.to(device), y.to(device)
        began = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        forward_s = time.perf_counter() - began  # no collective in it: this rank's own speed
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.compute_every and step % args.compute_every == 0:
            say(f"step {step} compute={forward_s:.4f}")
        if rank == 0 and (step == args.fail_at_step
                          or (step == args.fail_once_at_step and RESTART == 0)):
            raise RuntimeError(f"failing on purpose at step {step}")
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            say(f"step {step} loss {loss.item():.4f}")
        if save_due(args, step, device) and rank == 0:
            save_checkpoint(model, opt, step)
        if step == start:
            t_warm = time.time()
    return loss, t_warm


def report(args: argparse.Namespace, model: DDP, world: int, final: torch.Tensor, start: int,
           times: tuple[float, float, float]) -> None:
    """Rank 0's ending: the model and metrics.json to $MGPU_OUTPUT_DIR, the closing lines.
    times: (t0 the start, t_warm the end of the first step, t_end the end of the last)."""
    t0, t_warm, t_end = times
    out_dir = os.environ.get("MGPU_OUTPUT_DIR", "outputs")
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"model": model.module.state_dict(), "steps": args.steps},
               os.path.join(out_dir, "checkpoint.pt"))
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump({"world_size": world, "final_loss": final.item(), "steps": args.steps,
                   "resumed_from": start, "restart": RESTART,
                   "seconds": round(time.time() - t0, 2)}, fh)
    say(f"done: world_size={world} final_loss={final.item():.4f} "
        f"checkpoint={out_dir}/checkpoint.pt")
    ran = args.steps - start  # steps this attempt ran (after a resume: fewer)
    timed_steps = ran - 1 if ran > 1 else 1
    elapsed = max(t_end - (t_warm if ran > 1 else t0), 1e-9)
    say(f"throughput: samples/s={timed_steps * args.batch_size * world / elapsed:.1f} "
        f"(global batch {args.batch_size * world}, {timed_steps} timed steps)")


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGUSR1, request_save)  # mgpu-cloud's preemption signal
    waited = time.monotonic()
    while args.start_after and not os.path.exists(args.start_after):
        if time.monotonic() - waited > 600:
            raise SystemExit(f"--start-after: {args.start_after} never appeared")
        time.sleep(0.1)
    rank, world, local_rank, device = init_distributed()

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts them)
    true_w = torch.randn(16, 1)
    model = DDP(
        nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device),
        device_ids=[local_rank] if device.type == "cuda" else None,
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = resume(model, opt, device, rank, args.ignore_checkpoint)

    t0 = time.time()
    loss, t_warm = train(args, model, opt, true_w, device, rank, start, t0)
    t_end = time.time()
    # Mean final loss over all ranks: proves the all-reduce worked across nodes.
    final = loss.detach().clone()
    dist.all_reduce(final)
    final /= world
    if rank == 0:
        report(args, model, world, final, start, (t0, t_warm, t_end))
    dist.barrier()
    # DDP's reducer holds the process group: free it (and its gloo threads) now, while the
    # interpreter is alive, not during its shutdown (a SIGABRT "terminate called without an
    # active exception" at exit, pytorch/pytorch#179291).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
