"""A small, real DDP training: regression on data it generates, on CPU (gloo) or GPU (nccl).

Runs unchanged on one machine, on emulated docker nodes, or on a GPU cluster:
    torchrun --nproc_per_node 2 examples/train_ddp.py --steps 50
    mgpu-cloud run --provider docker --nodes 2 examples/train_ddp.py --steps 50

Rank 0 prints the loss and saves the checkpoint to $MGPU_OUTPUT_DIR (default ./outputs).
Every rank prints one line `rank R/W on HOST: ...` so a test (or you) can account for all ranks.
Rank 0 ends with `samples/s=X`: global samples per second after the first (warm-up) step,
the metric `mgpu-cloud scale` compares across cluster sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fail-at-step", type=int, default=-1, help="raise on rank 0 (testing)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (testing)")
    return p.parse_args()


def say(text: str) -> None:
    """One write per line: ranks sharing a pipe must not interleave halves of lines."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    say(f"rank {rank}/{world} on {socket.gethostname()}: local_rank={local_rank} "
        f"backend={dist.get_backend()} device={device}")

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts them)
    true_w = torch.randn(16, 1)
    model = DDP(
        nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device),
        device_ids=[local_rank] if use_cuda else None,
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data

    loss = torch.tensor(0.0)
    t0 = time.time()
    t_warm = t0  # after step 0: connection set-up and first-step costs are not throughput
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(args.batch_size, 1, generator=gen)
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step == args.fail_at_step:
            raise RuntimeError(f"failing on purpose at step {step}")
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            say(f"step {step} loss {loss.item():.4f}")
        if step == 0:
            t_warm = time.time()

    t_end = time.time()
    # Mean final loss over all ranks: proves the all-reduce worked across nodes.
    final = loss.detach().clone()
    dist.all_reduce(final)
    final /= world
    if rank == 0:
        out_dir = os.environ.get("MGPU_OUTPUT_DIR", "outputs")
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "steps": args.steps},
                   os.path.join(out_dir, "checkpoint.pt"))
        with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
            json.dump({"world_size": world, "final_loss": final.item(), "steps": args.steps,
                       "seconds": round(time.time() - t0, 2)}, fh)
        say(f"done: world_size={world} final_loss={final.item():.4f} "
            f"checkpoint={out_dir}/checkpoint.pt")
        timed_steps = args.steps - 1 if args.steps > 1 else 1
        elapsed = max(t_end - (t_warm if args.steps > 1 else t0), 1e-9)
        say(f"throughput: samples/s={timed_steps * args.batch_size * world / elapsed:.1f} "
            f"(global batch {args.batch_size * world}, {timed_steps} timed steps)")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
