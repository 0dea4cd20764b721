"""A store or a webhook that misbehaves never hangs or silences a managed run (issue 18):
bounded timeouts on every store client, and a notifier thread that survives anything the
webhook sends back. Real clients (boto3, google-cloud-storage, urllib) against real sockets."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import remote.store as store_mod
from provision.job.managed.checks import check_writable
from provision.job.managed.notify import Notifier
from provision.job.managed.records import JobLog
from provision.model.errors import MgpuError
from remote.store import open_store, parse_url

WAIT_S = 30.0  # far above the bounded figure (~2 s here), far below the unbounded (60 s+)


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a firewall that drops the
    replies looks the same to a client)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    srv.close()


def _bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("CONNECT_S", 1.0), ("READ_S", 1.0), ("ATTEMPTS", 2)):
        monkeypatch.setattr(store_mod, name, value, raising=False)


def _ends(call: object) -> BaseException:
    """Run `call` in a thread; the exception it ended with (it must end within WAIT_S)."""
    got: list[BaseException] = []

    def body() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            got.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"still waiting after {WAIT_S:.0f} s: no timeout"
    assert got, "a store that never answers returned something"
    return got[0]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_store_that_never_answers_fails_within_the_bounds(
        scheme: str, blackhole: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _bounded(monkeypatch)
    if scheme == "s3":
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": blackhole}.items():
            monkeypatch.setenv(k, v)
    else:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", blackhole)
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "mgpu-test")
    store = open_store(f"{scheme}://bucket/runs")
    _ends(lambda: store.get_bytes("c1/jobs/1/events/000001.json"))
    # the plan-time probe (a put first) uses the same clients: a clear error, not a hang
    exc = _ends(lambda: check_writable(parse_url(f"{scheme}://bucket/runs")))
    assert isinstance(exc, MgpuError) and "cannot be reached" in exc.message, exc


@pytest.fixture
def broken_then_good_webhook() -> Iterator[tuple[str, list[dict[str, object]]]]:
    """Answers its first POST with a line that is not HTTP (http.client.BadStatusLine, an
    HTTPException and not an OSError), every later one with 200 OK."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    received: list[dict[str, object]] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        count = 0
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                while len(body) < length:
                    body += conn.recv(65536)
                count += 1
                if count == 1:
                    conn.sendall(b"THIS IS NOT HTTP\r\n\r\n")
                    continue
                received.append(json.loads(body))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/hook", received
    stop.set()
    thread.join(5)
    srv.close()


def test_a_webhook_that_breaks_http_never_silences_the_later_messages(
        tmp_path: Path, broken_then_good_webhook: tuple[str, list[dict[str, object]]]) -> None:
    url, received = broken_then_good_webhook
    notes: list[str] = []
    hook = Notifier(url, notes.append)
    jl = JobLog(open_store(f"file://{tmp_path}"), "c1", "1", on_record=hook.send)
    for event in ("submitted", "started", "node_lost", "replaced", "resumed", "finished"):
        jl.record(event, event)  # the job goes on whatever the webhook does
    hook.close()
    assert [m["mgpu"]["event"] for m in received] == [  # type: ignore[index]
        "started", "node_lost", "replaced", "resumed", "finished"]
    assert len(notes) == 1 and "posting submitted failed (BadStatusLine" in notes[0], notes
    assert "the job goes on" in notes[0]
