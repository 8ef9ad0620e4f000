// The parts of a turn's page that are redrawn from what the API says: the conversation, each
// tool call (arguments, status, output, how it ended with its evidence, attempts, worker), the
// calls that wait for a person (with their answers), the model calls and the runs.
"use strict";

import { api, badge, clock, el, q, seconds, shortJson, when } from "./api.js";
import { howWords, tokensOf } from "./words.js";

// Executions whose output may still grow (an UNKNOWN one's outcome, if it comes, seals it).
const OPEN = new Set(["intended", "accepted", "running", "unknown"]);

function pretty(value) {
  return value === undefined || value === null ? "" : JSON.stringify(value, null, 2);
}

export function conversation(container, history) {
  const shown = history.map((m) => {
    const role = m.role;
    if (role === "tool") {
      const what = m.status === "succeeded" ? shortJson(m.result, 300) : shortJson(m.error, 300);
      return el("div", { class: "msg tool", dataset: { role } }, el("b", {}, `tool ${m.tool} (${m.call_id})`),
        ` ${m.status}${m.how && m.how !== "ran" ? ` (${howWords(m.how)})` : ""}: ${what}`);
    }
    const calls = (m.tool_calls || []).map((c) => el("div", { class: "asks" },
      `asks for ${c.tool} (${c.call_id}) `, el("code", {}, shortJson(c.args, 200))));
    return el("div", { class: "msg " + role, dataset: { role } }, el("b", {}, role), " ", m.text || "", calls);
  });
  container.replaceChildren(...(shown.length ? shown : [el("p", { class: "dim" }, "Nothing said yet.")]));
}

// One card per execution; the output already read is kept (``outputs``: id -> {text, next, gaps}).
export function toolCalls(container, executions, outputs) {
  if (!executions.length) {
    container.replaceChildren(el("p", { class: "dim" }, "No tool call yet."));
    return;
  }
  container.replaceChildren(...executions.map((x) => {
    const out = outputs.get(x.id);
    const ended = ["succeeded", "failed", "cancelled"].includes(x.status);
    const how = x.how ? howWords(x.how) : "";
    return el("div", { class: "call " + x.status, dataset: { execution: x.id, status: x.status, call: x.call_id } },
      el("div", { class: "call-head" }, el("b", {}, x.tool), ` (${x.call_id}) `, badge(x.status),
        x.attempts ? ` attempt ${x.attempts}` : "", x.worker ? el("span", { class: "worker" }, ` on ${x.worker}`) : "",
        el("span", { class: "dim" }, ` · route ${x.route} · ${x.id}`)),
      el("div", { class: "label" }, "arguments"),
      el("pre", { class: "args" }, pretty(x.args)),
      out && out.text ? [el("div", { class: "label" }, `output (${out.next} bytes${out.gaps ? ", with gaps" : ""})`),
        el("pre", { class: "output" }, out.text)] : null,
      el("div", { class: "outcome" },
        ended || x.status === "unknown" ? el("span", {}, el("b", {}, "how it ended: "), how || x.status) : null,
        x.status === "pending" ? el("b", {}, howWords(x.how)) : null,
        x.status === "unknown" ? el("div", { class: "bad" }, "UNKNOWN: ", (x.error || {}).message || "",
          " — an operator reconciles it with evidence.") : null,
        x.evidence ? el("div", { class: "evidence" }, el("b", {}, "evidence: "), x.evidence) : null,
        x.status === "succeeded" ? el("div", {}, el("b", {}, "result: "), el("code", {}, shortJson(x.result, 400))) : null,
        x.status === "failed" && x.error ? el("div", { class: "bad" }, `${x.error.code}: ${x.error.message}`) : null),
      el("div", { class: "dim times" }, `committed ${when(x.created_at)}`,
        ended ? ` · ended ${when(x.updated_at)} (${seconds(new Date(x.updated_at) - new Date(x.created_at))})` : ""));
  }));
}

// Read what each open (or just ended) execution wrote since last time.
export async function readOutputs(executions, outputs) {
  for (const x of executions) {
    const have = outputs.get(x.id) || { text: "", next: 0, gaps: false, done: false };
    if (have.done) continue;
    if (!OPEN.has(x.status) && x.output_bytes <= have.next) {
      outputs.set(x.id, { ...have, done: true }); // its outcome sealed the output: all of it is here
      continue;
    }
    const page = await api(`/v1/executions/${q(x.id)}/output?offset=${have.next}`);
    for (const p of page.pages) {
      if (p.offset > have.next) { have.text += `\n[… ${p.offset - have.next} bytes never arrived …]\n`; have.gaps = true; }
      have.text += p.data;
      have.next = p.offset + new TextEncoder().encode(p.data).length;
    }
    have.done = !OPEN.has(page.status) && have.next >= page.output_bytes;
    outputs.set(x.id, have);
  }
}

// The calls that wait for a person, each with the answers it takes; ``answer(call, body)`` sends one.
export function approvals(container, executions, answer) {
  // A built-in sleep or wait for a signal waits for its clock or its signal, not for a person.
  const pending = executions.filter((x) => x.status === "pending" && !["clock", "signal"].includes(x.awaits));
  container.hidden = !pending.length;
  // Drawn again only when the calls that wait change: what a person is typing stays.
  const key = pending.map((x) => x.id).join(" ");
  if (container.dataset.key === key) return;
  container.dataset.key = key;
  container.replaceChildren(el("h3", {}, "Waiting for you"), ...pending.map((x) => {
    const reason = el("input", { class: "reason", placeholder: "why (told to the model)", size: 28 });
    const deny = el("button", { class: "deny", onclick: () => answer(x.call_id, { decision: "deny", reason: reason.value || undefined }) }, "deny");
    if (x.awaits === "result") {
      const result = el("textarea", { class: "result", rows: 3, cols: 50, placeholder: '{"any": "JSON"}' });
      const give = el("button", { class: "give", onclick: () => {
        let value;
        try { value = JSON.parse(result.value); } catch (error) { return answer(null, null, `not JSON: ${error.message}`); }
        return answer(x.call_id, { decision: "result", result: value });
      } }, "give result");
      return el("div", { class: "approval", dataset: { call: x.call_id } },
        el("p", {}, el("b", {}, `${x.tool} (${x.call_id})`), " is a manual tool: give its result, or deny it."),
        el("pre", { class: "args" }, pretty(x.args)), result, el("div", {}, give, " ", reason, deny));
    }
    const approve = el("button", { class: "approve", onclick: () => answer(x.call_id, { decision: "approve" }) }, "approve");
    return el("div", { class: "approval", dataset: { call: x.call_id } },
      el("p", {}, el("b", {}, `${x.tool} (${x.call_id})`),
        x.route === "brain" ? " asks for your approval:" : " waits for your approval before it is sent:"),
      el("pre", { class: "args" }, pretty(x.args)), el("div", {}, approve, " ", reason, deny));
  }));
}

export function modelCalls(container, history) {
  const rows = history.model_calls.map((c) => el("tr", { dataset: { status: c.status } },
    el("td", {}, `${c.number}`), el("td", {}, `${c.attempt}`), el("td", {}, badge(c.status === "LOST" ? "lost" : c.status)),
    el("td", {}, c.latency_ms !== undefined && c.latency_ms !== null ? seconds(c.latency_ms) : ""),
    el("td", {}, tokensOf(c.usage)), el("td", {}, c.model || ""),
    el("td", {}, c.status === "failed" ? `${c.error} (retried after ${c.retry_in_seconds} s)`
      : c.status === "LOST" ? "its Brain died: reply and usage unknown" : c.tool_calls ? `${c.tool_calls} tool call(s)` : ""),
    el("td", {}, clock(c.at))));
  const runs = history.runs.map((r) => el("tr", {}, el("td", {}, `run ${r.run}`), el("td", {}, r.began_at),
    el("td", {}, r.owner || ""), el("td", {}, r.ended || "running"), el("td", {}, clock(r.at))));
  container.replaceChildren(
    el("table", { class: "list", id: "model-calls" }, el("thead", {}, el("tr", {},
      ["#", "attempt", "status", "latency", "tokens", "model", "what came of it", "at"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows)),
    el("h3", {}, "Runs"),
    el("table", { class: "list", id: "runs" }, el("thead", {}, el("tr", {},
      ["run", "from phase", "Brain", "how it ended", "at"].map((h) => el("th", {}, h)))), el("tbody", {}, runs)));
}
