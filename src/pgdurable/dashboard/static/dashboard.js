// pgdurable dashboard: confirmations for actions, live regions refreshed by short polling, local times.
// Served from the package (the CSP allows no inline script). Fragments come from the server already escaped.
(function () {
  "use strict";

  // Actions ask first: <form data-confirm="...">.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  // Show times in the browser's zone; the server writes UTC.
  function localize(root) {
    var times = root.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var d = new Date(times[i].getAttribute("datetime"));
      if (!isNaN(d.getTime())) {
        times[i].textContent = d.toLocaleString(undefined, {
          year: "numeric", month: "short", day: "numeric",
          hour: "2-digit", minute: "2-digit", second: "2-digit"
        });
      }
    }
  }

  var indicator = document.getElementById("live");
  function showState(state, text) {
    if (!indicator) return;
    indicator.hidden = false;
    indicator.className = "live " + state;
    indicator.querySelector(".live-text").textContent = text;
  }

  // <div data-live="/url?fragment=1" data-interval="ms">: replace its content with the fragment every
  // interval while the tab is visible; stop once the fragment carries [data-final] (a finished workflow).
  function live(region) {
    var source = region.getAttribute("data-live");
    var every = parseInt(region.getAttribute("data-interval"), 10) || 5000;
    var failures = 0;
    if (region.hasAttribute("data-stopped")) {
      showState("paused", "finished");
      return;
    }
    showState("", "live");

    function schedule() {
      window.setTimeout(tick, Math.min(every * Math.pow(2, failures), 60000));
    }

    function tick() {
      if (document.hidden) { schedule(); return; }
      fetch(source, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          if (response.status === 401) { window.location.reload(); return null; }
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          if (html === null) return;
          // Keep open <details> (a step's output) open across refreshes.
          var open = [];
          region.querySelectorAll("details[id][open]").forEach(function (d) { open.push(d.id); });
          // Parts that never change (the input) stay as they are: the fragment has empty placeholders.
          var kept = {};
          region.querySelectorAll("[data-keep][id]").forEach(function (el) { kept[el.id] = el; });
          region.innerHTML = html;
          region.querySelectorAll("[data-keep][id]").forEach(function (slot) {
            if (kept[slot.id] && !slot.hasChildNodes()) slot.replaceWith(kept[slot.id]);
          });
          open.forEach(function (id) {
            var d = document.getElementById(id);
            if (d) d.open = true;
          });
          localize(region);
          failures = 0;
          if (region.querySelector("[data-final]")) {
            showState("paused", "finished");
            return;
          }
          showState("", "live · " + new Date().toLocaleTimeString());
          schedule();
        })
        .catch(function () {
          failures = Math.min(failures + 1, 4);
          showState("stale", "reconnecting…");
          schedule();
        });
    }
    schedule();
  }

  document.addEventListener("DOMContentLoaded", function () {
    localize(document);
    document.querySelectorAll("[data-live]").forEach(live);
  });
})();
