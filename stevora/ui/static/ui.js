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
})();
