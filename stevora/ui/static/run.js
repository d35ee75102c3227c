// Live run page: listen to the run's events (SSE, cookie-authenticated) and, on each one,
// re-fetch the server-rendered body and swap it in. Open <details> stay open across swaps.
// A streamed model call's text (llm.text.delta) is shown as it grows under its running step.
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
    showLive();
    if (isTerminal()) stop();
  }

  // Live text of streamed model calls, by step run: {round, parts: {offset: text}}. Deltas are
  // ephemeral; the call's stored LLM_CALL_COMPLETED / _FAILED ends its live text (the re-render
  // then shows the stored answer in its place).
  var live = {};

  function showLive() {
    root.querySelectorAll("[data-live-step]").forEach(function (box) {
      var entry = live[box.dataset.liveStep];
      var text = "";
      if (entry) {
        Object.keys(entry.parts).map(Number).sort(function (a, b) { return a - b; })
          .forEach(function (offset) { text += entry.parts[offset]; });
      }
      box.querySelector(".message-text").textContent = text;
      box.hidden = text === "";
    });
  }

  function onDelta(event) {
    var delta;
    try { delta = JSON.parse(event.data); } catch (e) { return; }
    var entry = live[delta.stepRunId];
    if (!entry || entry.round !== delta.round) entry = live[delta.stepRunId] = { round: delta.round, parts: {} };
    entry.parts[delta.offset] = delta.text;
    showLive();
  }

  function endLive(event) {
    var stored;
    try { stored = JSON.parse(event.data); } catch (e) { return; }
    var entry = live[stored.stepRunId];
    if (entry && stored.payload && entry.round === stored.payload.round) delete live[stored.stepRunId];
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
    source.addEventListener("llm.text.delta", onDelta);
    (root.dataset.eventTypes || "").split(",").forEach(function (type) {
      if (type) source.addEventListener(type, function (event) {
        if (type === "LLM_CALL_COMPLETED" || type === "LLM_CALL_FAILED") endLive(event);
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
