"""A small, real DeepSpeed training on data it generates (CPU accelerator + gloo, or GPUs).

    mgpu-cloud run --provider docker --nodes 2 --launcher deepspeed examples/train_deepspeed.py
Uses --deepspeed_config if given (the launcher passes the one from `--deepspeed-config` or the
template the tool ships), else a minimal ZeRO-1 config. Every rank prints `rank R/W`; rank 0
saves a checkpoint under $MGPU_OUTPUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import deepspeed
import torch
from torch import nn

DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1000,
}


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--deepspeed_config", default=None)
    args = p.parse_args()
    config = DEFAULT_CONFIG
    if args.deepspeed_config:
        with open(args.deepspeed_config) as fh:
            config = json.load(fh)

    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    say(f"rank {rank}/{world} on {socket.gethostname()}: launcher=deepspeed "
        f"backend={torch.distributed.get_backend()}")
    torch.manual_seed(0)
    true_w = torch.randn(16, 1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    gen = torch.Generator().manual_seed(1000 + rank)
    batch = engine.train_micro_batch_size_per_gpu()
    for step in range(args.steps):
        x = torch.randn(batch, 16, generator=gen).to(engine.device)
        y = (x.cpu() @ true_w).to(engine.device)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            say(f"step {step} loss {loss.item():.4f}")
    out_dir = os.environ.get("MGPU_OUTPUT_DIR", "outputs")
    engine.save_checkpoint(out_dir, tag="final")  # collective: every rank takes part
    if rank == 0:
        say(f"done: world_size={world} launcher=deepspeed checkpoint={out_dir}/final")


if __name__ == "__main__":
    main()
