"""A small, real training with Hugging Face accelerate (CPU/gloo or GPUs).

    mgpu-cloud run --provider docker --nodes 2 --launcher accelerate examples/train_accelerate.py
Every rank prints `rank R/W` as accelerate sees it (on CPU-only nodes accelerate needs
ACCELERATE_USE_CPU=1 or each process silently runs alone: the docker preset sets it).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
from accelerate import Accelerator
from torch import nn


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    acc = Accelerator()
    say(f"rank {acc.process_index}/{acc.num_processes} on {socket.gethostname()}: "
        f"launcher=accelerate device={acc.device}")
    torch.manual_seed(0)
    true_w = torch.randn(16, 1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    gen = torch.Generator().manual_seed(1000 + acc.process_index)
    for step in range(args.steps):
        x = torch.randn(16, 16, generator=gen).to(acc.device)
        y = (x.cpu() @ true_w).to(acc.device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        if acc.is_main_process and (step % 10 == 0 or step == args.steps - 1):
            say(f"step {step} loss {loss.item():.4f}")
    acc.wait_for_everyone()
    if acc.is_main_process:
        out_dir = os.environ.get("MGPU_OUTPUT_DIR", "outputs")
        os.makedirs(out_dir, exist_ok=True)
        torch.save(acc.unwrap_model(model).state_dict(), os.path.join(out_dir, "model.pt"))
        say(f"done: world_size={acc.num_processes} launcher=accelerate")


if __name__ == "__main__":
    main()
