// What each journal fact means, in words rather than fact names (the kinds are listed in
// brain/rules/facts.py), and how an execution ended, with its evidence.
"use strict";

import { seconds, shortJson } from "./api.js";

function call(f) {
  return `${f.tool || "a tool"} (${f.call_id || f.execution_id || "?"})`;
}

const AWAITS = {
  approval: "a person's approval", result: "a person's result (a manual tool)",
  clock: "its time (a sleep)", signal: "a signal",
  batch: "the calls of its batch", admission: "its turn in its batch",
};

// How an execution's outcome came about, by its ``how``.
export const HOW = {
  ran: "ran",
  verified_by_query: "verified by query: its worker died inside the tool, and the worker that took it "
    + "over asked the external system about its operation id instead of running it again",
  reconciled: "reconciled by an operator, with evidence",
  rejected: "refused by the Brain before anything was sent",
  denied: "denied by a person",
  manual: "answered by a person",
  approved: "approved by a person",
  slept: "its sleep ended",
  timed_out: "its wait for a signal timed out",
  signalled: "answered by its signal",
  batch: "every call of the batch settled",
  not_run: "not run: its batch stopped after a failure",
  awaiting_batch: "waits for the calls of its batch",
  awaiting_admission: "waits for its turn in its batch",
  awaiting_clock: "waits for its time (a sleep)",
  awaiting_signal: "waits for a signal",
  awaiting_approval: "waits for a person's approval",
  awaiting_result: "waits for a person's result",
};

export function howWords(how) {
  return HOW[how] || how || "";
}

// ``kind``: a tone for the line ("bad", "good", "warn", "mark" or "").
export function say(fact, entry = {}) {
  const k = fact.kind || "";
  const s = (text, kind = "") => ({ text, kind });
  switch (k) {
    case "turn.accepted":
      return s(`The turn was accepted: “${(fact.input || {}).text || ""}” (request ${fact.request_id}).`);
    case "turn.run_started":
      return s(`Run ${fact.run} began at phase ${fact.phase}, on ${fact.owner || "a Brain"}.`);
    case "turn.prepared":
      return s("The input joined the thread's conversation.");
    case "turn.waiting":
      return s(`The turn waits for ${fact.waiting_for}.`, "warn");
    case "turn.model_replied": {
      const m = fact.message || {};
      const calls = (m.tool_calls || []).map((c) => `${c.tool}(${shortJson(c.args, 80)})`);
      const latency = fact.call && fact.call.latency_ms !== undefined ? ` in ${seconds(fact.call.latency_ms)}` : "";
      const tokens = tokensOf(fact.usage);
      const said = m.text ? ` “${shortJson(m.text, 200)}”` : "";
      const asks = calls.length ? ` It asks for ${calls.join(", ")}.` : "";
      const attempt = fact.attempt > 1 ? ` (attempt ${fact.attempt})` : "";
      return s(`The model replied${attempt}${latency}${tokens ? ` (${tokens})` : ""}.${said}${asks}`);
    }
    case "message.superseded":
      return s(`Attempt ${fact.attempt} of message ${fact.message_id} was superseded: ${fact.why}.`, "warn");
    case "execution.intended":
      return s(`${call(fact)} was committed as execution ${fact.execution_id}, before anything was sent.`);
    case "execution.pending":
      return s(`${call(fact)} waits for ${AWAITS[fact.awaits] || "a person"}.`, "warn");
    case "execution.approved":
      return s(`A person approved ${call(fact)}: it is sent to its Hands.`, "good");
    case "execution.accepted":
      return s(`${call(fact)} was accepted by Hands worker ${fact.worker || "?"}.`);
    case "execution.running":
      if (fact.reason === "rerun_after_crash") {
        return s(`${call(fact)} runs again (attempt ${fact.attempt}) on ${fact.worker || "another worker"}: `
          + "the worker running it died, and the tool is safe to run again.", "mark");
      }
      return s(`${call(fact)} started (attempt ${fact.attempt || 1}) on ${fact.worker || "a Hands worker"}.`);
    case "execution.succeeded":
      // A result that did not come from running the tool once (a query, a reconcile) stands out.
      return s(`${call(fact)} succeeded: ${howWords(fact.how || "ran")}.`,
        ["ran", "manual", "approved", "slept", "signalled", undefined].includes(fact.how) ? "good" : "mark");
    case "execution.failed":
      return s(`${call(fact)} failed: ${howWords(fact.how || "ran")}.`, "bad");
    case "execution.unknown":
      return s(`${call(fact)} is UNKNOWN: ${fact.reason || "its effect cannot be confirmed"}. `
        + "The turn waits until an operator reconciles it.", "bad");
    case "execution.cancelled":
      return s(`${call(fact)} was cancelled${fact.reason ? `: ${fact.reason}` : ""}.`, "warn");
    case "execution.output":
      return s(`${call(fact)} wrote ${fact.size} bytes of output (attempt ${fact.attempt || 1}): `
        + `“${shortJson(fact.text, 200)}”${fact.cut ? " (cut short here)" : ""}.`);
    case "execution.output_gap":
      return s(`${call(fact)}: its output from byte ${fact.start} to ${fact.end} never came.`, "bad");
    case "execution.input_required":
      return s(`${call(fact)} asks a person for input: “${shortJson(fact.message, 200)}”.`, "warn");
    case "execution.input_given":
      return s(`A person ${fact.decision === "decline" ? "declined it" : "gave it"}; the answer goes to `
        + `its Hands, and ${call(fact)} goes on.`, "good");
    case "execution.reported_late":
      return s(`${call(fact)} was reported ${fact.reported} after its turn had settled it.`, "warn");
    case "turn.results_applied":
      // a batch's children (exe-bN-...) are applied with their batch but are no calls of the model's
      return s(`The results of ${(fact.executions || []).filter((id) => !/^exe-b\d+-[^-]+$/.test(id)).length} `
        + `tool call(s) went to the model.`);
    case "turn.retry_scheduled":
      return s(`A passing fault: ${fact.error}. Retry ${fact.retry} in ${fact.in_seconds} s.`, "warn");
    case "turn.run_lost":
      return fact.how === "died"
        ? s(`Run ${fact.run} was lost: its Brain died at phase ${fact.phase}. Another run takes over.`, "bad")
        : s(`Run ${fact.run} ended at phase ${fact.phase}: its Brain stopped. Another run takes over.`, "warn");
    case "control.received":
      return s(`A ${fact.control} (control #${fact.control_id}) was received; it applies at the next boundary.`);
    case "control.applied":
      return s(`The ${fact.control} (control #${fact.control_id}) was applied`
        + `${fact.reason ? `: ${fact.reason}` : ""}.`, "good");
    case "control.rejected":
      return s(`The ${fact.control} (control #${fact.control_id}) was rejected: ${fact.reason}.`, "warn");
    case "turn.input_added":
      return s(`A ${fact.control} added: “${fact.text}”.`);
    case "turn.cancelled":
      return s("The turn was cancelled.", "warn");
    case "turn.rolled_back":
      return s(`Rolled back by turn ${fact.by}: its messages left the conversation (kept here).`, "warn");
    case "turn.completed":
      return s("The turn completed.", "good");
    case "turn.failed":
      return s(`The turn failed: ${(fact.error || {}).message || "?"}.`, "bad");
    case "history.message":
      return s(`A ${fact.role} message (kept by an earlier version).`);
    case "batch.accepted":
      return s(`Batch ${fact.call_id} accepted: ${fact.size} calls of ${fact.tool}, ${fact.mode}`
        + ` (at most ${fact.mode === "ordered" ? 1 : fact.limit} at once), ${fact.on_failure}.`);
    case "batch.progress": {
      const what = [];
      if (fact.admitted) what.push(`${fact.admitted.length} call(s) started`);
      if (fact.skipped) what.push(`${fact.skipped} call(s) will not run`);
      if (fact.ended) what.push(`it ${fact.ended}`);
      return s(`Batch ${fact.call_id}: ${what.join(", ") || "progress"} (${fact.done} done, ${fact.failed} failed, `
        + `${fact.in_flight} running, ${fact.waiting} waiting).`, fact.ended === "failed" ? "bad" : "");
    }
    case "thread.forked":
    case "thread.rewound": {
      const snapped = fact.snapped_to !== fact.at ? ` (snapped back to ${fact.snapped_to})` : "";
      const from = k === "thread.forked" ? `Forked from thread ${fact.from}` : "Set back";
      return s(`${from} at ${fact.at}${snapped}: ${(fact.messages || []).length} message(s).`);
    }
    default:
      return s(k.replace(/[._]/g, " "));
  }
}

// A model call's usage as people read it: "12 prompt, 30 completion tokens" (other counts as they
// are named, e.g. the scripted model's "1 steps").
export function tokensOf(usage) {
  if (!usage) return "";
  const entries = Object.entries(usage).filter(([, v]) => typeof v === "number");
  const tokens = entries.filter(([k]) => k.endsWith("_tokens")).map(([k, v]) => `${v} ${k.slice(0, -7).replace(/_/g, " ")}`);
  const other = entries.filter(([k]) => !k.endsWith("_tokens")).map(([k, v]) => `${v} ${k.replace(/_/g, " ")}`);
  return [tokens.length ? tokens.join(", ") + " tokens" : "", ...other].filter(Boolean).join(", ");
}
