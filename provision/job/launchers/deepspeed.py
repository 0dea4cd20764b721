"""The DeepSpeed runner.

    pdsh (default)  `deepspeed --hostfile ... --launcher pdsh` on node 0, which starts every
                    node's ranks over node-to-node SSH (set up by bootstrap)
    no_ssh          `deepspeed --no_ssh --node_rank R` on every node

Variables reach every rank through $DS_ENV_FILE (a file in the tool's folder: the user's own
~/.deepspeed_env is never written). The config is the user's --deepspeed-config or the shipped
templates/deepspeed/ds_config.json.j2, placed beside the hostfile.
"""

from __future__ import annotations

from pathlib import Path

from provision.job.launchers import BaseLauncher, LaunchContext
from provision.model.inventory import NodeRecord
from provision.model.spec import JobSpec
from provision.nodes import HomePath, RemoteLayout
from provision.nodes.layout import Files

CONFIG = "ds_config.json"
ENV_FILE = "deepspeed_env"


def config_bytes(job: JobSpec, gpus: bool) -> bytes:
    """The user's --deepspeed-config file, or the shipped template (ZeRO-1, AdamW)."""
    from provision.model.render import render

    if job.deepspeed_config:
        return Path(job.deepspeed_config).read_bytes()
    return render("deepspeed/ds_config.json.j2", micro_batch=16, grad_accum=1, lr=1e-3,
                  zero_stage=1, bf16=gpus).encode()


class DeepSpeed(BaseLauncher):
    name = "deepspeed"

    def argv(self, ctx: LaunchContext, node: NodeRecord, program: list[str] | None) -> list[str]:
        job = ctx.job
        script = ctx.script(program)
        # the config placed with the workdir, unless the script's own arguments name one
        if program is None and "--deepspeed_config" not in job.args:
            script = [*script, "--deepspeed_config", ctx.layout.path(CONFIG)]
        argv = ["deepspeed", "--hostfile", ctx.layout.hostfile, "--master_addr",
                ctx.master_address, "--master_port", str(job.master_port)]
        if job.deepspeed_launcher == "no_ssh":
            argv += ["--no_ssh", "--node_rank", str(node.rank), "--num_nodes", str(ctx.nnodes),
                     "--num_gpus", ctx.nproc(node)]
        else:
            argv += ["--launcher", "pdsh"]
        return argv + script

    def starting_nodes(self, ctx: LaunchContext) -> list[NodeRecord]:
        if ctx.job.deepspeed_launcher == "pdsh":
            return [ctx.inv.master]
        return super().starting_nodes(ctx)

    def files(self, job: JobSpec, layout: RemoteLayout, gpus: bool) -> Files:
        return {layout.path(CONFIG): (config_bytes(job, gpus), 0o644)}

    def prepare(self, ctx: LaunchContext, env: dict[str, str]) -> tuple[str, list[str]]:
        """The runner exports the variables of $DS_ENV_FILE on every node it starts: write
        them there first (one quoted KEY=VALUE per line). In a container, the runner's pdsh
        needs the node's SSH set-up."""
        from provision.nodes.shell import assign, word

        env["DS_ENV_FILE"] = ctx.layout.path(ENV_FILE)
        lines = " ".join(assign(k, v) for k, v in env.items())
        on_host = RemoteLayout(HomePath(ctx.inv.remote_root)).path(ENV_FILE)
        prefix = f"printf '%s\\n' {lines} > {word(on_host)} && "
        extra = ["-v", HomePath(".ssh:/root/.ssh:ro")] if ctx.in_container else []
        return prefix, extra
