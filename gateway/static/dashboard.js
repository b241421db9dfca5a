/* gymserve dashboard: polls /dashboard/data and draws it with uPlot (served next to this file). */
(function () {
  "use strict";

  var PALETTE = ["#0969da", "#bf3989", "#1a7f37", "#bc4c00", "#8250df", "#1b7c83", "#9a6700", "#cf222e",
                 "#57606a", "#6639ba"];
  var REFRESH_MS = 1000 * Math.max(1, Number(document.body.getAttribute("data-refresh-s")) || 5);
  var charts = {};   // key -> {plot, sig, el, height}
  var colors = {};   // series name -> colour, stable while the page lives

  function colorOf(name) {
    if (!(name in colors)) colors[name] = PALETTE[Object.keys(colors).length % PALETTE.length];
    return colors[name];
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || (typeof v === "number" && !isFinite(v))) return "\u2013";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    return String(Number(v.toPrecision(digits || 4)));
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  }

  /* A number shown as text; data-value keeps the exact value for tools and tests. */
  function valueNode(tag, field, value, digits) {
    var node = el(tag, {"data-field": field, text: fmt(value, digits)});
    node.setAttribute("data-value", value === null || value === undefined ? "" : String(value));
    return node;
  }

  function widthOf(node) { return Math.max(260, Math.floor(node.getBoundingClientRect().width) - 4); }

  /* Draw or update the chart `key` inside `container`; rebuilt only when its series change. */
  function chart(key, container, sig, makeOpts, data, height) {
    var have = charts[key];
    if (have && have.sig === sig && have.el === container && document.body.contains(container)) {
      have.plot.setData(data);
      return have.plot;
    }
    if (have) have.plot.destroy();
    container.textContent = "";
    var opts = makeOpts(widthOf(container), height);
    opts.hooks = {draw: [describeDrawing]};
    var plot = new uPlot(opts, data, container);
    charts[key] = {plot: plot, sig: sig, el: container, height: height};
    return plot;
  }

  /* After each draw, the chart's container says what it drew: `data-points` (non-null values of
     its series) and `data-x-labels` (each line of each x tick label: text, left and right pixel
     edge, line number), so a
     reader of the DOM (a test, a tool) can check a chart has data and its labels do not overlap. */
  function describeDrawing(u) {
    var points = 0;
    for (var s = 1; s < u.data.length; s++) {
      (u.data[s] || []).forEach(function (v) { if (v !== null && v !== undefined) points++; });
    }
    var axis = u.axes[0], labels = [];
    var ctx = u.ctx;
    ctx.save();
    ctx.font = (Array.isArray(axis.font) ? axis.font[0] : axis.font) || "12px system-ui";
    var dpr = (typeof uPlot.pxRatio === "number" ? uPlot.pxRatio : window.devicePixelRatio) || 1;
    (axis._splits || []).forEach(function (split, i) {
      var text = (axis._values || [])[i];
      if (text === null || text === undefined || text === "") return;
      var x = u.valToPos(split, "x");
      String(text).split("\n").forEach(function (line, row) {  // time labels have a second line (the date)
        var w = ctx.measureText(line).width / dpr;
        labels.push([line, Math.round((x - w / 2) * 10) / 10, Math.round((x + w / 2) * 10) / 10, row]);
      });
    });
    ctx.restore();
    u.root.parentNode.setAttribute("data-points", String(points));
    u.root.parentNode.setAttribute("data-x-labels", JSON.stringify(labels));
  }

  /* `unitRange`: the y axis always shows [0, 1] (rewards), so small wiggles do not look like trends. */
  /* uPlot's points filter: draw a series' points where it has few of them (or isolated ones). */
  function sparse(u, si) {
    var values = u.data[si] || [], shown = 0;
    for (var i = 0; i < values.length; i++) if (values[i] !== null && values[i] !== undefined) shown++;
    return shown <= 30;
  }

  function lineOpts(series, yLabel, timeAxis, unitRange) {
    return function (width, height) {
      var y = unitRange ? {range: function (u, min, max) {
        return [Math.min(0, min === null ? 0 : min), Math.max(1, max === null ? 1 : max)];
      }} : {};
      return {
        width: width, height: height,
        scales: {x: {time: timeAxis}, y: y},
        legend: {live: true},
        cursor: {drag: {x: false, y: false}},
        axes: [{stroke: "#59636e", grid: {stroke: "#eaeef2"}},
               {label: yLabel, stroke: "#59636e", grid: {stroke: "#eaeef2"}, size: 56}],
        series: [{label: timeAxis ? "time" : "step"}].concat(series.map(function (s) {
          // points on sparse time series too: a run shorter than two samples still shows its dot
          return {label: s.label, stroke: s.color, width: 2, dash: s.dash, spanGaps: !timeAxis,
                  points: {show: timeAxis ? sparse : true, size: 5}, value: function (u, v) { return fmt(v); }};
        }))
      };
    };
  }

  function barOpts(labels, color, yLabel) {
    var n = labels.length;
    return function (width, height) {
      var longest = Math.max.apply(null, labels.map(function (l) { return l.length; }));
      var every = Math.max(1, Math.ceil(n * (longest * 6.5 + 10) / Math.max(1, width - 70)));
      return {
        width: width, height: height,
        scales: {x: {time: false, range: function () { return [-0.5, n - 0.5]; }},
                 y: {range: function (u, min, max) { return [0, Math.max(1, max) * 1.12]; }}},
        legend: {live: true},
        cursor: {drag: {x: false, y: false}},
        axes: [{stroke: "#59636e", grid: {show: false},
                splits: function () { return labels.map(function (_, i) { return i; }); },
                values: function (u, splits) { return splits.map(function (i) { return i % every ? "" : labels[i]; }); }},
               {label: yLabel, stroke: "#59636e", grid: {stroke: "#eaeef2"}, size: 56}],
        series: [{label: "bin", value: function (u, i) { return i === null ? "\u2013" : labels[i]; }},
                 {label: "count", stroke: color, fill: color + "cc", width: 1,
                  paths: uPlot.paths.bars({size: [0.86, 80]}), points: {show: false}}]
      };
    };
  }

  /* Bins are (lo, hi]; the open-ended outer bins have lo or hi null. The first bin drawn holds
     every reward at or below its upper edge (empty bins below it are left out), so it reads "\u22640"
     where rewards of 0 are, not "-0.25\u20130". */
  function binLabel(b, i) {
    if (b.lo === null || i === 0) return "\u2264" + fmt(b.hi);
    if (b.hi === null) return ">" + fmt(b.lo);
    return fmt(b.lo) + "\u2013" + fmt(b.hi);
  }

  function card(key, title, extra) {
    var node = el("div", {"class": "card", "data-card": key});
    node.appendChild(el("h3", {}, [el("span", {text: title})].concat(extra || [])));
    return node;
  }

  function lastValue(values) {
    for (var i = (values || []).length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
    return null;
  }

  /* Keep one child per key in `parent`, in order; returns the (possibly reused) nodes. */
  function syncChildren(parent, keys, attr, make) {
    var existing = {};
    Array.prototype.forEach.call(parent.children, function (c) {
      var k = c.getAttribute(attr);
      if (k !== null) existing[k] = c;
    });
    var nodes = keys.map(function (k) { return existing[k] || make(k); });
    parent.textContent = "";
    nodes.forEach(function (n) { parent.appendChild(n); });
    return nodes;
  }

  function renderEnvironments(data) {
    var root = document.getElementById("environments");
    var envs = data.environments;
    if (!envs.length) {
      root.textContent = "";
      root.appendChild(el("p", {"class": "empty", text: "no resource servers registered"}));
      return;
    }
    var t = data.timeline.t;
    var cards = syncChildren(root, envs.map(function (e) { return e.name; }), "data-env", function (name) {
      var node = el("div", {"class": "card env", "data-env": name});
      node.appendChild(el("h3", {}, [el("span", {text: name}), el("span", {"class": "pill"}),
                                     el("span", {"class": "muted kind"})]));
      node.appendChild(el("div", {"class": "stats"}));
      node.appendChild(el("div", {"class": "chart-title", text: "reward distribution (every judged reply since the server started)"}));
      node.appendChild(el("div", {"class": "chart", "data-chart": "reward-histogram"}));
      node.appendChild(el("div", {"class": "chart-title", text: "mean reward over time"}));
      node.appendChild(el("div", {"class": "chart", "data-chart": "reward-mean"}));
      node.appendChild(el("div", {"class": "chips", "data-field": "failures_by_kind"}));
      return node;
    });
    envs.forEach(function (env, i) {
      var node = cards[i];
      var pill = node.querySelector(".pill");
      pill.className = "pill " + (env.health || "");
      pill.textContent = env.health || "?";
      node.querySelector(".kind").textContent = env.kind || "";
      var series = data.timeline.servers[env.name] || {};
      var stats = node.querySelector(".stats");
      stats.textContent = "";
      [["rewards_total", env.rewards_total, "judged"], ["reward_mean", env.reward_mean, "mean reward"],
       ["reward_mean_recent", lastValue(series.reward_mean), "mean, last minute"],
       ["masked_total", env.masked_total, "masked"]].concat(env.judge ? [
        ["judge.calls", env.judge.calls || 0, "judge calls"], ["judge.cache_hits", env.judge.cache_hits || 0,
         "judge cache hits"], ["judge.failures", env.judge.failures || 0, "judge failures"]] : []).forEach(function (s) {
        stats.appendChild(el("div", {"class": "stat"}, [valueNode("b", s[0], s[1]), el("span", {text: s[2]})]));
      });
      var bins = env.histogram;
      var labels = bins.map(function (b, j) { return binLabel(b, j); });
      var histHost = node.querySelector('[data-chart="reward-histogram"]');
      if (bins.length) {
        chart("hist:" + env.name, histHost, "hist:" + labels.join("|"), barOpts(labels, colorOf(env.name), "replies"),
              [bins.map(function (_, j) { return j; }), bins.map(function (b) { return b.count; })], 170);
      } else {
        if (charts["hist:" + env.name]) { charts["hist:" + env.name].plot.destroy(); delete charts["hist:" + env.name]; }
        histHost.textContent = "";
        histHost.appendChild(el("p", {"class": "empty", text: "no judged replies yet"}));
      }
      chart("mean:" + env.name, node.querySelector('[data-chart="reward-mean"]'), "mean",
            lineOpts([{label: "mean reward (last minute)", color: colorOf(env.name)}], "reward", true, true),
            [t, series.reward_mean || t.map(function () { return null; })], 150);
      var chips = node.querySelector(".chips");
      chips.textContent = "";
      var kinds = Object.keys(env.failures_by_kind);
      if (!kinds.length) chips.appendChild(el("span", {"class": "chip", text: "no masked failures"}));
      kinds.forEach(function (k) {
        var chip = el("span", {"class": "chip bad", "data-kind": k}, [el("span", {text: k + " "}),
                      valueNode("b", "failures." + k, env.failures_by_kind[k])]);
        chips.appendChild(chip);
      });
    });
  }

  function renderTraffic(data) {
    var root = document.getElementById("traffic");
    var t = data.timeline.t;
    var names = Object.keys(data.timeline.servers).sort();
    var nodes = syncChildren(root, ["rates", "latency"], "data-card", function (key) {
      var node = card(key, key === "rates" ? "requests per second" : "latency p50 (solid) and p99 (dashed), ms");
      node.appendChild(el("div", {"class": "chart", "data-chart": key}));
      return node;
    });
    var sig = names.join("|");
    var rates = names.map(function (n) { return data.timeline.servers[n].requests_per_s; });
    chart("rates", nodes[0].querySelector(".chart"), sig,
          lineOpts(names.map(function (n) { return {label: n, color: colorOf(n)}; }), "req/s", true),
          [t].concat(rates), 220);
    var lat = [], latSeries = [];
    names.forEach(function (n) {
      lat.push(data.timeline.servers[n].latency_p50_ms, data.timeline.servers[n].latency_p99_ms);
      latSeries.push({label: n + " p50", color: colorOf(n)}, {label: n + " p99", color: colorOf(n), dash: [6, 4]});
    });
    chart("latency", nodes[1].querySelector(".chart"), sig, lineOpts(latSeries, "ms", true), [t].concat(lat), 220);
  }

  function renderFailures(data) {
    var root = document.getElementById("failures");
    var kinds = data.failure_kinds;
    var rows = data.servers.filter(function (r) { return r.server_type !== "responses_api_models" || r.failures_total; });
    var head = el("tr", {}, [el("th", {text: "server"})].concat(
      kinds.map(function (k) { return el("th", {text: k}); }), [el("th", {text: "total"})]));
    var body = el("tbody", {}, rows.map(function (r) {
      var by = r.failures_by_kind || {};
      var cells = [el("td", {text: r.name})].concat(kinds.map(function (k) {
        var td = valueNode("td", "failures." + k, by[k] || 0);
        td.setAttribute("data-kind", k);
        return td;
      }), [valueNode("td", "failures_total", r.failures_total === undefined ? null : r.failures_total)]);
      return el("tr", {"data-server": r.name}, cells);
    }));
    root.textContent = "";
    root.appendChild(el("table", {"id": "failures-table"}, [el("thead", {}, [head]), body]));
  }

  function renderServers(data) {
    var tbody = document.querySelector("#servers tbody");
    var columns = data.columns;
    tbody.textContent = "";
    if (!data.servers.length) {
      tbody.appendChild(el("tr", {}, [el("td", {colspan: String(columns.length), text: "no servers registered"})]));
    }
    data.servers.forEach(function (r) {
      var tr = el("tr", {"data-server": r.name});
      columns.forEach(function (c) {
        var field = c[1], td;
        if (field === "url") {
          td = el("td", {"data-field": field}, [el("a", {href: r.url || "", text: r.url || ""})]);
        } else {
          td = valueNode("td", field, r[field] === undefined ? null : r[field]);
          if (field === "health") {
            td.className = "health";
            td.style.color = {ready: "#1a7f37", starting: "#9a6700", down: "#cf222e"}[r.health] || "#57606a";
          }
        }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
  }

  function renderTraining(data) {
    var section = document.getElementById("training");
    var tr = data.training;
    if (!tr || !tr.steps.length) { section.hidden = true; return; }
    section.hidden = false;
    document.getElementById("training-run").textContent = "run " + tr.run +
      (tr.runs.length > 1 ? " (latest of " + tr.runs.length + ")" : "") + ", " + tr.steps.length + " steps";
    var steps = tr.steps.map(function (s) { return s.step; });
    function keysOf(field) {
      var seen = {};
      tr.steps.forEach(function (s) { Object.keys(s[field] || {}).forEach(function (k) { seen[k] = 1; }); });
      return Object.keys(seen).sort();
    }
    function column(field, name) {
      return tr.steps.map(function (s) { var v = (s[field] || {})[name]; return v === undefined ? null : v; });
    }
    var names = keysOf("reward_components");
    var envs = keysOf("env_rewards");
    var rewardSeries = [{label: "reward", color: "#0969da"}].concat(envs.map(function (n, i) {
      return {label: n, color: PALETTE[(i + 1) % PALETTE.length]};
    })).concat(names.map(function (n, i) {
      return {label: n, color: PALETTE[(i + envs.length + 2) % PALETTE.length], dash: [5, 3]};
    }));
    var rewardData = [steps, tr.steps.map(function (s) { return s.reward; })]
      .concat(envs.map(function (n) { return column("env_rewards", n); }))
      .concat(names.map(function (n) { return column("reward_components", n); }));
    var mismatch = keysOf("mismatch");
    var root = document.getElementById("training-charts");
    var hasLoss = tr.steps.some(function (s) { return s.loss !== null; });
    var keys = ["train-reward", "train-kl"].concat(hasLoss ? ["train-loss"] : [])
      .concat(mismatch.length ? ["train-mismatch"] : []);
    var nodes = syncChildren(root, keys, "data-card", function (key) {
      var node = card(key, {"train-reward": "reward by step", "train-kl": "KL to the reference policy by step",
                            "train-loss": "loss by step", "train-mismatch": "sampler/trainer mismatch by step"}[key]);
      node.appendChild(el("div", {"class": "chart", "data-chart": key}));
      return node;
    });
    chart("train-reward", nodes[0].querySelector(".chart"), "r:" + envs.join("|") + ":" + names.join("|"),
          lineOpts(rewardSeries, "reward", false, true), rewardData, 220);
    chart("train-kl", nodes[1].querySelector(".chart"), "kl", lineOpts([{label: "kl", color: "#bf3989"}], "KL", false),
          [steps, tr.steps.map(function (s) { return s.kl; })], 220);
    if (hasLoss) {
      chart("train-loss", nodes[2].querySelector(".chart"), "loss", lineOpts([{label: "loss", color: "#bc4c00"}], "loss", false),
            [steps, tr.steps.map(function (s) { return s.loss; })], 220);
    }
    if (mismatch.length) {
      chart("train-mismatch", nodes[keys.length - 1].querySelector(".chart"), "m:" + mismatch.join("|"),
            lineOpts(mismatch.map(function (n, i) { return {label: n, color: PALETTE[i % PALETTE.length]}; }), "mismatch", false),
            [steps].concat(mismatch.map(function (n) { return column("mismatch", n); })), 220);
    }
  }

  function render(data) {
    document.getElementById("ready-count").textContent = data.ready + "/" + data.total;
    var when = new Date(data.generated_at * 1000);
    document.getElementById("updated").textContent = "sampled " + when.toLocaleTimeString();
    document.body.setAttribute("data-generated-at", String(data.generated_at));
    renderTraining(data);
    renderEnvironments(data);
    renderTraffic(data);
    renderFailures(data);
    renderServers(data);
  }

  function refresh() {
    fetch("/dashboard/data", {cache: "no-store", credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (data) { render(data); document.body.setAttribute("data-state", "ok"); })
      .catch(function (err) {
        document.body.setAttribute("data-state", "error");
        document.getElementById("updated").textContent = "update failed: " + err.message;
      })
      .then(function () { setTimeout(refresh, REFRESH_MS); });
  }

  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (k) {
      var c = charts[k];
      if (document.body.contains(c.el)) c.plot.setSize({width: widthOf(c.el), height: c.height});
    });
  });
  refresh();
})();
