"""Start the dashboard: bind first (so a busy port is a clear error, not a log line of
uvicorn's), then serve with uvicorn on that socket until Ctrl-C."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.model.errors import MgpuError, ProviderUnavailableError, UserInputError
from provision.model.logsink import stderr_line

DEFAULT_PORT = 8765


@dataclass
class Started:
    url: str  # what to open: the address with ?token=...
    sock: socket.socket
    token: str
    port: int


def require_libraries() -> None:
    """ProviderUnavailableError naming the extra when starlette or uvicorn is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ProviderUnavailableError(
            f"the dashboard needs starlette and uvicorn ({exc.name} is not installed)",
            hint="pip install 'mgpu-cloud[dashboard]'") from None


def _dashboard_at(host: str, port: int) -> bool:
    """Whether a mgpu-cloud dashboard answers at host:port: without its token it refuses
    with its own realm (security.REALM)."""
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104 - a comparison
    url = f"http://{probe if ':' not in probe else f'[{probe}]'}:{port}/api/health"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http to ourselves
            return bool(json.loads(resp.read()).get("app") == "mgpu-cloud-dashboard")
    except urllib.error.HTTPError as err:
        return err.code == 401 and 'realm="mgpu-cloud-dashboard"' in (
            err.headers.get("WWW-Authenticate") or "")
    except Exception:  # noqa: BLE001 - anything else on that port
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one). UserInputError when the port
    is taken, saying whether a dashboard already runs there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT, never a listener
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            if _dashboard_at(host, port):
                raise UserInputError(
                    f"a mgpu-cloud dashboard already runs on {host}:{port}",
                    hint=f"open the address it printed (http://{host}:{port}/?token=...), "
                         f"or start another with --port {port + 1}") from None
            raise UserInputError(f"port {port} on {host} is in use by another program",
                                 hint="pick another with --port") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UserInputError(f"{host} is not an address of this machine",
                                 hint="--host takes one of this machine's addresses, "
                                      "or 0.0.0.0 for all") from None
        raise MgpuError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def start(host: str, port: int) -> Started:
    sock = bind(host, port)
    real_port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)  # on loopback too: other local users reach it
    shown = f"[{host}]" if ":" in host else host
    return Started(f"http://{shown}:{real_port}/?token={token}", sock, token, real_port)


def redirect_page(url: str) -> Path:
    """A 0600 page that sends the browser on to `url`; the caller removes it."""
    import html

    fd, name = tempfile.mkstemp(prefix="mgpu-dashboard-", suffix=".html")  # 0600
    with os.fdopen(fd, "w") as page:
        page.write(f'<!doctype html><meta charset="utf-8">'
                   f'<meta http-equiv="refresh" content="0;url={html.escape(url)}">'
                   f'<a href="{html.escape(url)}">open the mgpu-cloud dashboard</a>\n')
    return Path(name)


def open_in_browser(url: str) -> Path:
    """Open `url` in the web browser through a redirect_page, so that the token is on no
    command line (`ps` shows a browser's arguments to every local user). Returns the page:
    the caller removes it when the dashboard stops."""
    import webbrowser

    page = redirect_page(url)
    threading.Thread(target=webbrowser.open, args=(page.as_uri(),), daemon=True).start()
    return page


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, open_browser: bool = False,
          home: Path | None = None, say: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted. `say` gets the address line (the CLI prints it)."""
    require_libraries()
    import uvicorn

    from provision.operations.dashboard.actions import Removals
    from provision.operations.dashboard.live import Live
    from provision.operations.dashboard.security import Access
    from provision.operations.dashboard.web import Dashboard, create_app

    started = start(host, port)
    live = Live(home).start()
    access = Access(host, started.token, secrets.token_urlsafe(24), port=started.port)
    dash = Dashboard(access=access, home=home, live=live, removals=Removals(home))
    config = uvicorn.Config(create_app(dash), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    (say or stderr_line)(f"dashboard: {started.url}  (Ctrl-C to stop)")
    opener = open_in_browser(started.url) if open_browser else None
    try:
        server.run(sockets=[started.sock])
    finally:
        live.close()
        if opener is not None:
            opener.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            started.sock.close()
