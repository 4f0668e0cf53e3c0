// leaseq dashboard: refreshes a live page's <main> every 2 s (while the tab is visible and
// nobody is typing), and asks before a destructive action. No framework, no build step.
"use strict";
(function () {
  const REFRESH_MS = 2000;
  function busy() {
    const el = document.activeElement;
    const typing = el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.tagName === "SELECT");
    const selecting = String(window.getSelection ? window.getSelection() : "").length > 0;
    return typing || selecting || document.visibilityState !== "visible";
  }
  async function refresh() {
    const main = document.getElementById("main");
    if (!main || !main.hasAttribute("data-live") || busy()) return;
    try {
      const res = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const fresh = doc.getElementById("main");
      if (fresh && !busy()) main.innerHTML = fresh.innerHTML;
    } catch (_) {
      // The app may be restarting: try again at the next tick.
    }
  }
  document.addEventListener("submit", function (event) {
    const form = event.target;
    const question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
  window.setInterval(refresh, REFRESH_MS);
})();
