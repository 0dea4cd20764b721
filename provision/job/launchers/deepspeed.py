"""The DeepSpeed runner.

    pdsh (default)  `deepspeed --hostfile ... --launcher pdsh` on node 0, which starts every
                    node's ranks over node-to-node SSH (set up by bootstrap)
    no_ssh          `deepspeed --no_ssh --node_rank R` on every node

In pdsh mode variables reach every rank through $DS_ENV_FILE (a 0600 file in the tool's folder:
the user's own ~/.deepspeed_env is never written), each line quoted for the way the runner
reads it back (env_file_line). The config is the user's --deepspeed-config or the shipped
templates/deepspeed/ds_config.json.j2, placed beside the hostfile.
"""

from __future__ import annotations

from pathlib import Path

from provision.job.launchers import LaunchContext, Launcher
from provision.model.inventory import NodeRecord
from provision.model.spec import JobSpec
from provision.nodes import HomePath, RemoteLayout
from provision.nodes.layout import Files
from provision.nodes.shell import word

CONFIG = "ds_config.json"
ENV_FILE = "deepspeed_env"


def config_bytes(job: JobSpec, gpus: bool) -> bytes:
    """The user's --deepspeed-config file, or the shipped template (ZeRO-1, AdamW).

    Without GPUs the template asks for torch's AdamW (`torch_adam`) instead of DeepSpeed's
    FusedAdam: on the CPU accelerator every rank JIT-loads FusedAdam's op at its start, even
    when it is built already (deepspeed 0.19 op_builder jit_load: the compiler flags come from
    py-cpuinfo, twice a new Python process, then ninja), 6.0 -> 2.7 CPU-s for a rank's start
    and 6 steps in a node container; the same steps, the same losses. With GPUs: FusedAdam's
    CUDA kernel."""
    from provision.model.render import render

    if job.deepspeed_config:
        return Path(job.deepspeed_config).read_bytes()
    return render("deepspeed/ds_config.json.j2", micro_batch=16, grad_accum=1, lr=1e-3,
                  zero_stage=1, bf16=gpus, torch_adam=not gpus).encode()


def env_file_line(key: str, value: str) -> str:
    """The line of $DS_ENV_FILE from which DeepSpeed's pdsh runner gives every rank exactly
    `value` (any text without a line break: JobSpec refuses those).

    What the runner does with a line (deepspeed 0.19 launcher/runner.py main and
    multinode_runner.py): `KEY=VAL` split at the first "=", VAL stripped, wrapped in double
    quotes when it has a character outside [\\w@%+=:,./-] (add_export, no escaping inside),
    then `export KEY=VAL; ` is put in the command pdsh runs through each node's shell, after pdsh
    has replaced %n, %h, %u and %% in it (even inside quotes). So VAL is written as `"'...'"`:
    always wrapped (it holds a quote), nothing stripped (it starts and ends with one), the
    shell reads `""'...'""` as the single-quoted value, and every % is doubled for pdsh. A
    HomePath is `""$HOME"/'...'"`: $HOME expands in the shell pdsh starts on each node."""
    return f'{key}="' + word(value).replace("%", "%%") + '"'


class DeepSpeed(Launcher):
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
        """pdsh mode: the runner exports the variables of $DS_ENV_FILE on every node it starts,
        so they are written there first (0600: the job's --env values are in it; removed and
        made anew, so an older file's mode does not stay). In a container, the runner's pdsh
        needs the node's SSH set-up. no_ssh: every node's runner has them already."""
        if ctx.job.deepspeed_launcher != "pdsh":
            return "", []
        env["DS_ENV_FILE"] = ctx.layout.path(ENV_FILE)
        lines = " ".join(word(env_file_line(k, v)) for k, v in env.items())
        on_host = word(RemoteLayout(HomePath(ctx.inv.remote_root)).path(ENV_FILE))
        prefix = f"(umask 077 && rm -f {on_host} && printf '%s\\n' {lines} > {on_host}) && "
        extra = ["-v", HomePath(".ssh:/root/.ssh:ro")] if ctx.in_container else []
        return prefix, extra
