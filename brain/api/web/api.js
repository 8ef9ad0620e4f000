// The public HTTP API as the console uses it: requests with the caller's bearer token, and a
// turn's journal followed live over Server-Sent Events, resumed from the last entry seen.
"use strict";

export function token() {
  return (document.getElementById("token").value || "").trim();
}

function headers(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: "Bearer " + t } : extra;
}

export async function api(path, options = {}) {
  const init = { ...options, headers: headers(options.headers || {}) };
  if (options.json !== undefined) {
    init.method = init.method || "POST";
    init.body = JSON.stringify(options.json);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const said = (body.error && body.error.message) || response.statusText;
    const error = new Error(said);
    error.status = response.status;
    throw error;
  }
  body.httpStatus = response.status;
  return body;
}

export const q = encodeURIComponent;

// Follows a session's journal (narrowed to one turn) from ``cursor`` on: ``onEntry`` gets each
// journal entry once, in order; ``onPreview`` the pieces of a reply being written (never stored);
// ``onState`` "live" or "reconnecting". After a cut it starts again from the last entry seen, so
// nothing is missed or shown twice. EventSource cannot send a bearer token: fetch reads the stream.
export class Follower {
  constructor({ session, thread, turn, onEntry, onPreview, onState, onResync }) {
    Object.assign(this, { session, thread, turn, onEntry, onPreview, onState, onResync });
    this.cursor = 0;
    this.abort = new AbortController();
    this.stopped = false;
  }

  stop() {
    this.stopped = true;
    this.abort.abort();
  }

  async run() {
    while (!this.stopped) {
      const url = `/v1/sessions/${q(this.session)}/stream?thread=${q(this.thread)}&turn=${q(this.turn)}`
        + `&cursor=${this.cursor}&previews=true`;
      try {
        const response = await fetch(url, { headers: headers(), signal: this.abort.signal });
        if (!response.ok) throw new Error(((await response.json()).error || {}).message || response.statusText);
        this.onState("live");
        await this.read(response.body.pipeThrough(new TextDecoderStream()).getReader());
      } catch (error) {
        if (this.stopped) return;
      }
      if (this.stopped) return;
      this.onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }

  async read(reader) {
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        this.dispatch(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
      }
    }
  }

  dispatch(block) {
    const event = { event: "message", data: "" };
    for (const line of block.split("\n")) {
      const colon = line.indexOf(":");
      if (colon <= 0) continue;
      const field = line.slice(0, colon);
      const text = line.slice(colon + 1).replace(/^ /, "");
      if (field === "data") event.data += text;
      else event[field] = text;
    }
    if (event.event === "entry") {
      const entry = JSON.parse(event.data);
      if (entry.seq <= this.cursor) return;
      this.cursor = entry.seq;
      this.onEntry(entry);
    } else if (event.event === "preview") {
      this.onPreview(JSON.parse(event.data));
    } else if (event.event === "resync") {
      this.cursor = JSON.parse(event.data).cursor;
      this.onResync();
    }
  }
}

// ---- small helpers for building the page --------------------------------------------------

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function badge(status) {
  return el("span", { class: "status " + status, dataset: { status } }, status);
}

export function clock(at) {
  // The time of day in the browser's zone, to the millisecond.
  if (!at) return "";
  const d = new Date(at);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function when(at) {
  // A date and time people read: today's as a time, an older one with its date.
  if (!at) return "";
  const d = new Date(at);
  const today = new Date().toDateString() === d.toDateString();
  return today ? clock(at).slice(0, 8) : d.toLocaleDateString() + " " + clock(at).slice(0, 8);
}

export function seconds(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  if (ms > 0 && ms < 1) return "<1 ms";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const m = Math.floor(ms / 60000);
  return `${m} min ${Math.round((ms % 60000) / 1000)} s`;
}

export function ago(at) {
  if (!at) return "";
  return seconds(Date.now() - new Date(at).getTime()) + " ago";
}

export function shortJson(value, limit = 160) {
  if (value === null || value === undefined) return "";
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > limit ? text.slice(0, limit - 1) + "…" : text;
}

export const ENDED = new Set(["completed", "failed", "cancelled"]);
