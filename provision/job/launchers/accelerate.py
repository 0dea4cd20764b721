"""`accelerate launch` on every node, with the machine rank and the total process count."""

from __future__ import annotations

from provision.job.launchers import LaunchContext, Launcher
from provision.model.inventory import NodeRecord


class Accelerate(Launcher):
    name = "accelerate"

    def argv(self, ctx: LaunchContext, node: NodeRecord, program: list[str] | None) -> list[str]:
        total = sum(int(ctx.nproc(n)) for n in ctx.inv.nodes)
        return ["accelerate", "launch", "--multi_gpu", "--num_machines", str(ctx.nnodes),
                "--machine_rank", str(node.rank), "--main_process_ip", ctx.master_address,
                "--main_process_port", str(ctx.job.master_port), "--num_processes", str(total),
                *ctx.script(program)]
