// Live refresh where JavaScript runs: every few seconds, fetch this page again and swap
// in its <main>. Without JavaScript the page is the same, only static. No dependencies.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-live") || "0", 10);
  var status = document.getElementById("live-status");
  if (!every || !window.fetch || !window.DOMParser) return;
  function refresh() {
    fetch(window.location.href, { headers: { "X-Live": "1" }, cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) main.innerHTML = fresh.innerHTML;
        if (status) status.textContent = "Live: updated " + new Date().toLocaleTimeString() + ".";
      })
      .catch(function () {
        if (status) status.textContent = "Live updates paused: the UI server cannot be reached.";
      })
      .then(function () { window.setTimeout(refresh, every * 1000); });
  }
  window.setTimeout(refresh, every * 1000);
})();
