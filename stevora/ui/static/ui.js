// Small progressive enhancements; every page works without them.
(function () {
  "use strict";
  // Filters apply as soon as a select changes.
  document.querySelectorAll("select.js-autosubmit").forEach(function (select) {
    select.addEventListener("change", function () { select.form.submit(); });
  });
  // Destructive buttons ask first.
  document.querySelectorAll("button.js-confirm").forEach(function (button) {
    button.addEventListener("click", function (event) {
      if (!window.confirm(button.dataset.confirm || "Are you sure?")) event.preventDefault();
    });
  });
  // JSON editors say at once whether their text is a JSON object (the server checks again).
  document.querySelectorAll("textarea.json-editor").forEach(function (area) {
    var status = document.getElementById(area.dataset.status);
    function check() {
      var text = area.value.trim();
      var message = "";
      if (text) {
        try {
          var value = JSON.parse(text);
          if (value === null || typeof value !== "object" || Array.isArray(value)) message = "must be a JSON object";
        } catch (error) { message = "not valid JSON: " + error.message; }
      }
      area.setAttribute("aria-invalid", message ? "true" : "false");
      if (status) {
        status.textContent = message ? "input: " + message : "✓ a JSON object";
        status.className = "small json-status " + (message ? "json-bad" : "json-ok");
      }
    }
    area.addEventListener("input", check);
    check();
  });
  // The runs list refreshes itself while the tab is visible (server-rendered fragment).
  var live = document.getElementById("runs-live");
  if (live && live.dataset.src) {
    var busy = false;
    window.setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch(live.dataset.src, { credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.status === 401) { window.location.reload(); return null; }
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          if (html !== null && html !== live.innerHTML) {
            live.innerHTML = html;
            live.dataset.refreshed = String((Number(live.dataset.refreshed) || 0) + 1);
          }
        })
        .catch(function () { /* the next tick retries */ })
        .then(function () { busy = false; });
    }, Number(live.dataset.intervalMs) || 3000);
  }
})();
