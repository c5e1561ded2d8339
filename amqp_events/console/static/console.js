// The console's behaviour in the browser: changes through the JSON API, relative times, live figures, charts,
// a message's details and the edit-and-retry dialog. No build step: plain JavaScript.
"use strict";

function csrfToken() { return (document.cookie.match(/(?:^|; )csrf=([^;]*)/) || [])[1] || ""; }

function tell(text, ok) {
  const outcome = document.getElementById("outcome");
  outcome.textContent = text;
  outcome.className = ok ? "ok" : "bad";
}

// POST ``body`` to ``url``; ``question``: ask for the service's name first (a purge cannot be undone).
async function act(url, body, question, reload = true) {
  if (question) {
    const typed = prompt(question);
    if (typed === null) return false;
    body.confirm = typed;
  }
  const response = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfToken()}, body: JSON.stringify(body)});
  const answer = await response.json();
  tell(response.ok ? "done: " + JSON.stringify(answer) : "refused: " + answer.error, response.ok);
  if (response.ok && reload) setTimeout(() => location.reload(), 800);
  return response.ok;
}

function selectedIds() { return Array.from(document.querySelectorAll("input.pick:checked")).map(box => box.value); }

// ``text`` as one segment of a URL's path (as the pages' ``segment`` filter quotes): a "." left as it is could
// make "..", which the browser resolves.
function segment(text) {
  return encodeURIComponent(text).replace(/[.!'()*]/g, c => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}

// The page's buttons (no inline handlers: the Content-Security-Policy runs the console's own files alone).
// data-post: the change a button sends, data-ask its question, data-body what it sends (the ticked messages,
// the page's filters, or nothing); data-verb: pause or resume the handler named in #handler; data-limits: set or
// reset the limits of the handler named in #limit-handler.
function clicked(event) {
  const button = event.target.closest("button");
  if (!button) return;
  const data = button.dataset;
  if (data.post) {
    const matching = {event: data.event, reason: data.reason, since: data.since};
    act(data.post, data.body === "selected" ? {ids: selectedIds()} : data.body === "matching" ? matching : {}, data.ask);
  } else if (data.verb) {
    act(data.handlers + segment(document.getElementById("handler").value) + "/" + data.verb, {}, null, false);
  } else if (data.limits) {
    act(data.limits + segment(document.getElementById("limit-handler").value), limitsBody(data.change));
  } else if (button.matches("button.edit")) {
    editAndRetry(button);
  } else if ("close" in data) {
    button.closest("dialog").close();
  }
}

// The limits the form gives: empty is "no such limit"; anything but digits goes as written, for the console to
// refuse with its reason (Number() would make it NaN, which JSON sends as null).
function limitsBody(change) {
  if (change === "reset") return {reset: true};
  const concurrency = document.getElementById("limit-concurrency").value.trim();
  const rate = document.getElementById("limit-rate").value.trim();
  return {concurrency: concurrency === "" ? null : /^\d+$/.test(concurrency) ? Number(concurrency) : concurrency,
          rate_limit: rate === "" ? null : rate};
}

// "3 min ago", the exact time on hover.
function ago(moment) {
  const seconds = Math.round((Date.now() - moment.getTime()) / 1000);
  const steps = [[60, "s", 1], [3600, "min", 60], [86400, "h", 3600], [Infinity, "d", 86400]];
  for (const [below, unit, size] of steps) {
    if (Math.abs(seconds) < below) return seconds < 5 && unit === "s" ? "just now" : `${Math.round(seconds / size)} ${unit} ago`;
  }
}
// The elements of ``root`` that match ``selector``, ``root`` itself included (a live part may be a chart).
function within(root, selector) {
  return [...(root.matches && root.matches(selector) ? [root] : []), ...root.querySelectorAll(selector)];
}

function showTimes(root) {
  for (const time of within(root, "time[datetime]")) {
    const moment = new Date(time.getAttribute("datetime"));
    if (isNaN(moment)) continue;
    time.textContent = ago(moment);
    time.title = moment.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
}

function drawCharts(root) {
  for (const box of within(root, ".chart[data-series]")) {
    const data = JSON.parse(box.dataset.series);
    box.textContent = "";
    if (!data.t.length) { box.textContent = box.dataset.empty; continue; }
    const colours = ["#1b5fbf", "#b00020", "#2f8f46"];
    new uPlot({
      width: Math.max(320, box.clientWidth || 640), height: 180, title: box.dataset.title,
      series: [{}, ...data.series.map((line, index) => ({label: line.label, stroke: colours[index % 3], width: 2}))],
      axes: [{}, {size: 50}],
    }, [data.t, ...data.series.map(line => line.values)], box);
  }
}

// Live figures: the page is fetched again and each element marked data-live is replaced by its new self.
async function refreshLive() {
  if (document.hidden || document.querySelector("dialog[open]")) return;
  const response = await fetch(location.href, {headers: {"Accept": "text/html"}});
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  for (const old of document.querySelectorAll("[data-live][id]")) {
    const replacement = fresh.getElementById(old.id);
    if (replacement) {
      old.replaceWith(replacement);
      showTimes(replacement);
      drawCharts(replacement);
    }
  }
}

// A message's details (traceback, headers), asked for when it is opened.
async function openDetails(details) {
  if (!details.open || details.dataset.loaded) return;
  details.dataset.loaded = "1";
  const response = await fetch(details.dataset.url);
  const answer = await response.json();
  const body = details.querySelector(".detail-body");
  body.textContent = "";
  if (!response.ok) { body.textContent = answer.error; return; }
  const said = document.createElement("p");
  said.textContent = `${answer.exception_type}: ${answer.exception_message}` + (answer.trace_id ? ` · trace ${answer.trace_id}` : "");
  const args = document.createElement("pre");
  args.textContent = answer.not_shown || JSON.stringify(answer.arguments);
  const traceback = document.createElement("pre");
  traceback.className = "traceback";
  traceback.textContent = answer.traceback;
  body.append(said, args, traceback);
  if (answer.cut) {  // what could not be kept as it came, when it was archived
    const cut = document.createElement("p");
    cut.className = "cut";
    cut.textContent = "cut: " + answer.cut;
    body.append(cut);
  }
}

async function editAndRetry(button) {
  const dialog = document.getElementById("edit");
  const response = await fetch(button.dataset.url);
  const answer = await response.json();
  if (!response.ok) { tell("refused: " + answer.error, false); return; }
  if (answer.not_shown) { tell("cannot edit it here: " + answer.not_shown, false); return; }
  const [args, kwargs] = answer.payload || [[], {}];
  dialog.querySelector("textarea").value = JSON.stringify({args, kwargs}, null, 2);
  dialog.querySelector(".edit-error").textContent = "";
  dialog.dataset.url = button.dataset.retry;
  dialog.showModal();
}

async function sendEdited(event) {
  event.preventDefault();
  const dialog = document.getElementById("edit");
  let body;
  try { body = JSON.parse(dialog.querySelector("textarea").value); }
  catch (error) { dialog.querySelector(".edit-error").textContent = "not JSON: " + error.message; return; }
  const sent = await act(dialog.dataset.url, body, null, true);
  if (sent) dialog.close();
  else dialog.querySelector(".edit-error").textContent = document.getElementById("outcome").textContent;
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  drawCharts(document);
  const every = Number(document.body.dataset.refresh || 0);
  if (every > 0) setInterval(refreshLive, every * 1000);
  document.addEventListener("toggle", event => {
    if (event.target.matches && event.target.matches("details.message-detail")) openDetails(event.target);
  }, true);
  document.addEventListener("click", clicked);
  const form = document.querySelector("#edit form");
  if (form) form.addEventListener("submit", sendEdited);
});
