// What waits for an operator (an operator token, when tokens are configured): the routes and how
// many workers serve each now, the UNKNOWN executions with a reconcile form each, and the
// messages the broker parked.
"use strict";

import { api, el, q, shortJson, when } from "./api.js";

export async function showOperator(main, go) {
  const part = (id, title, note) => el("section", { id: `${id}-part` }, el("h3", {}, title),
    el("p", { class: "dim" }, note), el("div", { id }, el("p", { class: "dim" }, "reading…")));
  main.replaceChildren(el("h2", {}, "Operator"),
    part("routes", "Routes", "Each route a Hands pool announced tools for, and how many workers consume its "
      + "commands right now. A route nobody serves keeps its calls waiting."),
    part("unknown", "UNKNOWN executions", "Their Hands could not tell whether the tool acted. Find out, then "
      + "say what happened and how you know: the route's Hands record it, and the turn goes on."),
    part("parked", "Parked messages", "Messages the broker gave up delivering, and what was done about each."));
  await Promise.all([routes(), unknown(main, go), parked()].map((p) => p.catch((error) => {
    document.getElementById("problem").textContent = error.message;
  })));
}

async function routes() {
  const found = await api("/v1/operator/routes");
  const rows = found.map((r) => el("tr", { dataset: { route: r.route, workers: r.workers }, class: r.workers ? "" : "unserved" },
    el("td", {}, el("code", {}, r.route)), el("td", {}, r.tools.join(", ")),
    el("td", { class: "workers" }, r.workers ? `${r.workers} worker(s)` : "nobody serves it now"),
    el("td", {}, when(r.announced_at))));
  document.getElementById("routes").replaceChildren(found.length ? el("table", { class: "list" },
    el("thead", {}, el("tr", {}, ["route", "tools", "serving now", "last announced"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)) : el("p", { class: "dim" }, "No Hands pool has announced tools yet."));
}

async function unknown(main, go) {
  const found = await api("/v1/operator/unknown");
  const box = document.getElementById("unknown");
  if (!found.length) {
    box.replaceChildren(el("p", { class: "good" }, "No execution is UNKNOWN."));
    return;
  }
  box.replaceChildren(...found.map((x) => reconcileForm(x, go, () => showOperator(main, go))));
}

function reconcileForm(x, go, reload) {
  const outcome = el("select", { class: "outcome" }, el("option", { value: "result" }, "it happened: its result is"),
    el("option", { value: "failure" }, "it did not happen, or failed: because"));
  const value = el("textarea", { class: "value", rows: 2, cols: 50, placeholder: '{"message_id": "msg-4"}' });
  const evidence = el("input", { class: "evidence", size: 40, placeholder: "how you know (the mail log, 10:42)" });
  const actor = el("input", { class: "actor", size: 14, placeholder: "who you are" });
  const said = el("span", { class: "said" });
  const send = async () => {
    const body = { request_id: `console-${x.id}-${Date.now()}`, evidence: evidence.value, actor: actor.value || "console" };
    if (outcome.value === "result") {
      try { body.result = JSON.parse(value.value); } catch (error) { said.textContent = `the result is not JSON: ${error.message}`; return; }
    } else body.failure = value.value;
    try {
      const answer = await api(`/v1/operator/executions/${q(x.id)}/reconcile?wait=10s`, { json: body });
      said.textContent = answer.status === "requested" ? answer.message : `reconciled: ${answer.status} (${answer.how})`;
      if (answer.status !== "requested") setTimeout(reload, 1500);
    } catch (error) { said.textContent = error.message; }
  };
  const turn = `?session=${q(x.session_id)}&turn=${q(x.turn_id)}`;
  return el("div", { class: "unknown", dataset: { execution: x.id } },
    el("p", {}, el("b", {}, `${x.tool} (${x.call_id})`), ` on route ${x.route}, execution `, el("code", {}, x.id),
      ` · namespace ${x.namespace} · turn `, el("a", { href: turn, onclick: (e) => { e.preventDefault(); go(turn); } }, x.turn_id)),
    el("p", { class: "bad" }, "why UNKNOWN: ", x.reason || "?"),
    el("p", { class: "dim" }, `${x.attempts} attempt(s)${x.worker ? `, last on ${x.worker}` : ""}, UNKNOWN since ${when(x.updated_at)}`),
    el("div", { class: "form" }, outcome, value, el("div", {}, evidence, " ", actor, " ",
      el("button", { class: "reconcile", onclick: send }, "reconcile")), said));
}

async function parked() {
  const found = await api("/v1/operator/parked");
  document.getElementById("parked").replaceChildren(found.length ? el("table", { class: "list" },
    el("thead", {}, el("tr", {}, ["id", "queue", "message", "reason", "what was done", "parked"].map((h) => el("th", {}, h)))),
    el("tbody", {}, found.map((p) => el("tr", {}, el("td", {}, `${p.id}`), el("td", {}, p.queue),
      el("td", {}, `${p.kind || "?"} ${p.execution_id || ""}`), el("td", {}, shortJson(p.reason, 200)),
      el("td", {}, shortJson(p.surfaced || "", 160)), el("td", {}, when(p.parked_at)))))) : el("p", { class: "good" }, "Nothing is parked."));
}
