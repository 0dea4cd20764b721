/* The cluster, job and cost pages: what each polls and how it draws it. */
(function () {
  "use strict";
  const M = window.MGPU;
  const { getJSON, post, poll, text, setPill, banner, fmtNum, enc, $ } = window.MGPU_PARTS;

  function gib(v) { return v == null ? "-" : (v / 1024).toFixed(1); }

  /* ---- cluster page ---------------------------------------------------------------------- */
  function nodeRow(tr, s) {
    const status = tr.querySelector(".status");
    if (s.error) {
      const waiting = s.error.startsWith("waiting");
      status.innerHTML = "";
      status.title = s.error;
      const pill = document.createElement("span");
      setPill(pill, waiting ? "waiting" : "down", waiting ? s.error : "not answering");
      pill.title = s.error;
      status.appendChild(pill);
      if (!waiting) {
        const why = document.createElement("span");
        why.className = "why small muted";
        why.textContent = s.error.replace(/^not answering: /, "");
        status.appendChild(why);
      }
      for (const c of ["util", "mem", "power", "temp"]) text(tr.querySelector("." + c), "-");
      return;
    }
    status.innerHTML = '<span class="pill answering">answering</span>';
    status.title = "";
    const gpus = s.gpus || [];
    if (gpus.length) {
      const v = s.values;
      text(tr.querySelector(".util"), v.gpu_util == null ? "-" : v.gpu_util.toFixed(0));
      const used = gpus.reduce((a, g) => a + (g.mem_used_mib || 0), 0);
      const total = gpus.reduce((a, g) => a + (g.mem_total_mib || 0), 0);
      text(tr.querySelector(".mem"), `${gib(used)} / ${gib(total)} GiB`);
      text(tr.querySelector(".power"), v.power_w == null ? "-" : `${v.power_w.toFixed(0)} W`);
      const temps = gpus.map((g) => g.temp_c).filter((t) => t != null);
      text(tr.querySelector(".temp"), temps.length ? `${Math.max(...temps).toFixed(0)} °C` : "-");
      text(tr.querySelector(".devices"), `${gpus.length}× ${gpus[0].name || "GPU"}`);
    } else {
      text(tr.querySelector(".util"), s.cpu_pct == null ? "-" : s.cpu_pct.toFixed(0));
      text(tr.querySelector(".mem"), `${gib(s.mem_used_mib)} / ${gib(s.mem_total_mib)} GiB`);
      text(tr.querySelector(".power"), "-");
      text(tr.querySelector(".temp"), "-");
      text(tr.querySelector(".devices"), `no GPU · ${s.cpus || "?"} CPUs`);
    }
  }

  function monitorCharts(series, nodes) {
    const gpu = series.kind === "gpu";
    const lines = series.nodes.map((n, i) => ({ label: n, color: M.color(i) }));
    const any = series.util[0].length > 0;
    const silent = !nodes.some((s) => s.answering);
    const empty = any || !silent ? "waiting for samples" : "no samples: no node answers";
    text($("#col-util"), gpu ? "GPU util %" : "CPU %");
    M.chart($("#chart-util"), "util", { title: gpu ? "GPU utilisation %" : "CPU % (no GPUs)",
      series: lines, data: series.util, empty });
    M.chart($("#chart-mem"), "mem", { title: gpu ? "GPU memory used, GiB" : "Memory used, GiB",
      series: lines, data: series.mem, empty });
    M.chart($("#chart-power"), "power", { title: "Power, W", series: lines,
      data: series.power || [[]],
      empty: gpu || !any ? empty : "no power readings: no GPUs on these nodes" });
  }

  function removalBanner(removal) {
    const el = $("#removal");
    if (!removal) return;
    const tail = removal.lines.slice(-6).join("\n");
    if (removal.state === "running") banner(el, "", `Removing the cluster…\n${tail}`);
    else if (removal.state === "done") banner(el, "ok", `Cluster removed.\n${tail}`);
    else banner(el, "bad", `Removal failed: ${removal.error}\n${tail}`);
  }

  function duration(secs) {
    if (secs == null) return "-";
    const s = Math.floor(secs);
    const pad = (n) => String(n).padStart(2, "0");
    if (s >= 86400) return `${Math.floor(s / 86400)}d${pad(Math.floor(s % 86400 / 3600))}h`;
    if (s >= 3600) return `${Math.floor(s / 3600)}h${pad(Math.floor(s % 3600 / 60))}m`;
    return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
  }

  function jobRow(j) {
    const tr = document.querySelector(`#jobs tr[data-job="${CSS.escape(j.id)}"]`);
    if (!tr) return;
    setPill(tr.querySelector(".pill"), j.state);
    text(tr.cells[3], duration(j.duration_s));
    text(tr.cells[5], j.exit_summary);
  }

  M.clusterPage = function (name, exists) {
    document.querySelectorAll(".swatch").forEach((el) => {
      el.style.background = M.color(Number(el.dataset.index));
    });
    const button = $("#down-button");
    if (button) button.addEventListener("click", async () => {
      const ok = await M.confirm({ title: `Remove cluster ${name}?`, yes: "Remove it",
        body: "Every node and resource of this cluster is deleted (as `mgpu-cloud down`). " +
              "A job still running is stopped; its logs are copied here first.", word: name });
      if (!ok) return;
      button.disabled = true;
      const r = await post(`/api/clusters/${enc(name)}/down`);
      if (!r.ok) banner($("#removal"), "bad", r.body.error || `HTTP ${r.status}`);
      else removalBanner(r.body);
    });
    if (!exists) return;
    poll(async () => {
      const d = await getJSON(`/api/clusters/${enc(name)}/monitor`);
      removalBanner(d.removal);
      setPill($("#cluster-state"), d.removal && d.removal.state === "running" ? "removing" : d.state);
      if (button) button.disabled = d.state !== "ready" || (d.removal && d.removal.state === "running");
      for (const s of d.nodes) {
        const tr = document.querySelector(`#nodes tr[data-node="${CSS.escape(s.node)}"]`);
        if (tr) nodeRow(tr, s);
      }
      if (d.series) monitorCharts(d.series, d.nodes);
      for (const j of d.jobs) jobRow(j);
      return d.exists || (d.removal && d.removal.state === "running");
    }, 2000);
  };

  /* ---- job page -------------------------------------------------------------------------- */
  const KEEP_LINES = 5000;
  const METRIC_COLORS = ["#3559e0", "#d6336c", "#0ca678", "#f08c00", "#7048e8", "#1098ad"];

  /* Metrics with several points get a chart; one-point ones (a final throughput) a tile. */
  function metricCharts(metrics) {
    const rank = (k) => (k === "loss" ? 0 : k.includes("loss") ? 1 : 2);
    const keys = Object.keys(metrics).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    $("#metrics-empty").hidden = keys.length > 0;
    const tiles = $("#metric-tiles");
    keys.forEach((key, i) => {
      const m = metrics[key];
      const slug = key.replace(/[^A-Za-z0-9_-]/g, "_");
      if (m.x.length === 1) {
        let tile = document.getElementById("tile-" + slug);
        if (!tile) {
          tile = document.createElement("div");
          tile.className = "kpi";
          tile.id = "tile-" + slug;
          tile.dataset.metric = key;
          tile.appendChild(document.createElement("span"));
          tile.appendChild(document.createTextNode(""));
          tiles.appendChild(tile);
        }
        text(tile.firstChild, fmtNum(m.y[0]));
        tile.lastChild.textContent = `${key} · step ${m.x[0]} · ${m.node}`;
        return;
      }
      const old = document.getElementById("tile-" + slug);
      if (old) old.remove();
      let el = document.getElementById("metric-" + slug);
      if (!el) {
        el = document.createElement("div");
        el.className = "chart";
        el.id = "metric-" + slug;
        el.dataset.metric = key;
        $("#metrics").appendChild(el);
      }
      const positive = m.y.every((v) => v > 0);
      const log = positive && Math.max(...m.y) / Math.min(...m.y) > 50;
      M.chart(el, key, { title: `${key} (${m.node})${log ? " · log scale" : ""}`, time: false, fill: !log, log, height: 220,
        series: [{ label: key, color: METRIC_COLORS[i % METRIC_COLORS.length] }], data: [m.x, m.y] });
    });
  }

  function timeline(events, final) {
    const box = $("#events");
    box.innerHTML = "";
    if (!events.length) return;
    const t0 = events[0].t;
    const t1 = Math.max(events[events.length - 1].t, final ? 0 : Date.now() / 1000, t0 + 1);
    const axis = document.createElement("div");
    axis.className = "axis";
    const when = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
    for (const e of events) {
      const mark = document.createElement("span");
      mark.className = `mark ${e.kind} ${e.state || ""}`;
      mark.style.left = `${(100 * (e.t - t0)) / (t1 - t0)}%`;
      mark.title = `${when(e.t)} ${e.kind}${e.node ? " " + e.node : ""}: ${e.detail}`;
      axis.appendChild(mark);
    }
    for (const [t, left] of [[t0, 0], [t1, 100]]) {
      const tick = document.createElement("span");
      tick.className = "tick";
      tick.style.left = `${left}%`;
      tick.textContent = t === t1 && !final ? "now" : when(t);
      axis.appendChild(tick);
    }
    box.appendChild(axis);
    const list = document.createElement("ul");
    for (const e of events) {
      const li = document.createElement("li");
      const b = document.createElement("b");
      b.textContent = e.kind;
      li.appendChild(b);
      li.appendChild(document.createTextNode(
        `${when(e.t)}${e.node ? " · " + e.node : ""} · ${e.detail}`));
      list.appendChild(li);
    }
    box.appendChild(list);
  }

  function jobState(d) {
    const j = d.job;
    setPill($("#job-state"), j.state);
    text($("#job-exit"), j.exit_code == null ? "-" : j.exit_code);
    text($("#job-duration"), duration(j.duration_s));
    $("#cancel-button").hidden = !(j.current && !j.final);
    for (const n of j.nodes) {
      const tr = document.querySelector(`#job-nodes tr[data-node="${CSS.escape(n.name)}"]`);
      if (!tr) continue;
      setPill(tr.querySelector(".pill"), n.state);
      text(tr.cells[3], n.exit_code == null ? "-" : n.exit_code);
    }
    for (const l of d.logs.nodes) {
      const tr = document.querySelector(`#job-nodes tr[data-node="${CSS.escape(l.node)}"]`);
      if (!tr) continue;
      text(tr.querySelector(".lines"), l.lines);
      text(tr.querySelector(".logstate"), l.error ? l.error : l.done ? "complete"
        : l.following ? "following live" : d.logs.source === "live" ? "choose it below to follow" : "-");
    }
    metricCharts(d.metrics);
    timeline(d.events, j.final);
  }

  M.jobPage = function (cluster, id, initial) {
    const base = `/api/clusters/${enc(cluster)}/jobs/${enc(id)}`;
    const pre = $("#log");
    const select = $("#log-node");
    const follow = $("#log-follow");
    let lines = [];
    let next = 0;
    let generation = 0;

    function pollLog() {
      const mine = ++generation;
      lines = [];
      next = 0;
      pre.textContent = "";
      poll(async () => {
        if (mine !== generation) return false;
        const d = await getJSON(`${base}/log?node=${enc(select.value)}&from=${next}`);
        if (mine !== generation) return false;
        if (d.missed) lines.push(`… ${d.missed} earlier lines are not kept here …`);
        lines = lines.concat(d.lines).slice(-KEEP_LINES);
        next = d.next;
        if (d.lines.length || d.missed) {
          pre.textContent = lines.join("\n");
          if (follow.checked) pre.scrollTop = pre.scrollHeight;
        }
        text($("#log-status"), `${next} lines · ${d.error ? d.error : d.done ? "complete" : "live"}`);
        return !(d.done && !d.lines.length);
      }, 1000);
    }
    select.addEventListener("change", pollLog);
    pollLog();

    jobState(initial);
    poll(async () => {
      const d = await getJSON(base);
      jobState(d);
      return !(d.job.final && d.logs.nodes.every((n) => n.done || n.error));
    }, 2000);

    $("#cancel-button").addEventListener("click", async () => {
      const ok = await M.confirm({ title: `Cancel job ${id}?`, yes: "Cancel the job",
        body: "Every rank gets TERM, then KILL after 10 s (as `mgpu-cloud cancel`)." });
      if (!ok) return;
      $("#cancel-button").disabled = true;
      banner($("#action-result"), "", `cancelling job ${id}…`);
      const r = await post(`${base}/cancel`);
      banner($("#action-result"), r.ok ? "ok" : "bad", r.body.message || r.body.error || `HTTP ${r.status}`);
      $("#cancel-button").disabled = false;
      jobState(await getJSON(base));
    });
  };

  /* ---- cost page ------------------------------------------------------------------------- */
  M.costPage = function () {
    const el = $("#cost-chart");
    const s = JSON.parse(el.dataset.series);
    M.chart(el, "cost", { title: "Cumulative spend, USD", series: [{ label: "USD", color: "#3559e0" }],
      data: [s.t, s.usd], height: 240, fill: true, empty: "no clusters recorded yet" });
  };

  M.fmtNum = fmtNum;
})();
