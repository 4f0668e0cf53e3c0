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
  let inFlight = false;
  // Says, above the page, that what it shows is no longer refreshed (and why); hidden again
  // at the next refresh that works.
  function stale(why) {
    const note = document.getElementById("stale");
    if (!note) return;
    note.hidden = !why;
    note.textContent = why ? "Not refreshed since " + new Date().toLocaleTimeString() + ": " + why : "";
  }
  async function refresh() {
    const main = document.getElementById("main");
    if (inFlight || !main || !main.hasAttribute("data-live") || busy()) return;
    inFlight = true;
    try {
      const res = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
      if (!res.ok) {
        stale(res.status === 401
          ? "the dashboard no longer knows this browser (restarted?): open the URL it printed"
          : "the dashboard answered " + res.status);
        return;
      }
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const fresh = doc.getElementById("main");
      if (fresh && !busy()) {
        // Jobs selected for a bulk action stay selected across the refresh.
        const picked = new Set(Array.from(main.querySelectorAll("input[form=bulk]:checked"), (box) => box.value));
        main.innerHTML = fresh.innerHTML;
        main.querySelectorAll("input[form=bulk]").forEach((box) => { box.checked = picked.has(box.value); });
      }
      stale("");
    } catch (_) {
      stale("the dashboard does not answer (stopped, or the app is restarting)");
    } finally {
      inFlight = false;
    }
  }
  document.addEventListener("submit", function (event) {
    const form = event.target;
    const question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
  window.setInterval(refresh, REFRESH_MS);
})();
