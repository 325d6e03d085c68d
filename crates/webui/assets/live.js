// Live updates where JavaScript runs: every few seconds, fetch this page again and bring
// its <main> up to date in place. Only what changed is touched, so focus, a text selection
// and what a screen reader has read (the banners' alerts) stay; a button pauses it.
// Without JavaScript the page is the same, only static. No dependencies.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-live") || "0", 10);
  var status = document.getElementById("live-status");
  if (!every || !window.fetch || !window.DOMParser || !status) return;
  var paused = false;
  var updates = 0;
  var changes = 0;
  var pause = document.createElement("button");
  pause.type = "button";
  pause.id = "live-pause";
  pause.setAttribute("aria-pressed", "false");
  pause.textContent = "Pause live updates";
  status.parentNode.insertBefore(pause, status.nextSibling);
  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", paused ? "true" : "false");
    pause.textContent = paused ? "Resume live updates" : "Pause live updates";
    status.textContent = paused ? "Live updates paused." : "Live updates resumed.";
  });
  function attributes(old, fresh) {
    var i, a;
    for (i = old.attributes.length - 1; i >= 0; i--) {
      a = old.attributes[i].name;
      if (!fresh.hasAttribute(a)) old.removeAttribute(a);
    }
    for (i = 0; i < fresh.attributes.length; i++) {
      a = fresh.attributes[i];
      if (old.getAttribute(a.name) !== a.value) old.setAttribute(a.name, a.value);
    }
  }
  // Makes `old`'s children equal to `fresh`'s: equal nodes are kept as they are, an element
  // of the same tag is updated in place, anything else is replaced. Returns the changes.
  function morph(old, fresh) {
    var changed = 0;
    var a = old.firstChild;
    var b = fresh.firstChild;
    while (b) {
      var nextB = b.nextSibling;
      if (!a) {
        old.appendChild(b);
        changed++;
      } else {
        var nextA = a.nextSibling;
        if (a.nodeType !== b.nodeType || a.nodeName !== b.nodeName) {
          old.replaceChild(b, a);
          changed++;
        } else if (a.nodeType === 1) {
          if (!a.isEqualNode(b)) {
            attributes(a, b);
            changed += 1 + morph(a, b);
          }
        } else if (a.nodeValue !== b.nodeValue) {
          a.nodeValue = b.nodeValue;
          changed++;
        }
        a = nextA;
      }
      b = nextB;
    }
    while (a) {
      var gone = a;
      a = a.nextSibling;
      old.removeChild(gone);
      changed++;
    }
    return changed;
  }
  function refresh() {
    if (paused) {
      window.setTimeout(refresh, every * 1000);
      return;
    }
    fetch(window.location.href, { headers: { "X-Live": "1" }, cache: "no-store" })
      .then(function (r) { return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        var changed = fresh && main && !paused ? morph(main, fresh) : 0;
        updates++;
        changes += changed;
        // For tests and tools: how many updates ran and how many nodes they changed.
        body.setAttribute("data-updates", String(updates));
        body.setAttribute("data-changes", String(changes));
        if (!paused) {
          status.textContent = "Live: updated " + new Date().toLocaleTimeString() +
            (changed ? "." : " (no change).");
        }
      })
      .catch(function () {
        status.textContent = "Live updates paused: the UI server cannot be reached.";
      })
      .then(function () { window.setTimeout(refresh, every * 1000); });
  }
  window.setTimeout(refresh, every * 1000);
})();
