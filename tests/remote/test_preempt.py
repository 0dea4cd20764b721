"""remote/preempt.py against a local stand-in of the two metadata services, checking the
request shapes the clouds document (cloud-facts section 8): AWS IMDSv2 (token PUT with a TTL
header, then the notice GET with the token; 404 while nothing is scheduled), GCP (the
Metadata-Flavor header, refused without it; `preempted` and `maintenance-event`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from remote.preempt import check

TOKEN = "AQAEAExampleToken=="


class Metadata:
    def __init__(self) -> None:
        self.aws_action: dict[str, str] | None = None
        self.gcp: dict[str, str] = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        self.seen.append((method, path, headers))
        if path == "/latest/api/token":
            if method != "PUT" or not headers.get("x-aws-ec2-metadata-token-ttl-seconds"):
                return 400, ""
            return 200, TOKEN
        if path == "/latest/meta-data/spot/instance-action":
            if headers.get("x-aws-ec2-metadata-token") != TOKEN:
                return 401, ""  # IMDSv2 required (the nodes are launched with HttpTokens)
            return (404, "") if self.aws_action is None else (200, json.dumps(self.aws_action))
        if path.startswith("/computeMetadata/v1/instance/"):
            if headers.get("metadata-flavor") != "Google":
                return 403, ""
            key = path.rsplit("/", 1)[-1].split("?")[0]
            return (200, self.gcp[key]) if key in self.gcp else (404, "")
        return 404, ""


@pytest.fixture
def metadata() -> Iterator[tuple[Metadata, str]]:
    state = Metadata()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body = state.answer(self.command, self.path, headers)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = _serve  # noqa: N815

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.02,),  # shutdown waits a poll
                     daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_aws_reads_the_spot_notice_with_an_imdsv2_token(metadata: tuple[Metadata, str]) -> None:
    state, url = metadata
    assert check("aws", url) is None  # 404: nothing scheduled
    state.aws_action = {"action": "terminate", "time": "2026-08-21T16:34:24Z"}
    notice = check("aws", url + "/")
    assert notice is not None and (notice.action, notice.time) == ("terminate",
                                                                    "2026-08-21T16:34:24Z")
    put, get = state.seen[-2:]
    assert put[:2] == ("PUT", "/latest/api/token")
    assert 1 <= int(put[2]["x-aws-ec2-metadata-token-ttl-seconds"]) <= 21600
    assert get[:2] == ("GET", "/latest/meta-data/spot/instance-action")
    assert get[2]["x-aws-ec2-metadata-token"] == TOKEN


def test_gcp_preemption_and_only_a_terminating_maintenance_event(
        metadata: tuple[Metadata, str]) -> None:
    state, url = metadata
    assert check("gcp", url) is None
    assert all(h.get("metadata-flavor") == "Google" for _, _, h in state.seen)
    state.gcp["maintenance-event"] = "MIGRATE_ON_HOST_MAINTENANCE"
    assert check("gcp", url) is None  # a live migration keeps the VM running
    state.gcp["maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"
    notice = check("gcp", url)
    assert notice is not None and notice.action == "TERMINATE_ON_HOST_MAINTENANCE"
    assert notice.source == "instance/maintenance-event"
    state.gcp["preempted"] = "TRUE"
    notice = check("gcp", url)
    assert notice is not None and (notice.action, notice.source) == ("preempt",
                                                                     "instance/preempted")


def test_gcp_host_maintenance_on_a_gpu_vm_carries_its_deadline(
        metadata: tuple[Metadata, str]) -> None:
    """GPU VMs get a ONE-HOUR stopping notice ("Handle GPU host maintenance events"): the
    notice carries when the VM stops, so the job is saved close to it, not an hour early."""
    import time

    from remote.preempt import save_at

    state, url = metadata
    state.gcp["upcoming-maintenance"] = "{ }"  # nothing scheduled
    assert check("gcp", url) is None
    start = time.time() + 3000
    window = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    state.gcp["upcoming-maintenance"] = json.dumps({
        "can_reschedule": "false", "maintenance_status": "PENDING", "type": "SCHEDULED",
        "window_start_time": window, "window_end_time": window})
    notice = check("gcp", url)  # announced before maintenance-event says TERMINATE
    assert notice is not None and notice.source == "instance/upcoming-maintenance"
    assert notice.deadline is not None and abs(notice.deadline - int(start)) < 1
    assert abs(save_at(notice, lead_s=300) - (int(start) - 300)) < 1
    state.gcp["maintenance-event"] = "TERMINATE_ON_HOST_MAINTENANCE"
    assert check("gcp", url).deadline == notice.deadline  # type: ignore[union-attr]
    # the TERMINATE event without a schedule: an hour from when it was first seen
    state.gcp["upcoming-maintenance"] = "{ }"
    first = check("gcp", url)
    assert first is not None and first.deadline is not None
    assert 3590 < first.deadline - time.time() <= 3600
    assert check("gcp", url).deadline == first.deadline  # type: ignore[union-attr]
    # under way: at once
    state.gcp["upcoming-maintenance"] = json.dumps({"maintenance_status": "ONGOING",
                                                    "window_start_time": window})
    assert check("gcp", url).deadline is None  # type: ignore[union-attr]
    assert "upcoming-maintenance?alt=json" in [p.split("/")[-1] for _, p, _ in state.seen][-1]
