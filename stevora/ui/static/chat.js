// Chat page: while a turn runs, show its model's text as it streams (the run page's own SSE
// stream, cookie-authenticated), and reload the page once the turn's run has ended.
(function () {
  "use strict";
  var root = document.getElementById("chat");
  if (!root || !window.EventSource) return;
  var runId = root.dataset.activeRun;
  if (!runId) return;
  var text = document.getElementById("live-text");
  var source = new EventSource("/ui/runs/" + encodeURIComponent(runId) + "/stream?after=0");
  source.addEventListener("llm.text.delta", function (e) {
    try {
      var delta = JSON.parse(e.data);
      if (text && typeof delta.text === "string") text.textContent += delta.text;
    } catch (err) { /* a malformed delta is skipped */ }
  });
  source.addEventListener("LLM_CALL_COMPLETED", function () {
    if (text) text.textContent = "";  // the next round streams anew; the page shows answers on reload
  });
  source.addEventListener("end", function () {
    source.close();
    window.location.reload();
  });
})();
