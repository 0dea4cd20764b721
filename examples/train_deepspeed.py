"""A small, real DeepSpeed training on data it generates (CPU accelerator + gloo, or GPUs).

    mgpu-cloud run --provider docker --nodes 2 --launcher deepspeed examples/train_deepspeed.py
Uses --deepspeed_config if given (the launcher passes the one from `--deepspeed-config` or the
template the tool ships), else a minimal ZeRO-1 config. Every rank prints `rank R/W`; rank 0
saves a checkpoint under $MGPU_OUTPUT_DIR.

Recovery: every --save-every steps (and on SIGUSR1, a preemption notice) all ranks save a
SHARDED checkpoint to $MGPU_CHECKPOINT_DIR (ZeRO: each rank writes its own optimizer shard, on
its own node); mgpu-cloud collects the shards of every node and, before a restart, puts the
whole folder on every node, where `load_checkpoint` finds the newest tag.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
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


CKPT_DIR = os.environ.get("MGPU_CHECKPOINT_DIR", "checkpoints")
RESTART = int(os.environ.get("MGPU_RESTART_COUNT", "0"))
save_requested = False


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def request_save(signum: int, frame: object) -> None:
    global save_requested
    save_requested = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--deepspeed_config", default=None)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: off)")
    p.add_argument("--fail-once-at-step", type=int, default=-1,
                   help="raise on rank 0, first attempt only (testing recovery)")
    args = p.parse_args()
    signal.signal(signal.SIGUSR1, request_save)  # mgpu-cloud's preemption signal
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
    start = 0
    if os.path.isfile(os.path.join(CKPT_DIR, "latest")):  # every rank loads its own shard
        path, client = engine.load_checkpoint(CKPT_DIR)
        if path is not None:
            start = int(client["step"]) + 1
            if rank == 0:
                say(f"resumed from step {client['step']} (tag {os.path.basename(os.path.dirname(path))}), "
                    f"restart {RESTART}")
    global save_requested
    for step in range(start, args.steps):
        x = torch.randn(batch, 16, generator=gen).to(engine.device)
        y = (x.cpu() @ true_w).to(engine.device)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if rank == 0 and step == args.fail_once_at_step and RESTART == 0:
            raise RuntimeError(f"failing on purpose at step {step}")
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            say(f"step {step} loss {loss.item():.4f}")
        # saving is collective: all ranks agree first (a signal may reach only some of them)
        due = args.save_every > 0 and (step + 1) % args.save_every == 0
        flag = torch.tensor([1.0 if due or save_requested else 0.0]).to(engine.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() > 0:
            save_requested = False
            engine.save_checkpoint(CKPT_DIR, tag=f"step{step}", client_state={"step": step})
            if rank == 0:
                say(f"checkpoint saved: step {step} -> {CKPT_DIR}/step{step}")
    out_dir = os.environ.get("MGPU_OUTPUT_DIR", "outputs")
    engine.save_checkpoint(out_dir, tag="final")  # collective: every rank takes part
    if rank == 0:
        say(f"done: world_size={world} launcher=deepspeed checkpoint={out_dir}/final")
    torch.distributed.barrier()
    del engine, model  # they hold the process group: free it while the interpreter is alive
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
