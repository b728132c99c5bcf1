// leaseq dashboard: live numbers on the overview, and a confirmation before a destructive
// button. No inline script anywhere (the Content-Security-Policy forbids it); job data is
// only ever set with textContent, never parsed as HTML.
(function () {
  "use strict";
  var root = document.body.getAttribute("data-root") || "";
  var POLL_MS = 5000;

  function update(rows) {
    rows.forEach(function (row) {
      var tr = document.querySelector('tr[data-queue="' + CSS.escape(row.queue) + '"]');
      if (!tr) { return; }
      var values = Object.assign({}, row.counts, {
        ready: row.ready, oldest_ready_s: row.oldest_ready_s,
        held_by_key: row.held_by_key, held_by_rate: row.held_by_rate,
        done_last_hour: row.done_last_hour, failed_last_hour: row.failed_last_hour
      });
      tr.querySelectorAll("td[data-field]").forEach(function (td) {
        var v = values[td.getAttribute("data-field")];
        // null: a queue without limits, which holds nothing back ("—", as the page says).
        td.textContent = v === undefined ? "0" : v === null ? "\u2014" : String(v);
      });
    });
  }

  function setStatus(text) {
    var el = document.getElementById("live-status");
    if (el) { el.textContent = text; }
  }

  // Server-sent events while the tab is visible; closed while hidden (no cost for a
  // background tab); polling when the stream cannot be had (a proxy that buffers it).
  var source = null, timer = null, polling = false;

  function poll() {
    fetch(root + "/api/stats", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : []; })
      .then(update).catch(function () { setStatus("offline"); });
  }

  function start() {
    if (document.hidden) { return; }
    if (polling || !window.EventSource) {
      polling = true;
      setStatus("live (polling)");
      poll();
      timer = window.setInterval(poll, POLL_MS);
      return;
    }
    source = new EventSource(root + "/events");
    source.onmessage = function (e) { setStatus("live"); update(JSON.parse(e.data)); };
    source.onerror = function () { stop(); polling = true; start(); };
  }

  function stop() {
    if (source) { source.close(); source = null; }
    if (timer) { window.clearInterval(timer); timer = null; }
    setStatus("paused");
  }

  if (document.getElementById("overview")) {
    document.addEventListener("visibilitychange", function () {
      if (document.hidden) { stop(); } else { start(); }
    });
    start();
  }

  document.querySelectorAll("button.confirm").forEach(function (button) {
    button.addEventListener("click", function (e) {
      if (!window.confirm(button.textContent.trim() + "?")) { e.preventDefault(); }
    });
  });
})();
