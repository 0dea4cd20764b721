"""torchrun on every node: static ranks (--node_rank, --master_addr node-0), or c10d
rendezvous (--rdzv) where ranks are assigned as nodes join.

The agent forks its workers (`--run_path --start_method fork`) instead of starting a new
interpreter for each, wherever a node's process count is a number: every rank starts the
script through ctx.entry (`remote.pyz script --`, or with the fabric gate in the job's launch
`remote.pyz injob ... --`), and the agent has imported torch already, so neither the gate's
`import torch` nor the script's costs anything. A rank started as a new interpreter costs
~1.9 s of CPU on a docker node here, ~0.75 of it `import torch` and ~0.45 the interpreter's
shutdown; the agent imports torch and torch._dynamo (which DDP and the first optimizer import)
with the collector off and freezes them (the node's sitecustomize), so the ranks neither import
them nor walk them in their collections (a torchrun of 2 ranks, DDP, 5 steps: 4.2 CPU-s for the
node spawned, 2.8 forked, 1.4 forked from such an agent). remote/script.py
makes the forked worker start the script as a new interpreter would and end like one (signal
and exit handlers, traceback, exit code, its files flushed). A forked child can
use CUDA only if the agent never initialised it: the agent checks CUDA through NVML
(PYTORCH_NVML_BASED_CUDA_CHECK=1, unless the job sets it), and there is no fork where a node's
process count is "gpu": the agent would ask CUDA for the count."""

from __future__ import annotations

from provision.job.launchers import LaunchContext, Launcher
from provision.model.inventory import NodeRecord
from provision.model.spec import JobSpec


class Torchrun(Launcher):
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
        if program is None and _forks(ctx, node):
            argv += ["--run_path", "--start_method", "fork"]
        return argv + ctx.script(program)

    def forks(self, job: JobSpec) -> bool:
        """Not with --nproc-per-node gpu: the agent would ask CUDA for the count before it
        forks, and a child forked after that cannot use CUDA."""
        return job.nproc_per_node != "gpu"

    def resident(self, job: JobSpec) -> bool:
        """Static ranks only: with --rdzv the agents' rendezvous would wait for the lost
        agent at the end (its exit barrier) and a newcomer cannot take its place."""
        return not job.rdzv

    def rejoin_argv(self, ctx: LaunchContext, node: NodeRecord, alone: bool) -> list[str]:
        """A lost node's newcomer among resident ranks (remote/resident.py forms their group
        through its own store). Node 0's first agent still runs: the static rendezvous joins
        its store (the ranks it assigned are still there), and at the end that agent's exit
        barrier counts the newcomer in place of the lost agent (else it would wait 300 s
        for it). Without it (node 0 lost) the agent runs alone (--standalone). Its workers
        are forked from the agent (ctx.entry: `remote.pyz script --`), which has
        imported torch: one import on the newcomer instead of one per rank."""
        if alone:
            forks = ["--run_path", "--start_method", "fork"] if _forks(ctx, node) else []
            return ["torchrun", "--standalone", "--nnodes", "1", "--nproc_per_node",
                    ctx.nproc(node), *forks, *ctx.script(None)]
        return self.argv(ctx, node, None)

    def prepare(self, ctx: LaunchContext, env: dict[str, str]) -> tuple[str, list[str]]:
        """OMP_NUM_THREADS=1 where torchrun would set it (more than one process per node, the
        job sets none): the same value, without torchrun's 5-line banner on every node. A
        cluster where some node runs one process is left to torchrun (it sets nothing there)."""
        if "OMP_NUM_THREADS" not in env and all(_processes(ctx, n) > 1 for n in ctx.inv.nodes):
            env["OMP_NUM_THREADS"] = "1"
        if any(_forks(ctx, n) for n in ctx.inv.nodes):
            # the agent asks torch.cuda.is_available() before it forks (LaunchConfig); by
            # default that initialises the CUDA driver, and a child forked after it cannot
            # use CUDA. With this, torch asks NVML instead (torch.cuda.is_available's doc).
            env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        return "", []


def _forks(ctx: LaunchContext, node: NodeRecord) -> bool:
    """The agent forks the job's workers: when they start through an entry (the script's or
    the gate's), on a node whose process count is a number."""
    return bool(ctx.entry) and ctx.nproc(node).isdigit()


def _processes(ctx: LaunchContext, node: NodeRecord) -> int:
    """Processes torchrun starts on `node`: the number given, or for 'gpu'/'auto' its slots."""
    value = ctx.nproc(node)
    return int(value) if value.isdigit() else node.slots
