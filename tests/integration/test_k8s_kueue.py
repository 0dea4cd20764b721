"""Polite under Kueue (issue 43), for real on the k8s stand-in: a run with --queue and
--priority is preempted by Kueue (its Workload Evicted and Preempted, the JobSet suspended,
every pod deleted gracefully: TERM is each pod's notice). Every rank saves (the run's
preemption path), the run waits in the queue saying why, resumes from THAT save once Kueue
admits it again, and its ledger counts the wait as "queued"."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import cli_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "k8s"))

from standin import Standin, checked  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("node_image")]
ROOT = Path(__file__).resolve().parents[2]
CLASSES = "kueue.x-k8s.io/v1beta2/workloadpriorityclasses"


@pytest.fixture
def standin(tmp_path: Path, node_image: str) -> Iterator[Standin]:
    with checked(Standin(tmp_path, docker=True, image=node_image)) as s:
        yield s


class Lines:
    """A process's output, collected on a thread; `until` waits for a line matching."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen = proc, list[str]()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seen.append(line)

    def until(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.seen):
                if found := re.search(pattern, line):
                    return found
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never came:\n{self.text[-6000:]}")

    @property
    def text(self) -> str:
        """Everything so far; all of it once the process ended (its pipe read to the end)."""
        if self.proc.poll() is not None:
            self.reader.join(60)
        return "".join(self.seen)


def test_a_kueue_preemption_saves_waits_and_resumes_from_that_save(
        standin: Standin, tmp_path: Path) -> None:
    name = f"k8q-{secrets.token_hex(3)}"
    standin.add_queue("team-q")
    standin.store.create(CLASSES, "", {"metadata": {"name": "low"}, "value": 100})
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision.cli", "run", "--provider", "k8s", "--nodes", "2",
         "--name", name, "--queue", "team-q", "--priority", "low", "--max-restarts", "1",
         "--max-hours", "1", str(ROOT / "examples" / "train_ddp.py"), "--steps", "70",
         "--save-every", "25", "--sleep", "0.3"],
        cwd=tmp_path, env=cli_env(None, {**standin.env(), "PYTHONUNBUFFERED": "1"}),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = Lines(proc)
    try:
        out.until(r"\[node-0\] step 30 ", 300)
        standin.kueue.set_quota(0)  # a workload of a higher priority takes the quota ...
        standin.kueue.evict("default", name)  # ... and Kueue preempts this one
        out.until(r"Kueue took the admission of .*waiting in queue team-q", 240)
        time.sleep(3)  # it waits: nothing runs meanwhile
        running = [p["metadata"]["name"] for p in standin.store.list(
            "pods", "default", f"mgpu-cloud-cluster={name}")
            if p.get("status", {}).get("phase") == "Running"]
        assert running == [], (running, out.text[-6000:])
        standin.kueue.set_quota(8)  # ... which ended: the quota is back
        code = proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.text
    assert code == 0, text[-6000:]
    assert re.search(r"node-\d(, node-\d)?: preemption notice \(terminate", text), text[-6000:]
    assert "the checkpoint saved after the notice is kept" in text, text[-6000:]
    assert re.search(r"Kueue took the admission of .*Evicted \(Preempted", text), text[-6000:]
    saved = [int(m) for m in re.findall(r"\[node-0\] checkpoint saved: step (\d+)", text)]
    resumed = int(out.until(r"resumed from step (\d+)", 1).group(1))
    assert resumed >= 30 and (resumed + 1) % 25 != 0, (resumed, saved)  # the notice's save
    assert resumed in saved, (resumed, saved)
    assert re.search(r"node-hours: .*queued [\d.]+ \(\d+%\)", text), text[-3000:]
    metrics = json.loads((tmp_path / "mgpu-outputs" / name / "metrics.json").read_text())
    assert metrics["steps"] == 70 and metrics["world_size"] == 4 and metrics["restart"] == 1
    assert standin.labelled(name) == []
