"""The dashboard's pages and their JSON twins (Starlette).

    /                              all clusters           /api/clusters
    /clusters/NAME                 one cluster            /api/clusters/NAME
                                   its live samples       /api/clusters/NAME/monitor
    /clusters/NAME/jobs/ID         one job                /api/clusters/NAME/jobs/ID
                                   a node's log lines     /api/clusters/NAME/jobs/ID/log?node=N&from=K
    /cost                          cost history           /api/cost
    POST /api/clusters/NAME/jobs/ID/cancel,  POST /api/clusters/NAME/down   (the two buttons)

Every page also answers `?format=json` with its twin's JSON. Unknown names and ids answer a
404 page with a link back; any other failure a short error page (the traceback goes to the
server's stderr only). Handlers are plain functions (Starlette runs them on its thread pool):
state is files and SSH, both blocking.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from provision.model.errors import MgpuError
from provision.model.inventory import InventoryStore
from provision.operations.dashboard import format as fmt
from provision.operations.dashboard.actions import Removals, cancel_job
from provision.operations.dashboard.live import Live
from provision.operations.dashboard.security import Access, AccessMiddleware
from provision.operations.dashboard.views import (
    NotFound,
    cluster_view,
    clusters_view,
    cost_view,
    job_view,
    load_job,
)

HERE = Path(__file__).resolve().parent
APP_ID = "mgpu-cloud-dashboard"


@dataclass
class Dashboard:
    """What the handlers share."""

    access: Access
    home: Path | None = None
    live: Live = field(default_factory=Live)
    removals: Removals = field(default_factory=Removals)
    env: jinja2.Environment = field(default_factory=lambda: fmt.environment(HERE / "templates"))

    def page(self, request: Request, template: str, data: dict[str, Any], title: str,
             status: int = 200) -> Response:
        if wants_json(request):
            return JSONResponse(data, status)
        html = self.env.get_template(template).render(
            data=data, title=title, csrf=self.access.csrf, path=request.url.path)
        return HTMLResponse(html, status)


def wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or request.query_params.get("format") == "json"


def _dash(request: Request) -> Dashboard:
    dash: Dashboard = request.app.state.dashboard
    return dash


# --- pages ------------------------------------------------------------------------------------
def index(request: Request) -> Response:
    dash = _dash(request)
    return dash.page(request, "index.html", clusters_view(dash.home), "clusters")


def cluster(request: Request) -> Response:
    dash = _dash(request)
    name = request.path_params["name"]
    data = cluster_view(name, dash.home)
    data["removal"] = dash.removals.state(name)
    data["monitor"] = None
    if data["exists"]:
        watch = dash.live.cluster(InventoryStore(dash.home).load(name))
        data["monitor"] = None if watch is None else {"nodes": watch.latest()}
    return dash.page(request, "cluster.html", data, f"cluster {name}")


def monitor(request: Request) -> Response:
    """The cluster page's live part: state, the removal's progress, the jobs as recorded,
    every node's latest sample (or why it has none) and the chart series."""
    dash = _dash(request)
    name = request.path_params["name"]
    data = cluster_view(name, dash.home, runs=False)  # NotFound for unknown names
    out: dict[str, Any] = {"name": name, "exists": data["exists"],
                           "state": data["cluster"]["state"] if data["exists"] else "removed",
                           "removal": dash.removals.state(name), "jobs": data["jobs"],
                           "nodes": [], "series": None}
    if data["exists"]:
        watch = dash.live.cluster(InventoryStore(dash.home).load(name))
        if watch is not None:
            out.update(nodes=watch.latest(), series=watch.series(), interval=watch.interval)
    return JSONResponse(out)


def _job_data(dash: Dashboard, name: str, job_id: str) -> dict[str, Any]:
    rec, inv = load_job(name, job_id, dash.home)
    watch = dash.live.job(rec, inv)
    watch.refresh()
    data = job_view(rec, inv, watch.log_events())
    data.update(logs=watch.status(), metrics=watch.metrics())
    return data


def job(request: Request) -> Response:
    dash = _dash(request)
    name, job_id = request.path_params["name"], request.path_params["job_id"]
    return dash.page(request, "job.html", _job_data(dash, name, job_id),
                     f"job {job_id} on {name}")


def job_log(request: Request) -> Response:
    dash = _dash(request)
    name, job_id = request.path_params["name"], request.path_params["job_id"]
    rec, inv = load_job(name, job_id, dash.home)
    node = request.query_params.get("node") or min(rec.nodes.items(),
                                                   key=lambda kv: kv[1].rank)[0]
    try:
        start = max(0, int(request.query_params.get("from", "0")))
    except ValueError:
        return JSONResponse({"error": "from= must be a line number"}, 400)
    got = dash.live.job(rec, inv).read(node, start)
    if got is None:
        raise NotFound(f"job {job_id} did not run on a node named {node!r} (it ran on "
                       f"{', '.join(rec.nodes)})", back=f"/clusters/{name}/jobs/{job_id}",
                       back_text=f"job {job_id}")
    return JSONResponse(got)


def cost(request: Request) -> Response:
    dash = _dash(request)
    return dash.page(request, "cost.html", cost_view(dash.home), "cost")


def health(request: Request) -> Response:
    return JSONResponse({"app": APP_ID})


# --- the two buttons --------------------------------------------------------------------------
def cancel(request: Request) -> Response:
    dash = _dash(request)
    name, job_id = request.path_params["name"], request.path_params["job_id"]
    load_job(name, job_id, dash.home)  # NotFound first
    result = cancel_job(name, job_id, home=dash.home)
    return JSONResponse(result, 200 if result["ok"] else 409)


def down(request: Request) -> Response:
    dash = _dash(request)
    name = request.path_params["name"]
    if not cluster_view(name, dash.home, runs=False)["exists"]:
        return JSONResponse({"error": f"cluster {name!r} was removed already"}, 409)
    state = dash.removals.start(name, before=lambda: dash.live.drop_cluster(name))
    return JSONResponse(state, 202)


# --- errors -----------------------------------------------------------------------------------
def _error_page(request: Request, status: int, message: str, back: str = "/",
                back_text: str = "all clusters", hint: str | None = None) -> Response:
    if wants_json(request):
        return JSONResponse({"error": message, "hint": hint}, status)
    dash = _dash(request)
    html = dash.env.get_template("error.html").render(
        title="not found" if status == 404 else "error", status=status, message=message,
        hint=hint, back=back, back_text=back_text, csrf=dash.access.csrf,
        path=request.url.path, data={})
    return HTMLResponse(html, status)


async def not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, NotFound):
        return _error_page(request, 404, exc.message, exc.back, exc.back_text)
    return _error_page(request, 404, f"nothing here: {request.url.path}")


async def mgpu_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MgpuError)
    return _error_page(request, 409, exc.message, hint=exc.hint)


async def server_error(request: Request, exc: Exception) -> Response:
    traceback.print_exception(exc, file=sys.stderr)
    return _error_page(request, 500, f"the dashboard failed on this page: "
                                     f"{type(exc).__name__}: {exc}",
                       hint="the dashboard's terminal shows the details")


def create_app(dash: Dashboard) -> Starlette:
    routes = [
        Route("/", index), Route("/api/clusters", index),
        Route("/clusters/{name}", cluster), Route("/api/clusters/{name}", cluster),
        Route("/api/clusters/{name}/monitor", monitor),
        Route("/clusters/{name}/jobs/{job_id}", job),
        Route("/api/clusters/{name}/jobs/{job_id}", job),
        Route("/api/clusters/{name}/jobs/{job_id}/log", job_log),
        Route("/api/clusters/{name}/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/api/clusters/{name}/down", down, methods=["POST"]),
        Route("/cost", cost), Route("/api/cost", cost),
        Route("/api/health", health),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AccessMiddleware, access=dash.access)],
        exception_handlers={404: not_found, NotFound: not_found, MgpuError: mgpu_error,
                            Exception: server_error},
    )
    app.state.dashboard = dash
    return app
