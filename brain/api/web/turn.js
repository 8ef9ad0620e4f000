// A turn's page, followed live: its journal comes over the stream (resumed after a cut), and each
// new entry has the page read the turn again (its description and history) and redraw.
"use strict";

import { ENDED, Follower, api, badge, clock, el, q, seconds, when } from "./api.js";
import { approvals, conversation, modelCalls, readOutputs, toolCalls } from "./parts.js";
import { draw } from "./timeline.js";
import { say } from "./words.js";

// Which controls apply to a turn in each status (a control that does not apply is disabled).
const APPLIES = {
  pause: (s) => ["queued", "running", "waiting"].includes(s),
  resume: (s) => s === "paused",
  cancel: (s) => !ENDED.has(s),
  steer: (s) => !ENDED.has(s),
  inject: (s) => !ENDED.has(s),
};

export class TurnPage {
  constructor(main, session, turnId, go) {
    Object.assign(this, { main, session, turnId, go });
    this.entries = [];
    this.outputs = new Map();
    this.turn = null;
    this.reading = null;
    this.again = false;
  }

  close() {
    if (this.follower) this.follower.stop();
    clearInterval(this.timer);
  }

  async open() {
    const turn = await api(`/v1/turns/${q(this.turnId)}`);
    this.turn = turn;
    const part = (id, title, ...extra) => el("section", { id: `${id}-part` }, el("h3", {}, title), ...extra,
      el("div", { id }));
    const crumb = (href, text) => el("a", { href, onclick: (e) => { e.preventDefault(); this.go(href); } }, text);
    this.main.replaceChildren(
      el("p", { class: "crumbs" }, crumb("?", "Sessions"), " › ",
        crumb(`?session=${q(turn.session_id)}`, turn.session_id), " › ", el("code", {}, this.turnId)),
      el("h2", {}, "Turn ", el("code", { id: "turn-id" }, this.turnId), " ", el("span", { id: "turn-status" }),
        " ", el("span", { id: "live", class: "live" }, "connecting…")),
      el("p", { id: "turn-facts", class: "dim" }),
      el("div", { id: "waits", class: "banner", hidden: true }),
      el("div", { id: "turn-error", class: "banner bad", hidden: true }),
      this.controls(),
      el("section", { id: "approvals", class: "approvals", hidden: true }),
      part("timeline", "Timeline"),
      el("div", { class: "columns" }, part("messages", "Conversation"), part("calls", "Tool calls")),
      part("model", "Model calls"),
      part("journal", "Journal", el("p", { class: "dim" }, "Every committed entry of the turn, in words.")));
    this.render();
    this.follower = new Follower({
      session: turn.session_id, thread: turn.thread, turn: this.turnId,
      onEntry: (entry) => this.entry(entry),
      onPreview: (piece) => this.preview(piece),
      onResync: () => this.refresh(),
      onState: (state) => { this.live = state; this.render(); },
    });
    this.follower.run();
    // A call in progress changes without a journal entry (it starts, it writes output): looked at
    // every second while one is open.
    this.timer = setInterval(() => {
      if (this.turn && (this.turn.executions || []).some((x) => ["intended", "accepted", "running"].includes(x.status))) {
        this.refresh();
      }
    }, 1000);
    await this.refresh();
  }

  controls() {
    const text = el("input", { id: "steer-text", placeholder: "tell the agent…", size: 30 });
    const send = (kind) => async () => {
      const body = { kind };
      if (kind === "steer" || kind === "inject") body.text = text.value;
      if (kind === "resume") body.revision = this.turn.revision;
      this.said(await this.act(`/v1/turns/${q(this.turnId)}/controls`, body), kind);
    };
    const button = (kind) => el("button", { dataset: { kind }, onclick: send(kind) }, kind);
    return el("div", { class: "controls" }, button("pause"), button("resume"), button("cancel"), text,
      button("steer"), button("inject"), el("span", { id: "receipt" }));
  }

  async act(path, body) {
    try {
      const receipt = await api(path, { json: body });
      await this.refresh();
      return receipt;
    } catch (error) {
      return { status: error.message };
    }
  }

  said(receipt, what) {
    const reason = receipt.reason ? ` (${receipt.reason})` : "";
    document.getElementById("receipt").textContent = `${what}: ${receipt.status}${reason}`;
  }

  async answer(call, body, problem) {
    if (problem) return this.said({ status: problem }, "respond");
    const receipt = await this.act(`/v1/turns/${q(this.turnId)}/respond`, { call, ...body });
    this.said(receipt, `${body.decision} ${call}`);
  }

  entry(entry) {
    this.entries.push(entry);
    const start = new Date(this.entries[0].at).getTime();
    const list = document.getElementById("journal");
    for (const fact of entry.facts) {
      const { text, kind } = say(fact, entry);
      list.append(el("div", { class: "entry " + kind, dataset: { seq: entry.seq, kind: fact.kind } },
        el("span", { class: "at" }, clock(entry.at)),
        el("span", { class: "since" }, `+${seconds(new Date(entry.at).getTime() - start)}`),
        el("span", { class: "seq" }, `#${entry.seq}`), el("span", { class: "words" }, text)));
    }
    // A committed reply replaces its previews; a superseded attempt's previews are void.
    for (const f of entry.facts) {
      if (f.kind === "turn.model_replied" || f.kind === "message.superseded") {
        const only = f.kind === "message.superseded" ? `${f.message_id}#${f.attempt}` : null;
        document.querySelectorAll(".msg.preview")
          .forEach((p) => { if (only === null || p.dataset.attempt === only) p.remove(); });
      }
    }
    this.refresh();
  }

  preview(piece) {
    if (piece.turn_id !== this.turnId || !piece.text) return;
    const box = document.getElementById("messages");
    // One box per attempt of a message: a new attempt's text starts over, never runs on.
    const attempt = `${piece.message_id}#${piece.attempt}`;
    box.querySelectorAll(".msg.preview").forEach((p) => { if (p.dataset.attempt !== attempt) p.remove(); });
    const last = box.querySelector(".msg.preview")
      || box.appendChild(el("div", { class: "msg preview", dataset: { attempt } }));
    last.textContent += piece.text;
  }

  // Read the turn again; calls that come while a read runs are folded into one more read.
  async refresh() {
    if (this.reading) { this.again = true; return this.reading; }
    this.reading = (async () => {
      do {
        this.again = false;
        try {
          const [turn, history] = await Promise.all([
            api(`/v1/turns/${q(this.turnId)}`), api(`/v1/turns/${q(this.turnId)}/history`)]);
          this.turn = turn;
          this.history = history;
          await readOutputs(turn.executions, this.outputs);
          document.getElementById("problem").textContent = ""; // a read after a cut came through
          this.render();
        } catch (error) {
          document.getElementById("problem").textContent = error.message;
        }
      } while (this.again);
      this.reading = null;
    })();
    return this.reading;
  }

  render() {
    const t = this.turn;
    if (!t || !document.getElementById("turn-status")) return;
    document.getElementById("turn-status").replaceChildren(badge(t.status));
    this.main.dataset.status = t.status;
    // "live" while the stream is open (an ended turn's stream stays open for late reports).
    const live = this.live === "reconnecting" ? "reconnecting… (the journal resumes where it stopped)"
      : this.live === "live" ? (ENDED.has(t.status) ? "ended" : "live") : "connecting…";
    document.getElementById("live").textContent = live;
    this.main.dataset.live = this.live || "connecting";
    const ended = ENDED.has(t.status) && this.entries.length ? this.entries[this.entries.length - 1].at : null;
    document.getElementById("turn-facts").textContent = `thread ${t.thread} · request ${t.request_id} · `
      + `accepted ${when(t.created_at)}` + (ended ? ` · ended ${when(ended)} (${seconds(new Date(ended) - new Date(t.created_at))})` : "")
      + ` · ${t.runs} run(s) · revision ${t.revision}`;
    const waits = document.getElementById("waits");
    waits.hidden = !["waiting", "paused", "queued"].includes(t.status);
    waits.textContent = t.status === "queued" ? "Waits for a Brain to claim it (or for the turn before it in its thread)."
      : `Waits for ${t.waiting_for || "its tools"}.`;
    const error = document.getElementById("turn-error");
    error.hidden = !t.error;
    error.textContent = t.error ? `${t.error.code}: ${t.error.message}` : "";
    for (const button of this.main.querySelectorAll(".controls button")) {
      button.disabled = !APPLIES[button.dataset.kind](t.status);
    }
    document.getElementById("steer-text").disabled = ENDED.has(t.status);
    approvals(document.getElementById("approvals"), t.executions, (c, b, p) => this.answer(c, b, p));
    conversation(document.getElementById("messages"), t.history);
    toolCalls(document.getElementById("calls"), t.executions, this.outputs);
    if (this.history) modelCalls(document.getElementById("model"), this.history);
    draw(document.getElementById("timeline"), this.entries, t.executions, ENDED.has(t.status));
  }
}
