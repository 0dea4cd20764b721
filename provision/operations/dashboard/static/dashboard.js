/* mgpu-cloud dashboard: charts (uPlot, vendored), polling of the JSON twins, the two buttons.
   Every chart is also in window.mgpuCharts[name] (tests read its data). No build step. */
(function () {
  "use strict";
  const M = (window.MGPU = {});
  const charts = (window.mgpuCharts = {});
  const enc = encodeURIComponent;
  const $ = (sel) => document.querySelector(sel);

  M.color = (i) => `hsl(${(i * 137.508) % 360}, 62%, 46%)`;

  function csrf() {
    return document.querySelector('meta[name="csrf-token"]').content;
  }

  async function getJSON(url) {
    const r = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || `${url}: HTTP ${r.status}`);
    return body;
  }

  async function post(url) {
    const r = await fetch(url, { method: "POST", headers: { "X-CSRF-Token": csrf() } });
    const body = await r.json().catch(() => ({}));
    return { ok: r.ok, status: r.status, body };
  }

  /* fn() now, then again `ms` after it finished, until it returns false. */
  function poll(fn, ms) {
    async function tick() {
      let again = true;
      try {
        again = (await fn()) !== false;
      } catch (e) {
        console.warn(e);
      }
      if (again) setTimeout(tick, ms);
    }
    tick();
  }

  function text(el, value) {
    if (el && el.textContent !== String(value)) el.textContent = value;
  }

  function setPill(el, state, label) {
    if (!el) return;
    el.className = `pill ${state}`;
    text(el, label === undefined ? state : label);
  }

  /* ---- charts ---------------------------------------------------------------------------- */
  function fmtNum(v) {
    if (v == null) return "-";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(2).replace(/\.?0+$/, "");
    return v.toPrecision(2);
  }

  function translucent(color) {
    if (color.startsWith("#")) return color + "1a";
    return color.replace("hsl(", "hsla(").replace(")", ", 0.1)");
  }

  /* The y axis; on a log scale ticks, grid lines and labels at powers of ten only. */
  function yAxis(axis, log) {
    const y = { ...axis, size: 52, values: (u, vals) => vals.map(fmtNum) };
    if (!log) return y;
    const decades = (u, splits) => splits.map((v) => (
      Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-9 ? v : null));
    return { ...y, filter: decades, grid: { ...axis.grid, filter: decades },
             ticks: { ...axis.ticks, filter: decades } };
  }

  /* Create or update chart `key` in `el`: series [{label, color}], data uPlot-aligned. */
  M.chart = function (el, key, opts) {
    const points = opts.data[0] ? opts.data[0].length : 0;
    let holder = el.querySelector(".chart-title");
    if (!holder) {
      holder = document.createElement("div");
      holder.className = "chart-title";
      el.appendChild(holder);
    }
    text(holder, opts.title);
    let empty = el.querySelector(".chart-empty");
    if (!points) {
      if (!empty) {
        empty = document.createElement("div");
        empty.className = "chart-empty";
        el.appendChild(empty);
      }
      text(empty, opts.empty || "no data yet");
      return null;
    }
    if (empty) empty.remove();
    let u = charts[key];
    if (u && (u.series.length !== opts.series.length + 1 || !el.contains(u.root)
              || (u.scales.y.distr === 3) !== !!opts.log)) {
      u.destroy();
      u = null;
    }
    if (u) {
      const width = Math.max(200, el.clientWidth - 10);
      if (Math.abs(u.width - width) > 2) u.setSize({ width, height: u.height });
      u.setData(opts.data);
      return u;
    }
    const axis = { stroke: "#6b778a", grid: { stroke: "#eef1f5", width: 1 },
                   ticks: { stroke: "#e3e8ef", width: 1 } };
    u = new uPlot({
      width: Math.max(200, el.clientWidth - 10),
      height: opts.height || 180,
      scales: { x: { time: opts.time !== false }, y: opts.log ? { distr: 3 } : {} },
      legend: { show: !!opts.legend },
      cursor: { drag: { x: true, y: false } },
      axes: [axis, yAxis(axis, !!opts.log)],
      series: [{}].concat(opts.series.map((s) => ({
        label: s.label, stroke: s.color, width: 1.6, spanGaps: true,
        fill: opts.fill ? translucent(s.color) : undefined,
        points: { show: points < 40, size: 5 },
      }))),
    }, opts.data, el);
    charts[key] = u;
    return u;
  };

  window.addEventListener("resize", () => {
    for (const u of Object.values(charts)) {
      const el = u.root.parentElement;
      if (el) u.setSize({ width: Math.max(200, el.clientWidth - 10), height: u.height });
    }
  });

  /* ---- confirmation dialog --------------------------------------------------------------- */
  M.confirm = function ({ title, body, yes, word }) {
    const dlg = $("#confirm");
    text($("#confirm-title"), title);
    text($("#confirm-text"), body);
    text($("#confirm-yes"), yes);
    const typed = $("#confirm-input");
    $("#confirm-type").hidden = !word;
    typed.value = "";
    text($("#confirm-word"), word || "");
    $("#confirm-yes").disabled = !!word;
    typed.oninput = () => { $("#confirm-yes").disabled = typed.value.trim() !== word; };
    dlg.returnValue = "";
    dlg.showModal();
    if (word) typed.focus();
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "yes"), { once: true });
    });
  };

  function banner(el, cls, message) {
    el.hidden = false;
    el.className = `banner ${cls}`;
    text(el, message);
  }

  window.MGPU_PARTS = { getJSON, post, poll, text, setPill, banner, fmtNum, enc, $ };
})();
