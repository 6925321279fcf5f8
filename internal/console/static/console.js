// The console's live parts, on top of pages that work without this file:
// the events page's live tail (Server-Sent Events from /ui/stream, with a
// key filter and a pause) and the progress bars of the runs in flight (on
// the overview, runs that start after the page loaded get a row too).
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

  // fmtDur is the server's duration format (pages.go fmtDur).
  function fmtDur(ms) {
    if (ms < 0) return "—";
    if (ms < 1000) return Math.floor(ms) + "ms";
    var s = ms / 1000;
    if (s < 60) return s.toFixed(1) + "s";
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (s < 3600) return Math.floor(s / 60) + "m" + pad(Math.floor(s) % 60) + "s";
    return Math.floor(s / 3600) + "h" + pad(Math.floor(s / 60) % 60) + "m";
  }

  // inflightRow is the overview's row of a run that started after the page
  // loaded, with the cells the server renders (its bar is filled below).
  function inflightRow(r) {
    var tr = document.createElement("tr");
    tr.setAttribute("data-key", text(r.key));
    var td = cell(tr, "");
    var a = document.createElement("a");
    var key = text(r.key), job = text(r.job);
    a.href = job && key.indexOf(job + ":") === 0
      ? "/ui/runs/" + encodeURIComponent(job) + "/" + encodeURIComponent(key.slice(job.length + 1))
      : runLink(key);
    a.textContent = key;
    td.appendChild(a);
    cell(tr, r.replica);
    cell(tr, r.fence);
    cell(tr, text(r.trigger) + (r.requested_by ? " by " + r.requested_by : ""));
    cell(tr, text(r.started).replace("T", " ").replace(/\.[0-9]+/, ""));
    var p = cell(tr, "");
    var bar = document.createElement("progress");
    bar.max = 100;
    p.appendChild(bar);
    p.appendChild(document.createTextNode(" "));
    var span = document.createElement("span");
    span.className = "progress-text";
    p.appendChild(span);
    cell(tr, "", "rate");
    cell(tr, "", "eta");
    return tr;
  }

  function liveProgress(table) {
    var tbody = table.tBodies[0];
    var addRuns = table.hasAttribute("data-add-runs");
    var es = new EventSource("/ui/stream?events=0&progress=1");
    es.addEventListener("progress", function (m) {
      var runs = JSON.parse(m.data);
      runs.forEach(function (r) {
        var row = null;
        Array.prototype.forEach.call(tbody.rows, function (tr) {
          if (tr.getAttribute("data-key") === r.key) row = tr;
        });
        if (!row) {
          if (!addRuns) return;
          var empty = tbody.querySelector("tr.empty");
          if (empty) empty.remove();
          row = inflightRow(r);
          tbody.appendChild(row);
        }
        row.classList.remove("ended");
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
        row.querySelector(".eta").textContent = fmtDur(r.eta_ms);
        row.setAttribute("data-percent", text(r.percent));
      });
      var live = {};
      runs.forEach(function (r) { live[r.key] = 1; });
      Array.prototype.forEach.call(tbody.rows, function (tr) {
        var k = tr.getAttribute("data-key");
        if (k && !live[k]) tr.classList.add("ended");
      });
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
