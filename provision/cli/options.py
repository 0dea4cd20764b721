"""Option tables of `up`, `run`, `launch` and `gc`, and their mapping onto the spec models.

Core options are listed here; provider options come from each provider's INFO.flags (the
registry), so a new provider's flags appear without editing this file. A flag declared by
several providers (e.g. --zone) is one option whose value goes to the chosen provider.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer

from provision.cli.app import Opt
from provision.model.registry import DEFAULT_PROVIDER, Flag, all_provider_infos, provider_names

DEFAULT_NODES = 1  # ClusterSpec.nodes' default (tests/test_cli_surface.py keeps them equal)
# The groups of `run --help` / `launch --help` (Typer's rich_help_panel, printed as plain
# sections by provision.cli.command); the command's own options come first, under "Options".
CLUSTER, PROVIDER, PLAN, JOB, RECOVERY, FABRIC = (
    "Cluster", "Provider (each flag names its providers)", "Plan", "Job", "Recovery",
    "Fabric gate")
SCRIPT_HELP = ("training script; the tool's options go before it, every word after it is the "
               "script's own")

_CORE_CLUSTER_OPTIONS = [
    Opt("config", str | None, typer.Option(None, "--config", "-c", help="cluster YAML file; flags override it")),
    Opt("provider", str | None, typer.Option(None, "--provider", "-p", help=f"{DEFAULT_PROVIDER} (default) | " + " | ".join(n for n in provider_names() if n != DEFAULT_PROVIDER)), ("provider",)),
    Opt("nodes", int | None, typer.Option(None, "--nodes", "-n", help=f"number of nodes (default: {DEFAULT_NODES})"), ("nodes",)),
    Opt("spares", int | None, typer.Option(None, "--spares", help="warm spare nodes made, bootstrapped and kept idle with the cluster: a lost node's rank moves to one at once, and a new one is ordered (0)"), ("spares",)),
    Opt("name", str | None, typer.Option(None, "--name", help="cluster name (default: generated)"), ("name",)),
    Opt("gpus_per_node", int | None, typer.Option(None, "--gpus-per-node", help="slots per node (default: what the machine has)"), ("gpus_per_node",)),
    Opt("ssh_cidr", str | None, typer.Option(None, "--ssh-cidr", help="who may reach SSH (default: your own address)"), ("ssh_cidr",)),
    Opt("max_hours", float | None, typer.Option(None, "--max-hours", help="nodes shut themselves down after this long"), ("max_hours",)),
    Opt("spot", bool | None, typer.Option(None, "--spot/--on-demand", help="spot/preemptible capacity"), ("spot",)),
    Opt("store", str | None, typer.Option(None, "--store", help="s3://B/P | gs://B/P | file:///PATH: checkpoints, job records and logs go there; --detach jobs are supervised by the cluster's controller"), ("store",)),
]
_PLAN_OPTIONS = [
    Opt("dry_run", bool, typer.Option(False, "--dry-run", help="print the plan and cost, create nothing")),
    Opt("plan_json", bool, typer.Option(False, "--plan-json", help="with --dry-run: print the plan as JSON")),
    Opt("yes", bool, typer.Option(False, "--yes", "-y", help="do not ask for confirmation")),
]
JOB_OPTIONS = [
    Opt("launcher", str | None, typer.Option(None, "--launcher", help="torchrun (default) | deepspeed | accelerate"), ("launcher",)),
    Opt("nproc_per_node", str | None, typer.Option(None, "--nproc-per-node", help="processes per node, or 'gpu'"), ("nproc_per_node",)),
    Opt("env", list[str] | None, typer.Option(None, "--env", "-e", help="K=V for the job (repeatable)")),
    Opt("env_file", str | None, typer.Option(None, "--env-file", help="file of K=V lines")),
    Opt("workdir", str | None, typer.Option(None, "--workdir", help="folder to sync (default: the script's)"), ("workdir",)),
    Opt("master_port", int | None, typer.Option(None, "--master-port", help="rendezvous port (29500)"), ("master_port",)),
    Opt("rdzv", bool | None, typer.Option(None, "--rdzv", help="torchrun c10d rendezvous instead of static ranks"), ("rdzv",)),
    Opt("job_image", str | None, typer.Option(None, "--image", help="run the job inside this container image"), ("image",)),
    Opt("nccl_debug", bool | None, typer.Option(None, "--nccl-debug", help="NCCL_DEBUG=INFO"), ("nccl_debug",)),
    Opt("deepspeed_launcher", str | None, typer.Option(None, "--deepspeed-launcher", help="pdsh (default) | no_ssh"), ("deepspeed_launcher",)),
    Opt("deepspeed_config", str | None, typer.Option(None, "--deepspeed-config", help="ds_config JSON"), ("deepspeed_config",)),
    Opt("max_restarts", int | None, typer.Option(None, "--max-restarts", help="restart after a lost node, a crash, a hang or a preemption, from the last checkpoint (0)"), ("max_restarts",)),
    Opt("stall_timeout", float | None, typer.Option(None, "--stall-timeout", help="seconds without output or checkpoint = a hang (off)"), ("stall_timeout",)),
    Opt("start_timeout", float | None, typer.Option(None, "--start-timeout", help="seconds from a launch to its first output or checkpoint (imports, rendezvous, data loading) = a hang (with --stall-timeout: the larger of it and 300; else off)"), ("start_timeout",)),
    Opt("on_node_loss", str | None, typer.Option(None, "--on-node-loss", help="replace (default) | restart | fail"), ("on_node_loss",)),
    Opt("preempt_signal", str | None, typer.Option(None, "--preempt-signal", help="sent to every rank on a preemption notice (SIGUSR1)"), ("preempt_signal",)),
    Opt("replace_slow", bool | None, typer.Option(None, "--replace-slow", help="a node whose ranks compute slower than the others' (the job's `compute=` markers) is replaced: save, replace, resume"), ("replace_slow",)),
    Opt("slow_fraction", float | None, typer.Option(None, "--slow-fraction", help="slow = compute time above (1 + this) x the other nodes' (0.5)"), ("slow_fraction",)),
    Opt("min_nodes", int | None, typer.Option(None, "--min-nodes", help="a lost node that cannot be replaced: go on with the others from the checkpoint while at least this many remain, grow back when a replacement can be had"), ("min_nodes",)),
    Opt("replace_timeout", float | None, typer.Option(None, "--replace-timeout", help="with --min-nodes: seconds a replacement may take before the run goes on without it"), ("replace_timeout",)),
    Opt("fabric_check", str | None, typer.Option(None, "--fabric-check", help="auto (default: on for multi-node clusters whose provider knows the fabric, i.e. aws/gcp) | on | off"), ("fabric_check",)),
    Opt("notify", str | None, typer.Option(None, "--notify", help="webhook URL: one JSON POST (Slack-compatible) per state change of a managed job"), ("notify",)),
    Opt("allow_broad_node_credentials", bool | None, typer.Option(None, "--allow-broad-node-credentials", help="a managed run even when its nodes would get this shell's own AWS keys (temporary keys without MGPU_STORE_ROLE_ARN, an S3-compatible store without STS)"), ("allow_broad_node_credentials",)),
    Opt("allow_slow_network", bool | None, typer.Option(None, "--allow-slow-network", help="run even when the fabric gate fails (with a warning)"), ("allow_slow_network",)),
]


def provider_flag_options(select: Callable[[Flag], bool] = lambda f: True) -> list[Opt]:
    """One Opt per distinct flag declaration across the registered providers."""
    merged: dict[str, tuple[Flag, dict[str, str]]] = {}
    for info in all_provider_infos():
        for flag in info.flags:
            if select(flag):
                merged.setdefault(flag.decl, (flag, {}))[1][info.name] = flag.field
    out = []
    for decl, (flag, by_provider) in merged.items():
        decls = [decl] + ([flag.short] if flag.short else [])
        where = "/".join(by_provider)
        out.append(Opt(flag.param, flag.type | None,
                       typer.Option(None, *decls, help=f"[{where}] {flag.help}"),
                       by_provider=by_provider))
    return out


def in_panel(title: str, options: list[Opt]) -> list[Opt]:
    """`options`, shown under `title` in a command's help."""
    for opt in options:
        opt.option.rich_help_panel = title
    return options


_RECOVERY = {"max_restarts", "stall_timeout", "start_timeout", "on_node_loss", "preempt_signal",
             "notify", "replace_slow", "slow_fraction", "min_nodes", "replace_timeout",
             "allow_broad_node_credentials"}
_FABRIC = {"fabric_check", "allow_slow_network"}
in_panel(JOB, [o for o in JOB_OPTIONS if o.name not in _RECOVERY | _FABRIC])
in_panel(RECOVERY, [o for o in JOB_OPTIONS if o.name in _RECOVERY])
in_panel(FABRIC, [o for o in JOB_OPTIONS if o.name in _FABRIC])
CLUSTER_OPTIONS = (in_panel(CLUSTER, _CORE_CLUSTER_OPTIONS) + in_panel(PROVIDER, provider_flag_options())
                   + in_panel(PLAN, _PLAN_OPTIONS))
# `up` only: in `run`, --image is the job's (JOB_OPTIONS), which runs in it on any cluster.
UP_OPTIONS = CLUSTER_OPTIONS + in_panel(CLUSTER, [
    Opt("image", str | None, typer.Option(None, "--image", help="training container the nodes pull and jobs run in (default: one for the GPUs' architecture; checked against them)"), ("image",)),
])
GC_OPTIONS = provider_flag_options(lambda f: f.gc)


def to_nested(values: dict[str, Any], options: list[Opt], provider: str) -> dict[str, Any]:
    """Flag values -> the nested mapping the spec models take. A provider flag given for a
    provider that does not have it is an error that names the right provider."""
    from provision.model.errors import UserInputError

    out: dict[str, Any] = {}
    for opt in options:
        value = values.get(opt.name)
        if value is None:
            continue
        path = opt.path
        if opt.by_provider:
            if provider not in opt.by_provider:
                owners = ", ".join(opt.by_provider)
                decl = opt.option.param_decls[0]
                raise UserInputError(
                    f"{decl} is a setting of provider {owners}, not of {provider!r}",
                    hint=f"add --provider {next(iter(opt.by_provider))}, or leave {decl} out",
                )
            path = (provider, opt.by_provider[provider])
        if not path:
            continue
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def cluster_spec(opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(ClusterSpec, the YAML file's values) from `up`/`run` options."""
    from provision.model.spec import build_cluster_spec, load_config_file

    file_values = load_config_file(opts["config"]) if opts.get("config") else {}
    provider = opts.get("provider") or file_values.get("provider") or DEFAULT_PROVIDER
    nested = to_nested(opts, UP_OPTIONS, provider)  # `run` has no cluster --image
    return build_cluster_spec(file_values, nested), file_values


def job_spec(script: str, args: list[str], opts: dict[str, Any], file_values: dict[str, Any]) -> Any:
    from provision.model.spec import build_job_spec, parse_env_pairs

    values = to_nested(opts, JOB_OPTIONS, "")
    values["script"] = script
    values["args"] = list(args)
    env = parse_env_pairs(opts.get("env") or [], opts.get("env_file"))
    if env:
        values["env"] = {**((file_values.get("job") or {}).get("env") or {}), **env}
    return build_job_spec(file_values, values)


def script_and_args(script: str, args: list[str] | None) -> tuple[str, list[str]]:
    """`launch NAME -- train.py --lr 3e-4`: Click hands the `--` over as the first word."""
    rest = list(args or [])
    if script == "--":
        if not rest:
            from provision.model.errors import UserInputError

            raise UserInputError("no script given after `--`")
        script, rest = rest[0], rest[1:]
    return script, rest


def planned_only(opts: dict[str, Any]) -> int:
    """The exit code of a run that stopped at its plan: 0 for --dry-run (it did what was
    asked, as `up --dry-run` does), 1 when the user declined the plan."""
    return 0 if opts.get("dry_run") else 1


def confirmer(opts: dict[str, Any]) -> Callable[[Any], bool]:
    """Show the plan; ask before spending money (never for a free provider's free plan)."""

    def confirm(plan: Any) -> bool:
        from provision.model.registry import provider_info

        if opts.get("dry_run") and opts.get("plan_json"):
            import json

            typer.echo(json.dumps(plan.model_dump(mode="json"), indent=2))
        else:
            typer.echo(plan.render(), err=True)
        if opts.get("dry_run"):
            typer.echo("dry run: nothing was created", err=True)
            return False
        if plan.unresolved:  # nothing to ask: the pipeline refuses to create it
            return True
        # An unknown price is confirmed like a paid plan, never taken as free.
        free = (not provider_info(plan.provider).costs_money and plan.hourly_cost_usd <= 0
                and not plan.unpriced)
        if free or opts.get("yes"):
            return True
        if not sys.stdin.isatty():
            from provision.model.errors import UserInputError

            what = "the price of this plan is unknown" if plan.unpriced else "this plan costs money"
            raise UserInputError(
                f"{what} and there is no terminal to confirm it on",
                hint="add --yes to accept the plan above, or --dry-run to only print it",
            )
        question = "Create these resources (price unknown)?" if plan.unpriced else "Create these resources?"
        return typer.confirm(question, default=False)

    return confirm
