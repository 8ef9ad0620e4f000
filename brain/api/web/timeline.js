// The timeline picture of a turn: its runs, its model calls and its tool executions as bars on a
// time axis, with numbered marks where a process died, a run or a tool was taken over, a result
// was verified by a query instead of a second run, an execution became UNKNOWN and where it was
// reconciled. Everything is read from the journal entries (their times are commit times).
"use strict";

import { clock, el, seconds } from "./api.js";

const SVG = "http://www.w3.org/2000/svg";
const LABEL = 170; // px for the row names
const ROW = 24;
const AXIS = 26;

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const FINAL = new Set(["succeeded", "failed", "cancelled"]);
const RAN = new Set(["accepted", "running", "approved"]);
const COLOUR_WORDS = {
  intended: "committed, not taken yet", pending: "waits for a person", running: "running", succeeded: "succeeded",
  failed: "failed", unknown: "UNKNOWN", cancelled: "cancelled",
};
const SYMBOL = { died: "✕", takeover: "↻", verified: "◆", unknown: "?", reconciled: "✓", stopped: "■" };

// A Hands worker's death is known when the worker that took its execution over reports what it
// did about it (an UNKNOWN, a verification, a re-run): the mark stands there, not at the death.
function died(row) {
  return `the worker running ${row.name} died inside the tool (found when another worker took it over)`;
}

// What the journal says happened, as rows of bars and a list of marks.
export function layout(entries, executions, ended) {
  const at = (e) => new Date(e.at).getTime();
  const start = entries.length ? at(entries[0]) : Date.now();
  const last = entries.length ? at(entries[entries.length - 1]) : start;
  const end = ended ? last : Math.max(last, Date.now());
  const runs = { name: "runs", bars: [] };
  const model = { name: "model calls", bars: [] };
  const tools = new Map(); // execution id -> row
  const marks = [];
  const names = new Map(executions.map((x) => [x.id, `${x.tool} (${x.call_id})`]));
  const toolRow = (f) => {
    if (!tools.has(f.execution_id)) {
      tools.set(f.execution_id, { name: names.get(f.execution_id) || `${f.tool} (${f.call_id})`, bars: [],
        id: f.execution_id });
    }
    return tools.get(f.execution_id);
  };
  let run = null;
  let lostBefore = false;
  const mark = (kind, t, row, text) => marks.push({ kind, t, row, text, n: marks.length + 1 });
  for (const entry of entries) {
    const t = at(entry);
    for (const f of entry.facts) {
      const k = f.kind;
      if (k === "turn.run_started") {
        if (run) run.to = t;
        run = { from: t, to: null, status: "running", label: `run ${f.run}` };
        runs.bars.push(run);
        if (lostBefore) mark("takeover", t, runs, `run ${f.run} took the turn over, on ${f.owner}`);
        lostBefore = false;
      } else if (k === "turn.run_lost") {
        if (run) { run.to = t; run.status = "failed"; run = null; }
        lostBefore = true;
        mark(f.how === "died" ? "died" : "stopped", t, runs, f.how === "died"
          ? `the Brain running run ${f.run} died (at phase ${f.phase})`
          : `the Brain running run ${f.run} stopped (at phase ${f.phase})`);
      } else if (k === "turn.model_replied") {
        const ms = (f.call && f.call.latency_ms) || 0;
        model.bars.push({ from: t - ms, to: t, status: "succeeded", label: `model call ${(f.call || {}).number || ""}` });
      } else if (k.startsWith("execution.")) {
        const row = toolRow(f);
        const status = k.slice("execution.".length);
        if (status === "reported_late") continue;
        // One segment per state it was in (intended, pending, accepted, running, UNKNOWN...), the
        // last one coloured by how it ended.
        const open = row.bars[row.bars.length - 1];
        if (open && open.to === null) open.to = t;
        if (!FINAL.has(status)) row.bars.push({ from: t, to: null, status });
        else if (open && RAN.has(open.status)) open.status = status; // it ran, and ended so
        else row.bars.push({ from: t, to: t, status }); // an end after a wait (UNKNOWN, a person)
        if (status === "running" && f.reason === "rerun_after_crash") {
          mark("died", t, row, died(row));
          mark("takeover", t, row, `${row.name} runs again on ${f.worker || "another worker"} (a safe tool)`);
        }
        if (status === "unknown") {
          // The Hands say so when a worker's death made it UNKNOWN (their replay rule's words);
          // an outcome that could not be saved is UNKNOWN too, with no death.
          if (/^worker died/.test(f.reason || "")) {
            mark("died", t, row, died(row));
          }
          mark("unknown", t, row, `${row.name} became UNKNOWN: ${f.reason || ""}`);
        }
        if (f.how === "verified_by_query") {
          mark("died", t, row, died(row));
          mark("verified", t, row, `${row.name} was verified by a query of its operation id, not run again`);
        }
        if (f.how === "reconciled") mark("reconciled", t, row, `${row.name} was reconciled by an operator`);
      }
    }
    // A run ends where it leaves the turn waiting, paused or ended (its lease given up).
    if (run && ["waiting", "paused", "completed", "failed", "cancelled"].includes(entry.status)) {
      run.to = t;
      run = null;
    }
  }
  // A call's start is journaled only for agents that ask for every step: the state its row has
  // now colours the segment still open (running, say, rather than committed).
  for (const row of tools.values()) {
    const open = row.bars[row.bars.length - 1];
    const now = executions.find((x) => x.id === row.id);
    if (open && open.to === null && now && !FINAL.has(now.status)) open.status = now.status;
  }
  return { start, end, rows: [runs, model, ...tools.values()], marks };
}

export function draw(container, entries, executions, ended) {
  const { start, end, rows, marks } = layout(entries, executions, ended);
  const width = Math.max(container.clientWidth || 900, 500);
  const span = Math.max(end - start, 1);
  const x = (t) => LABEL + ((t - start) / span) * (width - LABEL - 16);
  const height = AXIS + rows.length * ROW + 8;
  const picture = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "timeline", role: "img" });
  picture.append(svg("title", {}, "the turn's timeline"));
  axis(picture, start, span, x, height);
  rows.forEach((row, i) => {
    const y = AXIS + i * ROW;
    row.y = y;
    picture.append(svg("text", { x: 6, y: y + 15, class: "row-name" }, row.name));
    picture.append(svg("line", { x1: LABEL, x2: width - 8, y1: y + ROW - 2, y2: y + ROW - 2, class: "row-line" }));
    for (const bar of row.bars) {
      const from = x(bar.from);
      const to = x(bar.to ?? end);
      const rect = svg("rect", { x: from, y: y + 5, width: Math.max(to - from, 3), height: ROW - 12, rx: 2,
        class: "bar " + bar.status });
      rect.append(svg("title", {}, `${bar.label || row.name}: ${bar.status}, ${seconds((bar.to ?? end) - bar.from)}`));
      picture.append(rect);
    }
  });
  // Marks of one row closer than a mark's width are drawn side by side (the later one at its
  // time, the earlier ones to its left); the list below gives each one's exact time.
  const at = new Map();
  for (const row of rows) {
    let right = Infinity;
    for (const m of marks.filter((k) => k.row === row).sort((a, b) => b.t - a.t || b.n - a.n)) {
      at.set(m, Math.min(x(m.t), right - 18));
      right = at.get(m);
    }
  }
  for (const m of marks) {
    const cx = at.get(m);
    const cy = m.row.y + 12;
    const group = svg("g", { class: "mark " + m.kind, "data-mark": m.kind });
    group.append(svg("circle", { cx, cy, r: 8 }));
    group.append(svg("text", { x: cx, y: cy + 4, "text-anchor": "middle" }, SYMBOL[m.kind]));
    group.append(svg("text", { x: cx + 10, y: cy - 6, class: "mark-number" }, String(m.n)));
    group.append(svg("title", {}, `${m.n}. ${m.text}`));
    picture.append(group);
  }
  const colours = el("p", { class: "colours dim" }, ["intended", "pending", "running", "succeeded", "failed",
    "unknown", "cancelled"].map((status) => el("span", { class: "swatch " + status }, COLOUR_WORDS[status])));
  const legend = el("ol", { class: "marks" }, marks.map((m) => el("li", { class: "mark-line " + m.kind,
    dataset: { mark: m.kind } }, el("span", { class: "symbol" }, SYMBOL[m.kind]), ` ${clock(m.t)} `,
    `(+${seconds(m.t - start)}) ${m.text}`)));
  container.replaceChildren(picture, colours, marks.length ? legend : el("p", { class: "dim" }, "No crash, "
    + "take-over, verification, UNKNOWN or reconcile in this turn."));
}

function axis(picture, start, span, x, height) {
  const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000, 600000];
  const step = steps.find((s) => span / s <= 8) || 3600000;
  for (let t = 0; t <= span; t += step) {
    const at = x(start + t);
    picture.append(svg("line", { x1: at, x2: at, y1: AXIS - 6, y2: height - 8, class: "tick" }));
    picture.append(svg("text", { x: at + 2, y: AXIS - 10, class: "tick-label" }, "+" + seconds(t)));
  }
}
