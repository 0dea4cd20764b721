"""examples/train_ddp.py's training, written so that a lost node costs the other nodes
nothing but a re-formed process group (issue 44: resident restarts).

    mgpu-cloud run --nodes 4 --max-restarts 3 examples/train_resident.py --steps 500 --save-every 20

What makes it resident: everything that does not depend on the group (torch imported, the
model, the optimiser, the data) is made ONCE per process, and the part that does (the DDP
wrapper, the collectives, the checkpoint it resumes from) is the function handed to
`remote.resident.run`. When a node is lost, the ranks of the other nodes stop in it (their
all-reduce fails), wait while mgpu-cloud replaces the node and puts the last checkpoint back
on every node, then enter it again with the newcomer's ranks: same PID, same objects, the
newest checkpoint loaded. A script without `run` gets the full relaunch, as before.

Every entry prints `rank R/W on HOST: pid=PID generation=G`; rank 0 prints `resumed from
step S` after loading a checkpoint and ends with `done: world_size=W ...`.
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from remote.resident import run  # mgpu-cloud's node package, on every job's path
except ImportError:  # plain torchrun, without mgpu-cloud: the function runs once
    def run(fn: Any) -> Any:  # type: ignore[misc]
        dist.init_process_group()
        return fn(SimpleNamespace(rank=dist.get_rank(), size=dist.get_world_size(),
                                  generation=0))

CKPT_DIR = os.environ.get("MGPU_CHECKPOINT_DIR", "checkpoints")


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (testing)")
    p.add_argument("--hold-once-at-step", type=int, default=-1,
                   help="every rank waits at this step in barriers (a lost peer fails them) "
                        "until a node is lost, generation 0 only (testing: the loss comes "
                        "before the job can end)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    # made once per process, kept across re-formations
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    true_w = torch.randn(16, 1)

    def train(world: Any) -> float:
        say(f"rank {world.rank}/{world.size} on {socket.gethostname()}: pid={os.getpid()} "
            f"generation={world.generation}")
        start = 0
        found = sorted(glob.glob(os.path.join(CKPT_DIR, "step_*.pt")))
        if found:  # every rank loads the newest (mgpu-cloud put it on every node)
            state = torch.load(found[-1])
            net.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"] + 1
            if world.rank == 0:
                say(f"resumed from step {state['step']} ({found[-1]}), "
                    f"generation {world.generation}")
        model = DDP(net)  # the group is new each generation: so is the wrapper
        gen = torch.Generator().manual_seed(1000 + world.rank + 7919 * start)
        loss = torch.tensor(0.0)
        for step in range(start, args.steps):
            while step == args.hold_once_at_step and world.generation == 0:
                dist.barrier()  # raises once a peer is lost: the resident restart
                time.sleep(0.1)
            x = torch.randn(args.batch_size, 16, generator=gen)
            loss = nn.functional.mse_loss(model(x), x @ true_w)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.sleep:
                time.sleep(args.sleep)
            if world.rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                say(f"step {step} loss {loss.item():.4f}")
            if args.save_every and (step + 1) % args.save_every == 0:
                dist.barrier()  # every rank past the step before rank 0 writes it
                if world.rank == 0:
                    os.makedirs(CKPT_DIR, exist_ok=True)
                    path = os.path.join(CKPT_DIR, f"step_{step:06d}.pt")
                    began = time.time()
                    torch.save({"model": net.state_dict(), "opt": opt.state_dict(),
                                "step": step}, path + ".tmp")
                    os.replace(path + ".tmp", path)
                    say(f"checkpoint saved: step {step} -> {path} "
                        f"({time.time() - began:.3f} s)")
        final = loss.detach().clone()
        dist.all_reduce(final)
        if world.rank == 0:
            say(f"done: world_size={world.size} final_loss={final.item() / world.size:.4f}")
        dist.barrier()
        return float(final.item())

    run(train)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
