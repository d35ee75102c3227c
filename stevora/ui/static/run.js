// Live run page: listen to the run's events (SSE, cookie-authenticated) and, on each one,
// re-fetch the server-rendered body and swap it in. Open <details> stay open across swaps.
(function () {
  "use strict";
  var root = document.getElementById("run-live");
  if (!root || !window.EventSource) return;
  var TERMINAL = { COMPLETED: true, FAILED: true, CANCELLED: true };
  var source = null;
  var inflight = false;
  var again = false;
  var timer = null;
  var fallback = null;

  function isTerminal() { return TERMINAL[root.dataset.status] === true; }

  function openKeys() {
    var keys = [];
    root.querySelectorAll("details[data-key]").forEach(function (d) { if (d.open) keys.push(d.dataset.key); });
    return keys;
  }

  // What someone is typing into an answer form survives a swap, as open <details> do.
  function typedValues() {
    var values = {};
    root.querySelectorAll("textarea[data-key], input[data-key]").forEach(function (f) {
      if (f.value) values[f.dataset.key] = f.value;
    });
    return values;
  }

  function swap(html) {
    var keep = openKeys();
    var typed = typedValues();
    var focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : null;
    root.innerHTML = html;
    keep.forEach(function (key) {
      var d = root.querySelector('details[data-key="' + CSS.escape(key) + '"]');
      if (d) d.open = true;
    });
    Object.keys(typed).forEach(function (key) {
      var f = root.querySelector('[data-key="' + CSS.escape(key) + '"]');
      if (f) f.value = typed[key];
    });
    if (focused) {
      var target = root.querySelector('[data-key="' + CSS.escape(focused) + '"]');
      if (target) target.focus();
    }
    var header = root.querySelector("[data-run-status]");
    if (header) {
      root.dataset.status = header.dataset.runStatus;
      document.title = document.title.replace(/ · [A-Z]+ · /, " · " + root.dataset.status + " · ");
    }
    if (isTerminal()) stop();
  }

  function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    fetch(root.dataset.fragment, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 401) { window.location.reload(); return null; }
        return response.ok ? response.text() : null;
      })
      .then(function (html) { if (html !== null) swap(html); })
      .catch(function () { /* a later event or the fallback poll retries */ })
      .then(function () {
        inflight = false;
        if (again) { again = false; schedule(); }
      });
  }

  // Events arrive in bursts (a tool round writes several); one re-render per burst is enough.
  function schedule() {
    if (timer !== null) return;
    timer = window.setTimeout(function () { timer = null; refresh(); }, 120);
  }

  function stop() {
    if (source) { source.close(); source = null; }
    if (fallback !== null) { window.clearInterval(fallback); fallback = null; }
  }

  function start() {
    var url = root.dataset.stream + "?after=" + encodeURIComponent(root.dataset.lastSeq || "0");
    source = new EventSource(url);
    (root.dataset.eventTypes || "").split(",").forEach(function (type) {
      if (type) source.addEventListener(type, function (event) {
        if (event.lastEventId) root.dataset.lastSeq = event.lastEventId;
        root.dataset.eventsSeen = String((Number(root.dataset.eventsSeen) || 0) + 1);
        schedule();
      });
    });
    source.addEventListener("message", schedule);
    source.addEventListener("end", function () { stop(); refresh(); });
    // Event types this page does not know still change the run; a slow poll catches them.
    fallback = window.setInterval(refresh, 10000);
  }

  if (!isTerminal()) start();
})();
