"""A managed job's records and log in its store: one object per state change, read in order.

    CLUSTER/jobs/ID/events/SEQ.json   a Record (SEQ: 6 digits), with the controller's MAC
    CLUSTER/jobs/ID/log/SEQ.log       the job's output, `[node-R] `-prefixed, one object per flush
    CLUSTER/jobs/ID/spec.json         the JobSpec as started; its conditional write claims ID
    CLUSTER/jobs/ID/control/cancel    present once someone asked the job to stop
    CLUSTER/data/jobs/ID/checkpoints/ the run's checkpoints (the nodes' part: remote/storekeys.py)
    CLUSTER/cluster.json              the controller's inventory (supervisor.publish_inventory)

An object store cannot append: "appending" a record is writing the next numbered object with a
conditional write (`put_new`: a second writer of the same number moves on to the next one, it
never overwrites), and a reader lists the folder and reads in order. JobLog writes (controller
side); JobView reads (`jobs`, `logs`, `attach`, from any machine with the store URL and
credentials). With the cluster's records key (the machine that made the cluster, and its
controller) a record whose MAC does not verify is left out and counted (`JobView.refused`):
nothing a node wrote steers `down` or `attach`.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from provision.job.managed.signing import mac
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
        """A record from its JSON; None when `key` is given and its MAC does not verify."""
        import hmac

        fields = json.loads(data)
        given = fields.pop("mac", None)
        rec = cls(**fields)
        if key is None:
            return rec
        ok = isinstance(given, str) and hmac.compare_digest(
            given, mac(key, rec.kind(), rec.to_json().encode()))
        return rec if ok else None


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
            beat = 0.0
            while not self._stop.wait(FLUSH_S):
                try:
                    self.flush()
                    if time.monotonic() - beat >= HEARTBEAT_S:
                        self.store.put_bytes(f"{self.prefix}/control/heartbeat",
                                             str(time.time()).encode())
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

    def cancel_requested(self) -> bool:
        return self.store.get_bytes(f"{self.prefix}/control/cancel") is not None


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
            try:
                rec = Record.read(data, self.key)
            except (ValueError, TypeError):
                rec = None
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
        data = self.store.get_bytes(f"{self.prefix}/spec.json")
        return json.loads(data) if data else None

    def heartbeat_age(self) -> float | None:
        """Seconds since the controller's last heartbeat (None: it never wrote one)."""
        data = self.store.get_bytes(f"{self.prefix}/control/heartbeat")
        try:
            return None if data is None else max(0.0, time.time() - float(data))
        except ValueError:
            return None

    def request_cancel(self) -> None:
        self.store.put_bytes(f"{self.prefix}/control/cancel", now_iso().encode())


def _seq_of(key: str) -> int | None:
    stem = key.rsplit("/", 1)[-1].split(".")[0]
    return int(stem) if stem.isdigit() else None


def _plain(name: str) -> bool:
    try:
        checked_name(name)
    except UnsafeKey:
        return False
    return True


def job_ids(store: Store, cluster: str) -> list[str]:
    """The ids of the jobs of `cluster` in the store (only plain names: an id becomes a path
    on the controller and here)."""
    ids = {k.split("/")[2] for k in store.list(f"{cluster}/jobs") if k.count("/") >= 3}
    return sorted((i for i in ids if _plain(i)), key=lambda i: (len(i), i))


def next_job_id(store: Store, cluster: str) -> str:
    ids = [int(i) for i in job_ids(store, cluster) if i.isdigit()]
    return str(max(ids, default=0) + 1)


def claim_job_id(store: Store, cluster: str, spec: bytes) -> str:
    """The next free job id, claimed by writing its spec.json conditionally: two machines
    handing over at once get two ids, never one overwritten."""
    for _ in range(CLAIMS):
        job_id = next_job_id(store, cluster)
        if store.put_new(f"{job_prefix(cluster, job_id)}/spec.json", spec):
            return job_id
    raise RuntimeError(f"could not claim a job id in {store.url}/{cluster}/jobs")
