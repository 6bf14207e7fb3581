"use strict";
// The dashboard's own script (issue 36): optional. Every page and form works without it.
// - times: <time datetime="ISO"> shown in the browser's zone, or UTC after the header's
//   toggle (remembered in localStorage);
// - "/" focuses the search box (#jump), unless the focus is in a field already;
// - live pages (<main data-live>) are refreshed by htmx (hx-trigger on <main>) with a
//   morphing swap (idiomorph), paused while the tab is hidden;
// - the overview with the "live" refresh choice ([data-live-stream]) morphs in the events of
//   its server-sent-events stream (htmx-ext-sse); the stream is closed while the tab is hidden
//   and opened again when it shows;
// - the header's Refresh choice is applied on change; "updated N s ago" says how old the
//   live content is;
// - a chart with a data island (<div data-uplot>) is drawn with uPlot over its SVG fallback.
(function () {
  document.documentElement.classList.add("js");
  var KEY = "ship-dashboard-utc";
  function utc() {
    try { return localStorage.getItem(KEY) === "1"; } catch (e) { return false; }
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function fmt(d, inUtc) {
    if (inUtc) {
      return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) +
        " " + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
    }
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  function times(root) {
    var inUtc = utc();
    var all = (root || document).querySelectorAll("time[datetime]");
    for (var i = 0; i < all.length; i++) {
      var d = new Date(all[i].getAttribute("datetime"));
      if (!isNaN(d.getTime())) {
        all[i].textContent = fmt(d, inUtc);
        all[i].title = fmt(d, !inUtc);
      }
    }
    var toggle = document.getElementById("tz-toggle");
    if (toggle) { toggle.textContent = inUtc ? "Times: UTC" : "Times: local"; }
  }
  function charts(root) {
    if (typeof uPlot === "undefined") { return; }
    var hosts = (root || document).querySelectorAll("[data-uplot]");
    for (var i = 0; i < hosts.length; i++) {
      var host = hosts[i];
      var island = document.getElementById(host.getAttribute("data-uplot"));
      if (!island || host.getAttribute("data-drawn") === island.textContent.length + "") { continue; }
      var spec = JSON.parse(island.textContent);
      host.textContent = "";
      // Stacked bars: series k is drawn at the sum of series 0..k, the tallest first, so the
      // first series is the bottom band and each next one sits on it; the legend (and the
      // hover values) show each series' own count.
      var n = spec.series.length, data = [spec.data[0]], series = [{}];
      for (var k = 0; k < n; k++) {
        var sums = spec.data[1].map(function (_, j) {
          var total = 0;
          for (var m = 0; m <= k; m++) { total += spec.data[m + 1][j]; }
          return total;
        });
        data.push(sums);
        series.push({ label: spec.series[k].label, stroke: spec.series[k].color,
          fill: spec.series[k].color, points: { show: false },
          value: (function (own) { return function (u, v, si, i) { return i == null ? "--" : own[i]; }; })(spec.data[k + 1]),
          paths: uPlot.paths.bars({ size: [0.8] }) });
      }
      // The tallest band (the sum of all) is drawn first: reverse the order of drawing.
      data = [data[0]].concat(data.slice(1).reverse());
      series = [series[0]].concat(series.slice(1).reverse());
      new uPlot({ width: Math.min(host.clientWidth || 720, 760), height: 180, series: series,
        tzDate: utc() ? function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); } : undefined },
        data, host);
      host.setAttribute("data-drawn", island.textContent.length + "");
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    times(document);
    charts(document);
    var toggle = document.getElementById("tz-toggle");
    if (toggle) {
      toggle.addEventListener("click", function () {
        try { localStorage.setItem(KEY, utc() ? "0" : "1"); } catch (e) {}
        times(document);
      });
    }
  });
  document.addEventListener("keydown", function (e) {
    if (e.key !== "/" || e.ctrlKey || e.metaKey || e.altKey) { return; }
    var t = e.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) { return; }
    var box = document.getElementById("jump");
    if (box) { e.preventDefault(); box.focus(); box.select(); }
  });
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (document.hidden && e.detail && e.detail.elt && e.detail.elt.hasAttribute("data-live")) {
      e.preventDefault();
    }
  });
  var updatedAt = Date.now();
  function stamp() {
    var out = document.getElementById("live-stamp");
    if (!out || !document.querySelector("main[data-live], [data-live-stream]")) { return; }
    out.textContent = "updated " + Math.max(0, Math.round((Date.now() - updatedAt) / 1000)) + " s ago";
  }
  document.addEventListener("DOMContentLoaded", function () {
    var choice = document.getElementById("refresh-every");
    if (choice && choice.hasAttribute("data-autosubmit")) {
      choice.addEventListener("change", function () { choice.form.submit(); });
    }
    stamp();
    window.setInterval(stamp, 1000);
  });
  document.addEventListener("visibilitychange", function () {
    var live = document.querySelector("[data-live-stream]");
    if (!live) { return; }
    var data = live["htmx-internal-data"];
    if (document.hidden) {
      if (data && data.sseEventSource) { data.sseEventSource.close(); }
    } else if (typeof htmx !== "undefined") {
      // A changed attribute makes htmx process the element again: htmx-ext-sse connects anew.
      live.setAttribute("data-shown-at", String(Date.now()));
      htmx.process(live);
    }
  });
  document.addEventListener("htmx:afterSettle", function (e) {
    times(e.target);
    charts(e.target);
    // A failed live reading swaps in the last good content under #live-problem: not newer.
    if (!(e.target.querySelector && e.target.querySelector("#live-problem"))) {
      updatedAt = Date.now();
    }
    stamp();
  });
})();
