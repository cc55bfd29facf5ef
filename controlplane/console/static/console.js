// Lifeline console: the live event timeline. A small EventSource client (no inline script: the CSP forbids it).
// The server sends each new event as a rendered table row; we put it at the top of #timeline-rows.
// After htmx swaps the timeline (the filters changed), the stream is reopened with the new filters.
(function () {
  "use strict";
  var source = null;

  function connect() {
    if (source) { source.close(); source = null; }
    var table = document.getElementById("timeline");
    if (!table || !window.EventSource) { return; }
    var status = document.getElementById("live-status");
    source = new EventSource(table.getAttribute("data-stream"));
    source.addEventListener("open", function () { if (status) { status.textContent = "live"; } });
    source.addEventListener("error", function () { if (status) { status.textContent = "reconnecting…"; } });
    source.addEventListener("lifeline-event", function (message) {
      var body = document.getElementById("timeline-rows");
      if (!body) { return; }
      var holder = document.createElement("tbody");
      holder.innerHTML = message.data;  // server-rendered, escaped by Jinja2's autoescape
      var row = holder.firstElementChild;
      if (!row || document.getElementById(row.id)) { return; }
      row.classList.add("fresh");
      body.insertBefore(row, body.firstChild);
      var empty = document.getElementById("timeline-empty");
      if (empty) { empty.remove(); }
    });
  }

  document.addEventListener("DOMContentLoaded", connect);
  document.addEventListener("htmx:afterSwap", function (evt) {
    if (evt.target && evt.target.id === "timeline-region") { connect(); }
  });
  window.addEventListener("pagehide", function () { if (source) { source.close(); } });
})();
