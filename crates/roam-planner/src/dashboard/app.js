// The dashboard's only script (docs/dashboard.md). It fetches the views as
// HTML fragments the planner renders and escapes, shows the active one,
// refreshes it every 2 s, and sends the buttons' actions to the API's own
// routes. Credentials: the bearer token the operator pasted, kept in this
// tab's sessionStorage and sent as `Authorization`; under mutual TLS the
// browser's client certificate does the rest. Nothing here builds HTML
// from data: fragments come escaped from the planner, messages go in as
// text.
"use strict";

const VIEWS = ["nodes", "cells", "migrations", "decisions"];
const REFRESH_MS = 2000;
const KEY = "roam-planner-token";

function token() {
  return sessionStorage.getItem(KEY) || "";
}

function headers(json) {
  const h = {};
  const t = token();
  if (t) h["Authorization"] = "Bearer " + t;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

function current() {
  const v = location.hash.replace(/^#/, "");
  return VIEWS.includes(v) ? v : "nodes";
}

function say(text, kind) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = kind || "";
}

// The error message of an API answer, as text.
async function why(r) {
  try {
    const body = await r.json();
    if (body && typeof body.error === "string") return body.error;
  } catch (_) { /* not JSON */ }
  return r.status + " " + r.statusText;
}

let busy = false;

async function refresh() {
  const view = current();
  const section = document.getElementById("view-" + view);
  // Do not pull a menu away from under the operator.
  const focus = document.activeElement;
  if (focus && focus.tagName === "SELECT" && section.contains(focus)) return;
  if (busy) return;
  busy = true;
  try {
    const r = await fetch("/v1/dashboard/" + view, { headers: headers(false), cache: "no-store" });
    if (r.status === 401) {
      say("The planner needs its token: paste it above (it stays in this tab only).", "bad");
      return;
    }
    if (!r.ok) {
      say("Cannot load the " + view + " view: " + (await why(r)), "bad");
      return;
    }
    // Escaped by the planner (dashboard/fmt.rs); same origin only (CSP).
    section.innerHTML = await r.text();
    section.dataset.loaded = "true";
    document.getElementById("updated").textContent =
      "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    say("The planner does not answer: " + e, "bad");
  } finally {
    busy = false;
  }
}

function show() {
  const view = current();
  for (const v of VIEWS) {
    document.getElementById("view-" + v).hidden = v !== view;
  }
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.view === view);
  }
  refresh();
}

async function act(button) {
  const what = button.dataset.act;
  const node = button.dataset.node;
  const cell = button.dataset.cell;
  let path;
  let body = null;
  let question = null;
  if (what === "drain") {
    path = "/v1/nodes/" + encodeURIComponent(node) + "/drain";
    question = "Drain " + node + "? Its cells move to other nodes and it takes no new ones.";
  } else if (what === "undrain") {
    path = "/v1/nodes/" + encodeURIComponent(node) + "/undrain";
  } else if (what === "kill") {
    path = "/v1/cells/" + encodeURIComponent(cell) + "/kill";
    question = "Kill cell " + cell + "? Its program stops for good.";
  } else if (what === "migrate") {
    path = "/v1/cells/" + encodeURIComponent(cell) + "/migrate";
    let to = "";
    for (const s of document.querySelectorAll("select[data-for]")) {
      if (s.dataset.for === cell) to = s.value;
    }
    body = JSON.stringify(to ? { to: to } : {});
  } else {
    return;
  }
  if (question && !window.confirm(question)) return;
  button.disabled = true;
  say(what + "…", "");
  try {
    const r = await fetch(path, { method: "POST", headers: headers(body !== null), body: body });
    if (!r.ok) {
      say(what + " failed: " + (await why(r)), "bad");
      return;
    }
    const answer = await r.json();
    if (what === "migrate") {
      say("Migrating " + cell + " to " + answer.to + " (migration " + answer.migration + ").", "ok");
    } else if (what === "drain") {
      const moved = (answer.moves || []).filter((m) => m.to).length;
      const failed = (answer.moves || []).filter((m) => m.error);
      let text = "Draining " + node + ": " + moved + " cell(s) moving.";
      if (failed.length) text += " Not moved: " + failed.map((m) => m.cell + " (" + m.error + ")").join("; ");
      say(text, failed.length ? "bad" : "ok");
    } else {
      say(what + " done.", "ok");
    }
  } catch (e) {
    say(what + " failed: " + e, "bad");
  } finally {
    button.disabled = false;
    refresh();
  }
}

document.addEventListener("click", (e) => {
  const b = e.target.closest("button[data-act]");
  if (b) act(b);
});

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("auth");
  const input = document.getElementById("token");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const t = input.value.trim();
    if (t) sessionStorage.setItem(KEY, t);
    input.value = "";
    say(t ? "Token set for this tab." : "", "ok");
    refresh();
  });
  document.getElementById("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    say("Token forgotten.", "");
    refresh();
  });
  window.addEventListener("hashchange", show);
  show();
  setInterval(refresh, REFRESH_MS);
});
