"""`--notify URL`: one JSON POST per state change of a managed job, Slack-compatible.

The body is `{"text": "<one line for people>", "mgpu": <the Record>}`: a Slack incoming
webhook shows `text` (and ignores what it does not know), anything else can read `mgpu`.
Posts go out in order from a thread of their own; a webhook that fails, times out or answers
an error is logged and skipped: it never stops, slows or fails the job.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
from dataclasses import asdict
from urllib.parse import urlparse

from provision.job.managed.records import Record
from provision.model.errors import UserInputError
from provision.model.logsink import Log

TIMEOUT_S = 5.0
ICONS = {"finished": "white_check_mark", "failed": "x", "cancelled": "octagonal_sign",
         "node_lost": "warning", "preempted": "warning", "hang": "warning",
         "crashed": "warning", "torn_down": "wastebasket"}


def check_webhook_url(url: str) -> str:
    """The URL if it is http(s) with a host; UserInputError otherwise (plan time)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserInputError(
            f"--notify {url!r} is not an http(s) URL",
            hint="give a webhook URL, e.g. https://hooks.slack.com/services/T000/B000/XXXX",
        )
    return url


def message(rec: Record) -> dict[str, object]:
    icon = ICONS.get(rec.event, "information_source")
    where = f" ({', '.join(rec.nodes)})" if rec.nodes else ""
    text = (f":{icon}: mgpu-cloud {rec.cluster} job {rec.job}: {rec.event}{where}: "
            f"{rec.message}")
    return {"text": text, "mgpu": asdict(rec)}


class Notifier:
    """Call `send(record)` from anywhere; posts happen in order on one thread."""

    def __init__(self, url: str, log: Log) -> None:
        self.url, self.log = url, log
        self._queue: queue.Queue[Record | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def send(self, rec: Record) -> None:
        self._queue.put(rec)

    def _loop(self) -> None:
        while True:
            rec = self._queue.get()
            if rec is None:
                return
            try:
                self._post(rec)
            except Exception as exc:  # noqa: BLE001 - whatever the webhook did (a broken
                # status line is an http.client.HTTPException, not an OSError): this thread
                # must live on, or every later state change would be dropped
                try:
                    self.log(f"--notify: posting {rec.event} failed "
                             f"({type(exc).__name__}: {exc}); the job goes on")
                except Exception:  # noqa: BLE001, S110 - a broken log sink: still go on
                    pass

    def _post(self, rec: Record) -> None:
        body = json.dumps(message(rec)).encode()
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 - http(s)
            resp.read()

    def close(self, timeout: float = 15.0) -> None:
        """Send what is queued (at most `timeout` s), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
