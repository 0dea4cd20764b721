"""THE reader of every JSON a node sends: typed, bounded models, and one error.

A node runs the user's code as root, so what `remote.pyz` prints there may be anything: a
status that is not an object, `ended: 1e300` (datetime raised OverflowError), `MGPU-EVENT []`
(AttributeError), a manifest of a billion files. Each answer is read with `read(Model, text)`
(or `last_line`), which returns the model or raises `Unreadable`; the caller says
`unreadable(node, "status", exc)` ("node-1 sent an unreadable status (...)"), treats that
node's answer as missing, and goes on: an unreadable answer never ends a supervisor or
marks a job failed.

    NodeJobState, JobStatus  `remote.pyz job status` (remote/jobs.py state_of), per job id
    JobEnd                   an attached job's last line `MGPU-JOB-END {...}`
    CheckpointManifest       `remote.pyz ckpt-manifest` (remote/ckpt.py report)
    PullSummary              `remote.pyz store pull` (remote/storesync.py)
    NodeEvent                `MGPU-EVENT {...}` (remote/supervise.py: preemption, maintenance)
    ResidentEvent            `MGPU-EVENT {"event": "resident", ...}` (remote/resident.py)
    GateLine                 a fabric gate's JSON line (remote/allreduce.py)
    PreflightReport          `remote.pyz preflight --json` (remote/preflight.py collect): the
                             fields nodes/checks.py judges typed; the others kept as sent
    MonitorSample            a `remote.pyz monitor` line (remote/monitor.py sample): `top`,
                             the dashboard's charts
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    StringConstraints,
    ValidationError,
    model_validator,
)

from provision.model.nodetext import lines, shown

MAX_ANSWER = 1 << 20  # characters of one JSON answer (a line)
MAX_MANIFEST = 64 << 20  # a checkpoint manifest (100 000 files of long names)
MAX_FILES = 100_000  # files one manifest may name (nodes/unpack.py MAX_MEMBERS)
MAX_JOBS = 10_000  # jobs one status may name
MAX_EPOCH = float(1 << 33)  # seconds since 1970: year 2242 (datetime takes it; 1e300 not)

Text = Annotated[str, StringConstraints(max_length=1000)]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
Epoch = Annotated[float, Field(ge=0, le=MAX_EPOCH, allow_inf_nan=False)]
Finite = Annotated[float, Field(ge=-1e18, le=1e18, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=1 << 62)]
ExitCode = Annotated[int, Field(ge=-(1 << 31), le=1 << 31)]

M = TypeVar("M", bound=BaseModel)


class Unreadable(ValueError):
    """A node's JSON that is not what it should be; the message says why, escaped."""


class _Data(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeJobState(_Data):
    state: Literal["running", "exited", "cancelled", "lost"]
    exit_code: ExitCode | None = None
    started: Epoch | None = None
    ended: Epoch | None = None
    log_bytes: Count | None = None


class JobStatus(RootModel[dict[Name, NodeJobState]]):
    """job id -> its state on the node."""

    root: dict[Name, NodeJobState] = Field(max_length=MAX_JOBS)


class CheckpointManifest(_Data):
    files: dict[Text, tuple[Count, Finite]] = Field(default_factory=dict,
                                                     max_length=MAX_FILES)
    incomplete: list[Text] = Field(default_factory=list, max_length=MAX_FILES)
    now: Finite = 0.0


class JobEnd(_Data):
    job: Name
    state: NodeJobState | None = None
    checkpoints: CheckpointManifest | None = None


class PullSummary(_Data):
    files: Count = 0
    skipped: list[Text] = Field(default_factory=list, max_length=MAX_FILES)
    newest_step: Count | None = None


class NodeEvent(_Data):
    event: Annotated[str, StringConstraints(max_length=64)]
    action: Text | None = None
    time: Text | None = None
    source: Text | None = None
    signal: Text | None = None
    processes: Count | list[Count] | None = None
    deadline: Epoch | None = None
    save_at: Epoch | None = None
    at: Epoch | None = None  # preemption: the node's clock as it signalled its ranks

    def fields(self) -> dict[str, Any]:
        """The fields set, texts escaped for the messages that quote them."""
        return {k: shown(v) if isinstance(v, str) else v
                for k, v in self.model_dump(exclude_none=True).items()}


class ResidentEvent(_Data):
    """A resident rank's phase (remote/resident.py `_say`; provision/job/resident.py)."""

    event: Literal["resident"]
    phase: Literal["formed", "interrupted", "done"]
    gen: Annotated[int, Field(ge=0, le=1 << 31)]
    rank: Annotated[int, Field(ge=0, le=1 << 24)]
    world: Annotated[int, Field(ge=1, le=1 << 24)]
    local_rank: Annotated[int, Field(ge=0, le=1 << 24)] | None = None
    pid: Count | None = None
    master: Text | None = None
    error: Text | None = None


class GateLine(_Data):
    """One JSON line of the fabric gate; a summary names the world and its peak."""

    summary: StrictBool = False
    backend: Text | None = None
    world_size: Count | None = None
    max_busbw_gbps: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None
    pairwise: StrictBool = False
    pair: tuple[Count, Count] | None = None
    busbw_gbps: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None
    round: Count | None = None
    error: Text | None = None
    verdict: Text | None = None
    seconds: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _whole(self) -> GateLine:
        if self.summary and (self.world_size is None or self.max_busbw_gbps is None):
            raise ValueError("a summary without world_size and max_busbw_gbps")
        if self.pair is not None and self.round is None:
            raise ValueError("a pair without its round")
        return self


class _Open(BaseModel):
    """Typed where it is read; other fields kept as sent (shown raw only in `--json`)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class PreflightGpu(_Open):
    name: Text | None = None
    driver_version: Text | None = None


class PreflightTorch(_Open):
    torch: Text | None = None
    cuda: Text | None = None
    nccl: Text | None = None


class PreflightTopology(_Open):
    summary: Text | None = None
    nvlink_min: Count | None = None


class PreflightDisk(_Open):
    free_bytes: Count | None = None


class PreflightPort(_Open):
    addr: Text | None = None
    port: Count | None = None
    status: Text | None = None
    reachable: StrictBool | None = None
    bindable: StrictBool | None = None


class PreflightReport(_Open):
    error: Text | None = None
    torch: PreflightTorch | None = None
    torch_error: Text | None = None
    torch_timed_out: StrictBool | None = None
    gpus: list[PreflightGpu] | None = Field(default=None, max_length=4096)
    gpu_error: Text | None = None
    topology: PreflightTopology | None = None
    disk: PreflightDisk | None = None
    master_port: PreflightPort | None = None


class MonitorGpu(_Open):
    index: Count  # remote/monitor.py always sends it (its place when nvidia-smi gives none)
    name: Text | None = None
    util_pct: Finite | None = None
    sm_active: Finite | None = None
    power_w: Finite | None = None
    temp_c: Finite | None = None
    mem_used_mib: Finite | None = None
    mem_total_mib: Finite | None = None


class MonitorSample(_Open):
    cpus: Count | None = None
    cpu_pct: Finite | None = None
    mem_used_mib: Finite | None = None
    mem_total_mib: Finite | None = None
    load: list[Finite] = Field(default_factory=list, max_length=16)
    gpus: list[MonitorGpu] = Field(default_factory=list, max_length=4096)
    error: Text | None = None


def monitor_sample(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A monitor line's object as MonitorSample (the keys sent, typed); None when it is not
    one: an unreadable sample is no sample (the node shows as not answering)."""
    if value is None:
        return None
    try:
        return read_value(MonitorSample, value).model_dump(exclude_unset=True)
    except Unreadable:
        return None


def _why(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])[:80]
    return shown(f"{where + ': ' if where else ''}{first['msg']}")[:200]


def read(model: type[M], text: str, *, limit: int = MAX_ANSWER) -> M:
    """`text` (one JSON value) as `model`; Unreadable saying why otherwise."""
    if len(text) > limit:
        raise Unreadable(f"{len(text)} characters, more than {limit}")
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise Unreadable(_why(exc)) from None


def read_value(model: type[M], value: Any) -> M:
    """An already parsed value (e.g. from a line read by another model) as `model`."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise Unreadable(_why(exc)) from None


def last_line(model: type[M], text: str, *, limit: int = MAX_ANSWER) -> M:
    """The last non-empty line of `text` as `model` (what a node command prints last)."""
    found = [line for line in lines(text.strip()) if line.strip()]
    if not found:
        raise Unreadable("nothing")
    return read(model, found[-1], limit=limit)


def unreadable(node: str, what: str, exc: Exception) -> str:
    """The one way it is said: `node-1 sent an unreadable status (why)`."""
    return f"{node} sent an unreadable {what} ({exc})"
