// Lifeline console: the live event timeline. A small EventSource client (no inline script: the CSP forbids it).
// The server sends each new event as a rendered table row; we put it at the top of #timeline-rows.
// After htmx swaps the timeline (the filters changed), the stream is reopened with the new filters.
// The Fleet page's body is re-fetched by htmx (hx-trigger "every Ns"); here we only say whether it is live:
// a refused poll (signed out: 401) or an unreachable control plane greys the last picture out and says so.
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

  function fleetStatus(text, live) {
    var status = document.getElementById("fleet-status");
    var body = document.getElementById("fleet-live");
    if (status) { status.textContent = text; }
    if (body) { body.classList.toggle("not-live", !live); }
  }
  document.addEventListener("htmx:afterSwap", function (evt) {
    if (evt.target && evt.target.id === "fleet-live") {
      var body = document.getElementById("fleet-live");
      fleetStatus("live · as of " + (body ? body.getAttribute("data-as-of") : "now"), true);
    }
  });
  document.addEventListener("htmx:responseError", function (evt) {
    if (evt.detail && evt.detail.elt && evt.detail.elt.id === "fleet-live") {
      var signedOut = evt.detail.xhr && evt.detail.xhr.status === 401;
      fleetStatus(signedOut ? "stopped: your session ended; sign in again — what is shown is not current"
                            : "not updating (HTTP " + evt.detail.xhr.status + "); what is shown is not current", false);
    }
  });
  document.addEventListener("htmx:sendError", function (evt) {
    if (evt.detail && evt.detail.elt && evt.detail.elt.id === "fleet-live") {
      fleetStatus("control plane unreachable; retrying — what is shown is not current", false);
    }
  });

  document.addEventListener("DOMContentLoaded", connect);
  document.addEventListener("htmx:afterSwap", function (evt) {
    if (evt.target && evt.target.id === "timeline-region") { connect(); }
  });
  window.addEventListener("pagehide", function () { if (source) { source.close(); } });
})();
