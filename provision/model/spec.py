"""What the user asks for: ClusterSpec (where) and JobSpec (what), validated before anything runs.

A YAML file (`--config cluster.yaml`) and CLI flags produce the same models: both become a plain
mapping, CLI values are deep-merged over the file's, and the result is validated once by
`build_cluster_spec` / `build_job_spec`. Every model forbids unknown keys, so a typo in a YAML
file is an error, not a silently ignored setting.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml
from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from provision.model.base import StrictModel
from provision.model.errors import SpecError
from provision.model.registry import (
    DEFAULT_LAUNCHER,
    DEFAULT_PROVIDER,
    launcher_names,
    options_model,
    provider_names,
)
from provision.model.yamltext import YAML_HINT, YamlProblem

T = TypeVar("T")
DEFAULT_MASTER_PORT = 29500  # rendezvous port of rank 0 unless --master-port

CLUSTER_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
CLUSTER_NAME_RULE = (
    "lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen, "
    "at most 40 characters (it becomes tags, labels, container names and hostnames)"
)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_VALUE_BREAKS = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}


def validate_cluster_name(name: str) -> str:
    if not CLUSTER_NAME_RE.match(name):
        raise ValueError(f"invalid cluster name {name!r}: use {CLUSTER_NAME_RULE}")
    return name


def validate_cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a CIDR range; write e.g. 203.0.113.7/32 (one address) "
            "or 10.0.0.0/16 (a range)"
        ) from None
    return str(net)


def generate_cluster_name() -> str:
    return f"mgpu-{secrets.token_hex(3)}"


class ClusterSpecBase(StrictModel):
    """Where a job runs. The provider's own options live in the section named after it (e.g.
    `aws:`); the model with one such field per registered provider is `ClusterSpec` below."""

    name: str
    provider: str = DEFAULT_PROVIDER
    nodes: int = Field(1, ge=1, le=1024)
    # issue 44: warm spares, made, bootstrapped and kept idle with the cluster; not ranks
    spares: int = Field(0, ge=0, le=64, description="warm spare nodes: a lost node's rank "
                        "moves to one at once (cluster/providers/spares.py)")
    gpus_per_node: int | None = Field(
        None, ge=1, description="slots per node; default: what the instance type has"
    )
    ssh_cidr: str | None = None
    max_hours: float | None = Field(None, gt=0, le=24 * 14)
    spot: bool = False
    image: str | None = Field(None, description="training container for cloud nodes")
    # issue 18: a durable store makes runs managed (docs/ARCHITECTURE.md, managed runs)
    store: str | None = Field(None, description="s3://B/P, gs://B/P or file:///PATH: "
                              "checkpoints, job records and logs; a controller supervises")

    @field_validator("store")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        if v is None:
            return None
        from remote.store import parse_url

        return str(parse_url(v))  # ValueError says what a valid URL looks like

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_cluster_name(v)

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str) -> str:
        if v not in provider_names():
            raise ValueError(f"unknown provider {v!r}; choose one of: {', '.join(provider_names())}")
        return v

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, v: str | None) -> str | None:
        return None if v is None else validate_cidr(v)

    @model_validator(mode="before")
    @classmethod
    def _own_section(cls, data: Any) -> Any:
        """The chosen provider's section always exists (defaults filled in); the sections
        of other providers stay empty (None)."""
        if isinstance(data, Mapping):
            provider = data.get("provider", DEFAULT_PROVIDER)
            if provider in provider_names() and data.get(provider) is None:
                data = {**data, provider: {}}
        return data

    def options_as(self, model: type[T]) -> T:
        """The chosen provider's options, as its own model (what a provider reads)."""
        options = getattr(self, self.provider)
        if not isinstance(options, model):
            raise TypeError(f"provider {self.provider!r} has no {model.__name__}")
        return options


def _cluster_spec_model() -> type[ClusterSpecBase]:
    """ClusterSpecBase plus one optional field per registered provider, typed by the options
    model the provider declares."""
    fields: dict[str, Any] = {
        name: (options_model(name) | None, None) for name in provider_names()
    }
    model: type[ClusterSpecBase] = create_model(
        "ClusterSpec", __base__=ClusterSpecBase, __module__=__name__, **fields
    )
    return model


if TYPE_CHECKING:
    ClusterSpec = ClusterSpecBase
else:
    ClusterSpec = _cluster_spec_model()


class JobSpec(StrictModel):
    script: str
    args: list[str] = Field(default_factory=list)
    launcher: str = DEFAULT_LAUNCHER
    nproc_per_node: int | Literal["gpu"] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(None, description="folder synced to the nodes; default: the script's")
    excludes: list[str] = Field(
        default_factory=lambda: [".git", "__pycache__", "*.pyc", ".venv", "mgpu-outputs"]
    )
    master_port: int = Field(DEFAULT_MASTER_PORT, ge=1024, le=65535)
    rdzv: bool = False
    image: str | None = None
    nccl_debug: bool = False
    deepspeed_launcher: Literal["pdsh", "no_ssh"] = "pdsh"
    deepspeed_config: str | None = None
    # recovery (provision/job/recovery.py)
    max_restarts: int = Field(0, ge=0, le=1000, description="restarts after a failure")
    stall_timeout: float | None = Field(
        None, gt=0, description="seconds without output or checkpoint save = a hang")
    start_timeout: float | None = Field(  # default: max(stall_timeout, 300) (job/watcher.py)
        None, gt=0, description="seconds from a launch to its first output or save = a hang")
    on_node_loss: Literal["replace", "restart", "fail"] = "replace"
    preempt_signal: str = Field("SIGUSR1", description="sent to every rank on a notice")
    # issue 36: a node slower than the others (job/stragglers.py), from the job's markers
    replace_slow: bool = Field(False, description="save, replace a slow node, resume")
    slow_fraction: float = Field(0.5, gt=0, le=10,
                                 description="slow: its compute time above (1+this) x others'")
    # issue 36: go on with fewer nodes when a replacement cannot be had (job/elastic.py)
    min_nodes: int | None = Field(None, ge=1, description="the fewest nodes to go on with")
    replace_timeout: float | None = Field(
        None, gt=0, description="seconds a replacement may take before the run goes on without")
    # the fabric gate before a multi-node job (provision/job/gate/, docs/fabric-gate.md)
    fabric_check: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on for multi-node clusters whose provider knows the fabric")
    allow_slow_network: bool = Field(False, description="run even when the fabric gate fails")
    # issue 18: a webhook told of every state change of a managed job
    notify: str | None = Field(None, description="http(s) URL: one JSON POST per state change")
    # issue 42: a managed run whose nodes would hold this shell's own store keys
    allow_broad_node_credentials: bool = Field(
        False, description="run even when the nodes' store keys cannot be narrowed")

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: str | None) -> str | None:
        from urllib.parse import urlparse

        if v is not None and (urlparse(v).scheme not in ("http", "https")
                              or not urlparse(v).netloc):
            raise ValueError(f"{v!r} is not an http(s) URL; give a webhook URL, e.g. "
                             "https://hooks.slack.com/services/T000/B000/XXXX")
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher(cls, v: str) -> str:
        if v not in launcher_names():
            raise ValueError(f"unknown launcher {v!r}; choose one of: {', '.join(launcher_names())}")
        return v

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _nproc(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "gpu":
            if not v.isdigit():
                raise ValueError(f"nproc_per_node must be a number or 'gpu', not {v!r}")
            v = int(v)
        if isinstance(v, int) and v < 1:
            raise ValueError("nproc_per_node must be at least 1")
        return v

    @field_validator("preempt_signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        import signal

        name = v.upper() if v.upper().startswith("SIG") else f"SIG{v.upper()}"
        if not isinstance(getattr(signal, name, None), signal.Signals) or name in (
                "SIGKILL", "SIGSTOP"):
            raise ValueError(f"{v!r} is not a signal a script can catch; e.g. SIGUSR1, SIGTERM")
        return name

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"invalid environment variable name {key!r}")
            # Every launcher hands values on as lines (DeepSpeed's env file, docker's
            # --env-file): a line break would end the value there and start another line.
            bad = next((c for c in ENV_VALUE_BREAKS if c in value), None)
            if bad is not None:
                raise ValueError(
                    f"the value of {key} contains {ENV_VALUE_BREAKS[bad]}, which no launcher "
                    "can pass on; give it on one line (e.g. base64-encode it and decode it "
                    "in the script), or put it in a file in the job's folder")
        return v

    @model_validator(mode="after")
    def _paths(self) -> JobSpec:
        script = Path(self.script)
        if self.workdir and not Path(self.workdir).is_dir():
            raise ValueError(f"workdir {self.workdir!r} is not a folder")
        workdir = Path(self.workdir) if self.workdir else script.parent
        full = script if script.is_absolute() or self.workdir is None else workdir / script
        if not full.is_file():
            raise ValueError(
                f"script {self.script!r} does not exist (looked for {str(full)!r}); "
                "give a path to a Python file on this machine"
            )
        if self.deepspeed_config and not Path(self.deepspeed_config).is_file():
            raise ValueError(f"deepspeed_config {self.deepspeed_config!r} does not exist")
        return self

    @property
    def local_workdir(self) -> Path:
        return (Path(self.workdir) if self.workdir else Path(self.script).parent).resolve()

    @property
    def script_in_workdir(self) -> str:
        """The script's path relative to the synced workdir (what the nodes run)."""
        script = Path(self.script)
        full = script if script.is_absolute() or self.workdir is None else Path(self.workdir) / script
        return str(full.resolve().relative_to(self.local_workdir))


def _format_validation(exc: ValidationError, what: str) -> SpecError:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or what
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting (check its spelling; see `mgpu-cloud up --help`)"
        lines.append(f"{loc}: {msg}")
    return SpecError(f"invalid {what}:\n  " + "\n  ".join(lines))


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` wins; nested mappings merge; None values in `override` are ignored."""
    out: dict[str, Any] = dict(base)
    for key, value in override.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = deep_merge({}, value)
        else:
            out[key] = value
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        bad = YamlProblem.of(exc)
        raise SpecError(f"config file {str(p)!r} is not valid YAML{bad.at()}: {bad.problem}",
                        hint=YAML_HINT) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"config file {str(p)!r} must hold a mapping of settings, not {type(data).__name__}")
    return data


def build_cluster_spec(file_values: Mapping[str, Any], cli_values: Mapping[str, Any]) -> ClusterSpec:
    """Merge CLI values over file values and validate. Raises SpecError."""
    merged = deep_merge(file_values, cli_values)
    merged.pop("job", None)
    if "provider" in merged and merged["provider"] not in provider_names():
        raise SpecError(
            f"unknown provider {merged['provider']!r}; choose one of: "
            f"{', '.join(provider_names())}"
        )
    merged.setdefault("name", generate_cluster_name())
    provider = merged.get("provider", DEFAULT_PROVIDER)
    for other in provider_names():
        if other != provider and merged.get(other):
            raise SpecError(
                f"settings for provider {other!r} were given, but the provider is {provider!r}",
                hint=f"remove the `{other}:` section or set `provider: {other}`",
            )
    try:
        return ClusterSpec.model_validate(merged)
    except ValidationError as exc:
        raise _format_validation(exc, "cluster spec") from None


def build_job_spec(file_values: Mapping[str, Any], cli_values: Mapping[str, Any]) -> JobSpec:
    merged = deep_merge(file_values.get("job") or {}, cli_values)
    try:
        return JobSpec.model_validate(merged)
    except ValidationError as exc:
        raise _format_validation(exc, "job") from None


def parse_env_pairs(pairs: list[str], env_file: str | None = None) -> dict[str, str]:
    """`K=V` flags and an optional dotenv-style file (flags win)."""
    env: dict[str, str] = {}
    if env_file:
        p = Path(env_file)
        if not p.is_file():
            raise SpecError(f"env file {env_file!r} does not exist")
        for n, line in enumerate(p.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise SpecError(f"{env_file}:{n}: expected KEY=VALUE, got {line!r}")
            k, v = line.removeprefix("export ").split("=", 1)
            env[k.strip()] = v.strip().strip("'\"")
    for pair in pairs:
        if "=" not in pair:
            raise SpecError(f"--env {pair!r}: expected KEY=VALUE")
        k, v = pair.split("=", 1)
        env[k] = v
    return env
