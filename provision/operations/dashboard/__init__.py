"""`mgpu-cloud dashboard`: the local web dashboard (issue 22).

    views.py      state -> JSON-able views (the seams for later state are named there)
    metrics.py    metrics from log lines, monitor samples -> chart series (pure)
    sampling.py   live monitor samples of a cluster's nodes (ClusterWatch)
    joblogs.py    a job's log per node, live or saved (JobWatch)
    live.py       the registry of live watches, closed when idle
    actions.py    cancel and down, the only changes it makes (the CLI's code)
    security.py   loopback Host check, the token for --host, CSRF for the buttons
    web.py        the Starlette app: pages, JSON twins, 404 and error pages
    format.py     Jinja filters
    server.py     bind (a busy port is an error saying so), serve with uvicorn
    templates/, static/   HTML, CSS, JS; static/vendor/ holds uPlot (no CDN at run time)

Nothing here is imported by the CLI until `dashboard` runs (the CLI's start-up stays as it
was). Needs the `dashboard` extra: starlette and uvicorn.
"""
