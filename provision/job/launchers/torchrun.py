"""torchrun on every node: static ranks (--node_rank, --master_addr node-0), or c10d
rendezvous (--rdzv) where ranks are assigned as nodes join."""

from __future__ import annotations

from provision.job.launchers import BaseLauncher, LaunchContext
from provision.model.inventory import NodeRecord


class Torchrun(BaseLauncher):
    name = "torchrun"

    def argv(self, ctx: LaunchContext, node: NodeRecord, program: list[str] | None) -> list[str]:
        job, port = ctx.job, str(ctx.job.master_port)
        argv = ["torchrun", "--nnodes", str(ctx.nnodes), "--nproc_per_node", ctx.nproc(node)]
        if job.rdzv:
            argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint",
                     f"{ctx.master_address}:{port}", "--rdzv_id", f"{ctx.inv.name}-job"]
        else:
            argv += ["--node_rank", str(node.rank), "--master_addr", ctx.master_address,
                     "--master_port", port]
        return argv + ctx.script(program)

    def prepare(self, ctx: LaunchContext, env: dict[str, str]) -> tuple[str, list[str]]:
        """OMP_NUM_THREADS=1 where torchrun would set it (more than one process per node, the
        job sets none): the same value, without torchrun's 5-line banner on every node. A
        cluster where some node runs one process is left to torchrun (it sets nothing there)."""
        if "OMP_NUM_THREADS" not in env and all(_processes(ctx, n) > 1 for n in ctx.inv.nodes):
            env["OMP_NUM_THREADS"] = "1"
        return "", []


def _processes(ctx: LaunchContext, node: NodeRecord) -> int:
    """Processes torchrun starts on `node`: the number given, or for 'gpu'/'auto' its slots."""
    value = ctx.nproc(node)
    return int(value) if value.isdigit() else node.slots
