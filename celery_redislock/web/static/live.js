// The web view's live part: fetched again every second (unless unticked, or while a field of it
// is being typed in), and its action forms posted with fetch, their answer shown at the top.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var auto = document.getElementById("auto");
  var status = document.getElementById("status");
  var outcome = document.getElementById("outcome");
  if (!live) { return; }
  var busy = false;

  function typing() {
    var el = document.activeElement;
    return el && live.contains(el) && el.tagName === "INPUT" && el.type !== "hidden";
  }

  function refresh(force) {
    if (busy || (!force && (!auto.checked || typing()))) { return; }
    busy = true;
    fetch(live.dataset.src, {
      headers: {"X-Requested-With": "fetch"}, credentials: "same-origin", cache: "no-store"
    }).then(function (response) {
      return response.text().then(function (text) {
        if (!response.ok) { throw new Error(text || response.statusText); }
        live.innerHTML = text;
        status.textContent = "";
        status.className = "";
      });
    }).catch(function (error) {
      status.textContent = "not updated: " + error.message;
      status.className = "refused";
    }).then(function () { busy = false; });
  }

  function show(text, ok) {
    outcome.hidden = false;
    outcome.textContent = text;
    outcome.className = ok ? "ok" : "refused";
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("act")) { return; }
    event.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) { return; }
    var submitter = event.submitter;
    var action = (submitter && submitter.getAttribute("formaction")) || form.action;
    fetch(action, {
      method: "POST",
      body: new URLSearchParams(new FormData(form)),
      headers: {"X-Requested-With": "fetch"},
      credentials: "same-origin"
    }).then(function (response) {
      return response.text().then(function (text) { show(text, response.ok); });
    }).catch(function (error) {
      show("not sent: " + error.message, false);
    }).then(function () { refresh(true); });
  });

  setInterval(refresh, 1000);
}());
