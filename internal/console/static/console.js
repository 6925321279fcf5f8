// The console's live parts, on top of pages that work without this file:
// the events page's live tail (Server-Sent Events from /ui/stream, with a
// key filter and a pause) and the progress bars of the runs in flight.
// No framework, no build step; served by the console (CSP script-src 'self').
"use strict";
(function () {
  var MAX_ROWS = 500;

  function text(v) { return v === undefined || v === null ? "" : String(v); }

  function cell(tr, v, cls) {
    var td = document.createElement("td");
    td.textContent = text(v);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function runLink(key) {
    var i = key.indexOf(":");
    var kind = i < 0 ? key : key.slice(0, i);
    var rest = i < 0 ? key : key.slice(i + 1);
    return "/ui/runs/" + encodeURIComponent(kind) + "/" + encodeURIComponent(rest);
  }

  var NAMED = { key: 1, job: 1, replica: 1, owner: 1, fence: 1, trigger: 1 };
  var BAD = { "ownership.unavailable": 1, "ownership.lost": 1, "run.failed": 1, "trigger.rejected": 1, "billrun.invoice_conflict": 1 };
  var GOOD = { "run.completed": 1, "ownership.acquired": 1 };

  function eventRow(ce) {
    var d = ce.data || {};
    var tr = document.createElement("tr");
    tr.className = (BAD[ce.type] ? "bad" : GOOD[ce.type] ? "good" : "") + " fresh";
    tr.setAttribute("data-type", text(ce.type));
    cell(tr, text(ce.time).replace("T", " "));
    cell(tr, ce.type);
    var td = cell(tr, "");
    var a = document.createElement("a");
    a.href = runLink(text(ce.subject));
    a.textContent = text(ce.subject);
    td.appendChild(a);
    cell(tr, d.replica);
    cell(tr, d.owner);
    cell(tr, d.fence);
    cell(tr, d.trigger);
    var rest = Object.keys(d).filter(function (k) { return !NAMED[k] && d[k] !== "" && d[k] !== null; }).sort()
      .map(function (k) { return k + "=" + (typeof d[k] === "object" ? JSON.stringify(d[k]) : d[k]); });
    cell(tr, rest.join(" "), "detail");
    return tr;
  }

  function liveEvents(table) {
    var tbody = table.tBodies[0];
    var state = document.getElementById("live-state");
    var pause = document.getElementById("pause");
    var key = table.getAttribute("data-key") || "";
    var paused = false, held = [], dropped = 0;
    function say(msg) { if (state) state.textContent = msg; }
    function add(tr) {
      var empty = tbody.querySelector("tr.empty");
      if (empty) empty.remove();
      tbody.insertBefore(tr, tbody.firstChild);
      while (tbody.rows.length > MAX_ROWS) tbody.deleteRow(tbody.rows.length - 1);
    }
    if (pause) {
      pause.hidden = false;
      pause.addEventListener("click", function () {
        paused = !paused;
        pause.textContent = paused ? "Resume" : "Pause";
        if (!paused) { held.forEach(add); held = []; }
        say(paused ? "Paused: new events are held." : "Live.");
      });
    }
    var es = new EventSource("/ui/stream?key=" + encodeURIComponent(key));
    es.addEventListener("hello", function () { say(paused ? "Paused." : "Live" + (key ? " (keys starting with " + key + ")" : "") + "."); });
    es.addEventListener("ownership", function (m) {
      var tr = eventRow(JSON.parse(m.data));
      if (paused) {
        held.push(tr);
        if (held.length > MAX_ROWS) held.shift();
        say("Paused: " + held.length + " new events held.");
      } else add(tr);
    });
    es.addEventListener("dropped", function (m) {
      dropped = JSON.parse(m.data).dropped;
      say("Live, but " + dropped + " events were dropped: this page fell behind the stream.");
    });
    es.addEventListener("bye", function () { es.close(); say("The stream ended (session over or replica stopping): reload."); });
    es.onerror = function () { say("Reconnecting…"); };
  }

  function liveProgress(table) {
    var es = new EventSource("/ui/stream?events=0&progress=1");
    es.addEventListener("progress", function (m) {
      var runs = JSON.parse(m.data);
      runs.forEach(function (r) {
        var row = null;
        Array.prototype.forEach.call(table.tBodies[0].rows, function (tr) {
          if (tr.getAttribute("data-key") === r.key) row = tr;
        });
        if (!row) return;
        var bar = row.querySelector("progress");
        var txt = row.querySelector(".progress-text");
        if (r.percent >= 0) {
          bar.value = r.percent;
          txt.textContent = r.percent.toFixed(1) + "% (" + r.batches + " of " + r.total + " batches)";
        } else {
          bar.removeAttribute("value");
          txt.textContent = r.batches + " batches, total not known yet";
        }
        row.querySelector(".rate").textContent = r.rows_per_s.toFixed(1) + " rows/s";
        row.querySelector(".eta").textContent = r.eta_ms >= 0 ? (r.eta_ms / 1000).toFixed(1) + "s" : "—";
        row.setAttribute("data-percent", text(r.percent));
      });
      var live = {};
      runs.forEach(function (r) { live[r.key] = 1; });
      Array.prototype.forEach.call(table.tBodies[0].rows, function (tr) {
        var k = tr.getAttribute("data-key");
        if (k && !live[k]) tr.classList.add("ended");
      });
      if (runs.some(function (r) { return !table.querySelector('tr[data-key="' + CSS.escape(r.key) + '"]'); })) {
        table.setAttribute("data-new-runs", "1"); // a run started after this page: reload shows it
      }
    });
    es.addEventListener("bye", function () { es.close(); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var ev = document.querySelector('table[data-live="events"]');
    if (ev) liveEvents(ev);
    var pr = document.querySelector('table[data-live="progress"]');
    if (pr) liveProgress(pr);
  });
})();
