"""A managed job's records and log in its store: one object per state change, read in order.

    CLUSTER/jobs/ID/events/SEQ.json   a Record (SEQ: 6 digits), with the controller's MAC
    CLUSTER/jobs/ID/log/SEQ.log       the job's output, `[node-R] `-prefixed, one object per flush
    CLUSTER/jobs/ID/spec.json         the JobSpec as started, sealed; its conditional write
                                      claims ID
    CLUSTER/jobs/ID/control/heartbeat the controller's time, sealed, every HEARTBEAT_S
    CLUSTER/jobs/ID/control/cancel    present once someone asked the job to stop, sealed
    CLUSTER/data/jobs/ID/checkpoints/ the run's checkpoints (the nodes' part: remote/storekeys.py)
    CLUSTER/cluster.json              the controller's inventory (supervisor.publish_inventory)

An object store cannot append: "appending" a record is writing the next numbered object with a
conditional write (`put_new`: a second writer of the same number moves on to the next one, it
never overwrites), and a reader lists the folder and reads in order. JobLog writes (controller
side); JobView reads (`jobs`, `logs`, `attach`, from any machine with the store URL and
credentials). With the cluster's records key (the machine that made the cluster, and its
controller) a record whose MAC does not verify is left out and counted (`JobView.refused`),
a spec, heartbeat or cancel likewise counts as absent, and a job is listed only when its
spec.json verifies (signing.py): nothing a node wrote steers `down`, `attach`, a take-back
or the controller, nor hides the newest job.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from provision.job.managed.signing import (
    Unsigned,
    cancel_kind,
    heartbeat_kind,
    ledger_kind,
    mac,
    open_sealed,
    seal,
    spec_kind,
    unchecked_body,
    verify,
)
from remote.store import Store
from remote.storekeys import UnsafeKey, checked_name, job_records

EVENTS = ("submitted", "started", "node_lost", "preempted", "hang", "crashed", "replaced",
          "resumed", "finished", "failed", "cancelled", "torn_down", "taken_back", "slow_node",
          "straggler", "resume_regression", "ledger", "unreadable")
FINAL_STATES = ("succeeded", "failed", "cancelled")
STATE_OF = {"submitted": "starting", "started": "running", "taken_back": "running",
            "slow_node": "recovering", "node_lost": "recovering",
            "preempted": "recovering", "hang": "recovering", "crashed": "recovering",
            "replaced": "recovering", "resumed": "running", "finished": "succeeded",
            "failed": "failed", "cancelled": "cancelled"}
FLUSH_S = 2.0
HEARTBEAT_S = 5.0  # the controller's CLUSTER/jobs/ID/control/heartbeat, at least this often
LOST_AFTER_S = 45.0  # a heartbeat older than this: the controller may be lost (issue 36)
CLUSTER_FILE = "cluster.json"  # under CLUSTER/: the inventory the controller holds
RESUME_VAR = "MGPU_RESUME_FROM"  # a job env variable: start from that run's checkpoints
CLAIMS = 50  # job ids / sequence numbers tried before a conditional write gives up


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class Record:
    """One state change of a job (the stream `jobs`, `logs`, the notifier read)."""

    seq: int
    cluster: str
    job: str
    event: str
    state: str
    message: str
    at: str = field(default_factory=now_iso)
    nodes: list[str] = field(default_factory=list)
    restarts: int = 0
    exit_code: int | None = None
    node_job: str | None = None  # started/resumed/taken_back: the attempt's id on the nodes

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def sealed(self, key: bytes | None) -> bytes:
        """The record's JSON, with {"mac": ...} when the writer holds the records key."""
        data = asdict(self)
        if key is not None:
            data["mac"] = mac(key, self.kind(), self.to_json().encode())
        return json.dumps(data, sort_keys=True).encode()

    def kind(self) -> str:
        return f"record {self.cluster}/{self.job}/{self.seq}"

    @classmethod
    def read(cls, data: bytes, key: bytes | None) -> Record | None:
        """A record from its JSON; None when it is not a record (any field missing, extra or
        of another type) or `key` is given and its MAC does not verify."""
        try:
            fields = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(fields, dict):
            return None
        given = fields.pop("mac", None)
        if not _typed(fields):
            return None
        rec = cls(**fields)
        if key is None or verify(key, rec.kind(), rec.to_json().encode(), given):
            return rec
        return None


# A record's fields and their types (None allowed where the default is None)
FIELDS: dict[str, type | tuple[type, ...]] = {
    "seq": int, "cluster": str, "job": str, "event": str, "state": str, "message": str,
    "at": str, "nodes": list, "restarts": int, "exit_code": (int, type(None)),
    "node_job": (str, type(None))}
REQUIRED = ("seq", "cluster", "job", "event", "state", "message")


def _typed(fields: dict[str, Any]) -> bool:
    if set(fields) - set(FIELDS) or any(k not in fields for k in REQUIRED):
        return False
    if any(isinstance(v, bool) or not isinstance(v, FIELDS[k]) for k, v in fields.items()):
        return False
    return all(isinstance(n, str) for n in fields.get("nodes", []))


def job_prefix(cluster: str, job_id: str) -> str:
    return job_records(cluster, job_id)


class JobLog:
    """The controller's writer of one job's records and output. Thread-safe. A failed write
    to the store is retried at the next flush (output) or raised (records: the caller logs)."""

    def __init__(self, store: Store, cluster: str, job_id: str,
                 on_record: Callable[[Record], None] | None = None,
                 key: bytes | None = None) -> None:
        self.store, self.cluster, self.job_id, self.key = store, cluster, job_id, key
        self.prefix = job_prefix(cluster, job_id)
        self.on_record = on_record
        self.restarts = 0
        self.state = "starting"
        self._lock = threading.Lock()
        self._seq = len(store.list(f"{self.prefix}/events"))
        self._log_seq = len(store.list(f"{self.prefix}/log"))
        self._pending: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the run's goodput ledger (job/ledger.py Ledger.state), kept with each heartbeat and
        # at the end in control/ledger: a controller that takes the job back goes on from it
        self.ledger: Callable[[], dict[str, Any] | None] | None = None

    def keep_ledger(self) -> None:
        state = self.ledger() if self.ledger is not None else None
        if state is not None:
            self.store.put_bytes(f"{self.prefix}/control/ledger",
                                 self._sealed(ledger_kind, json.dumps(state)))

    def record(self, event: str, message: str, *, nodes: list[str] | None = None,
               exit_code: int | None = None, state: str | None = None,
               node_job: str | None = None) -> Record:
        with self._lock:
            self.state = state or STATE_OF.get(event, self.state)
            for _ in range(CLAIMS):  # a number someone else wrote is skipped, never overwritten
                self._seq += 1
                rec = Record(seq=self._seq, cluster=self.cluster, job=self.job_id, event=event,
                             state=self.state, message=message, nodes=nodes or [],
                             restarts=self.restarts, exit_code=exit_code, node_job=node_job)
                if self.store.put_new(f"{self.prefix}/events/{rec.seq:06d}.json",
                                      rec.sealed(self.key)):
                    break
            else:
                raise RuntimeError(f"no free record number after {self._seq} in {self.prefix}")
        self.line(f"[mgpu-cloud] {event}: {message}")
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    # --- output -------------------------------------------------------------------------
    def line(self, text: str) -> None:
        with self._lock:
            self._pending.append(text)

    def write(self, data: str) -> int:
        """File-like: launch.PrefixWriter's output lands here ([node-R] lines)."""
        with self._lock:
            self._pending.append(data.rstrip("\n"))
        return len(data)

    def flush(self) -> None:
        with self._lock:
            if not self._pending:
                return
            text = "\n".join(self._pending) + "\n"
            seq = self._log_seq
            for _ in range(CLAIMS):  # kept for the next flush when the store fails
                seq += 1
                if self.store.put_new(f"{self.prefix}/log/{seq:06d}.log", text.encode()):
                    self._log_seq = seq
                    self._pending.clear()
                    return
            raise RuntimeError(f"no free log number after {seq} in {self.prefix}")

    def start(self) -> None:
        def loop() -> None:
            beat = float("-inf")  # never (monotonic: maybe booted < HEARTBEAT_S ago)
            while not self._stop.wait(FLUSH_S):
                try:
                    self.flush()
                    if time.monotonic() - beat >= HEARTBEAT_S:
                        self.store.put_bytes(f"{self.prefix}/control/heartbeat",
                                             self._sealed(heartbeat_kind, str(time.time())))
                        self.keep_ledger()
                        beat = time.monotonic()
                except Exception:  # noqa: BLE001, S110 - the next flush retries
                    pass

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()
        self.keep_ledger()

    def _sealed(self, kind: Callable[[str, str], str], text: str) -> bytes:
        body = text.encode()
        return body if self.key is None else seal(self.key, kind(self.cluster, self.job_id),
                                                  body)

    def cancel_requested(self) -> bool:
        """A cancel sealed for this job is there (with no records key: any cancel)."""
        data = self.store.get_bytes(f"{self.prefix}/control/cancel")
        return data is not None and _opens(self.key, cancel_kind(self.cluster, self.job_id),
                                           data) is not None


class JobView:
    """A job as its store shows it, from any machine."""

    def __init__(self, store: Store, cluster: str, job_id: str,
                 key: bytes | None = None) -> None:
        self.store, self.cluster, self.job_id, self.key = store, cluster, job_id, key
        self.prefix = job_prefix(cluster, job_id)
        self.refused: set[str] = set()  # keys of records left out (no valid MAC, not a record)

    def records(self, after: int = 0) -> list[Record]:
        out = []
        for key in self.store.list(f"{self.prefix}/events"):
            seq = _seq_of(key)
            if seq is None or seq <= after or key in self.refused:
                continue
            data = self.store.get_bytes(key)
            if data is None:
                continue
            rec = Record.read(data, self.key)
            if rec is None or rec.seq != seq or (rec.cluster, rec.job) != (self.cluster,
                                                                            self.job_id):
                self.refused.add(key)
                continue
            out.append(rec)
        return sorted(out, key=lambda r: r.seq)

    def log_chunks(self, after: int = 0) -> list[tuple[int, str]]:
        """(seq, text) of every log object after `after`, in order."""
        out = []
        for key in self.store.list(f"{self.prefix}/log"):
            seq = _seq_of(key)
            if seq is not None and seq > after:
                data = self.store.get_bytes(key)
                if data is not None:
                    out.append((seq, data.decode(errors="replace")))
        return out

    def spec(self) -> dict[str, Any] | None:
        """The job's spec.json: with the records key only one sealed for this job (None
        otherwise: written or copied there by something else); without it, as the store
        gives it (to show, never to act on)."""
        return self._sealed_object("spec.json", spec_kind)

    def heartbeat_age(self) -> float | None:
        """Seconds since the controller's last heartbeat (None: it never wrote one, or with
        the records key none sealed for this job)."""
        data = self.store.get_bytes(f"{self.prefix}/control/heartbeat")
        body = _opens(self.key, heartbeat_kind(self.cluster, self.job_id), data) if data else None
        try:
            beat = float(body) if body is not None else None
        except ValueError:
            return None
        if beat is None or not math.isfinite(beat):
            return None
        return max(0.0, time.time() - beat)

    def ledger_state(self) -> dict[str, Any] | None:
        """The run's ledger as its controller last kept it (None: none, not JSON, or with the
        records key not sealed for this job)."""
        return self._sealed_object("control/ledger", ledger_kind)

    def _sealed_object(self, name: str,
                       kind: Callable[[str, str], str]) -> dict[str, Any] | None:
        """The JSON object under the job's `name` (None: none, not a JSON object, or with the
        records key not sealed for this job as `kind`)."""
        data = self.store.get_bytes(f"{self.prefix}/{name}")
        body = _opens(self.key, kind(self.cluster, self.job_id), data) if data else None
        try:
            found = json.loads(body) if body is not None else None
        except (ValueError, UnicodeDecodeError):
            return None
        return found if isinstance(found, dict) else None

    def request_cancel(self) -> None:
        """A cancel sealed for this job (Unsigned without the records key: the controller
        would not act on it)."""
        if self.key is None:
            raise Unsigned(f"cancelling job {self.job_id} of {self.cluster!r} needs the "
                           "cluster's records key, which this machine does not hold")
        self.store.put_bytes(f"{self.prefix}/control/cancel",
                             seal(self.key, cancel_kind(self.cluster, self.job_id),
                                  now_iso().encode()))


def _opens(key: bytes | None, kind: str, data: bytes) -> bytes | None:
    """The body of a sealed object; None when `key` is given and it is not sealed for
    `kind`. Without `key`: its body unchecked."""
    if key is None:
        return unchecked_body(data)
    try:
        return open_sealed(key, kind, data)
    except Unsigned:
        return None


def _seq_of(key: str) -> int | None:
    stem = key.rsplit("/", 1)[-1].split(".")[0]
    return int(stem) if stem.isdigit() else None


def _plain(name: str) -> bool:
    try:
        checked_name(name)
    except UnsafeKey:
        return False
    return True


def job_ids(store: Store, cluster: str, key: bytes | None = None) -> list[str]:
    """The ids of the jobs of `cluster` in the store (only plain names: an id becomes a path
    on the controller and here). With the records key only jobs whose spec.json is sealed
    for them: whatever else lies under CLUSTER/jobs/ is no job, so it can never be "the
    newest" one (which `jobs` tears down after, `down` cancels, a take-back follows)."""
    ids = {k.split("/")[2] for k in store.list(f"{cluster}/jobs") if k.count("/") >= 3}
    plain = sorted((i for i in ids if _plain(i)), key=lambda i: (len(i), i))
    if key is None:
        return plain
    return [i for i in plain if JobView(store, cluster, i, key).spec() is not None]


def next_job_id(store: Store, cluster: str) -> str:
    ids = [int(i) for i in job_ids(store, cluster) if i.isdigit()]
    return str(max(ids, default=0) + 1)


def claim_job_id(store: Store, cluster: str, spec: bytes, key: bytes) -> str:
    """The next free job id, claimed by writing its spec.json (sealed for that id)
    conditionally: two machines handing over at once get two ids, never one overwritten."""
    for _ in range(CLAIMS):
        job_id = next_job_id(store, cluster)
        sealed = seal(key, spec_kind(cluster, job_id), spec)
        if store.put_new(f"{job_prefix(cluster, job_id)}/spec.json", sealed):
            return job_id
    raise RuntimeError(f"could not claim a job id in {store.url}/{cluster}/jobs")
