"""Start the dashboard: bind first (so a busy port is a clear error, not a log line of
uvicorn's), then serve with uvicorn on that socket until Ctrl-C."""

from __future__ import annotations

import contextlib
import errno
import json
import secrets
import socket
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.model.errors import MgpuError, ProviderUnavailableError, UserInputError
from provision.model.logsink import stderr_line

DEFAULT_PORT = 8765


@dataclass
class Started:
    url: str  # what to open (with ?token=... when one is needed)
    sock: socket.socket
    token: str | None


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
    """Whether a mgpu-cloud dashboard answers at host:port."""
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104 - a comparison
    url = f"http://{probe if ':' not in probe else f'[{probe}]'}:{port}/api/health"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http to ourselves
            return bool(json.loads(resp.read()).get("app") == "mgpu-cloud-dashboard")
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
                    hint=f"open http://{host}:{port}/ , or start another with --port "
                         f"{port + 1}") from None
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
    from provision.operations.dashboard.security import is_loopback

    sock = bind(host, port)
    real_port = sock.getsockname()[1]
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{real_port}/" + (f"?token={token}" if token else "")
    return Started(url, sock, token)


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
    dash = Dashboard(access=Access(host, started.token, secrets.token_urlsafe(24)), home=home,
                     live=live, removals=Removals(home))
    config = uvicorn.Config(create_app(dash), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    (say or stderr_line)(f"dashboard: {started.url}  (Ctrl-C to stop)")
    if open_browser:
        import webbrowser

        threading.Thread(target=webbrowser.open, args=(started.url,), daemon=True).start()
    try:
        server.run(sockets=[started.sock])
    finally:
        live.close()
        with contextlib.suppress(OSError):
            started.sock.close()
