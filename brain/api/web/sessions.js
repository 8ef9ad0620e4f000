// The caller's sessions (searched, a page at a time), and one session's turns.
"use strict";

import { api, badge, el, q, shortJson, when } from "./api.js";

const PAGE = 20;

function link(href, text, go) {
  return el("a", { href, onclick: (event) => { event.preventDefault(); go(href); } }, text);
}

// ``params``: the page's query (``search``, ``after``); ``go``: navigate within the console.
export async function showSessions(main, params, go) {
  const search = params.get("search") || "";
  const after = params.get("after") || "";
  const box = el("input", { id: "search", type: "search", value: search, size: 32,
    placeholder: "session id, agent, request id or key=value" });
  const find = () => go(`?search=${q(box.value.trim())}`);
  box.addEventListener("keydown", (event) => { if (event.key === "Enter") find(); });
  const body = el("tbody", { id: "sessions" });
  const pager = el("div", { class: "pager" });
  main.replaceChildren(el("section", {},
    el("h2", {}, "Sessions"),
    el("div", { class: "toolbar" }, box, el("button", { id: "find", onclick: find }, "search"),
      search ? link("?", "show all", go) : null),
    el("table", { class: "list" },
      el("thead", {}, el("tr", {}, ["session", "latest turn", "status", "agent", "turns", "created", "updated"]
        .map((h) => el("th", {}, h)))),
      body),
    pager));
  const page = await api(`/v1/sessions?limit=${PAGE}&search=${q(search)}&after=${q(after)}`);
  for (const s of page.sessions) {
    const t = s.last_turn || {};
    const open = () => go(`?session=${q(s.id)}`);
    body.append(el("tr", { class: "row", dataset: { session: s.id }, onclick: open },
      el("td", {}, el("code", {}, s.id), s.closed_at ? el("span", { class: "dim" }, " closed") : null,
        Object.keys(s.metadata || {}).length ? el("div", { class: "dim" },
          Object.entries(s.metadata).map(([k, v]) => `${k}=${v}`).join(" · ")) : null),
      el("td", { class: "input" }, shortJson(t.input || "", 90)),
      el("td", {}, t.status ? badge(t.status) : ""),
      el("td", {}, t.agent_name ? `${t.agent_name} v${t.agent_version}` : ""),
      el("td", {}, `${s.turns}` + (s.unfinished ? ` (${s.unfinished} unfinished)` : "")),
      el("td", {}, when(s.created_at)),
      el("td", {}, when(t.updated_at))));
  }
  if (!page.sessions.length) {
    body.append(el("tr", {}, el("td", { colspan: 7, class: "dim" }, search
      ? `No session matches “${search}”.` : "No session yet: submit a turn (brain submit, or POST /v1/sessions/ID/turns).")));
  }
  if (after) pager.append(link(`?search=${q(search)}`, "« newest", go));
  if (page.next) pager.append(link(`?search=${q(search)}&after=${q(page.next)}`, "older »", go));
}

export async function showSession(main, session, params, go) {
  const after = Number(params.get("after") || 0);
  const body = el("tbody", { id: "turns" });
  const pager = el("div", { class: "pager" });
  const threads = el("p", { class: "dim", id: "threads" });
  main.replaceChildren(el("section", {},
    el("p", { class: "crumbs" }, link("?", "Sessions", go), " › ", el("code", {}, session)),
    el("h2", {}, "Session ", el("code", {}, session)),
    threads,
    el("table", { class: "list" },
      el("thead", {}, el("tr", {}, ["#", "input", "status", "agent", "thread", "accepted", "updated", "waits for"]
        .map((h) => el("th", {}, h)))),
      body),
    pager));
  const [found, turns] = await Promise.all([
    api(`/v1/sessions/${q(session)}/threads`),
    api(`/v1/sessions/${q(session)}/turns?limit=${PAGE}&after=${after}`),
  ]);
  threads.textContent = found.map((t) => `thread ${t.name}: agent ${t.agent_name} v${t.agent_version}, `
    + `${t.turns} turn(s)${t.unfinished ? `, ${t.unfinished} unfinished` : ""}${t.closed_at ? ", closed" : ""}`
    + (t.forked_from ? `, forked from ${t.forked_from} at ${t.forked_at}` : ""))
    .join(" · ");
  for (const t of turns) {
    const open = () => go(`?session=${q(session)}&turn=${q(t.id)}`);
    body.append(el("tr", { class: "row turn", dataset: { turn: t.id }, onclick: open },
      el("td", {}, `${t.seq}`),
      el("td", { class: "input" }, shortJson(t.input || "", 90)),
      el("td", {}, badge(t.status)),
      el("td", {}, `${t.agent_name} v${t.agent_version}`),
      el("td", {}, t.thread),
      el("td", {}, when(t.created_at)),
      el("td", {}, when(t.updated_at)),
      el("td", { class: "waits" }, ["waiting", "paused"].includes(t.status) ? t.waiting_for || "" : "")));
  }
  if (after) pager.append(link(`?session=${q(session)}`, "« first", go));
  if (turns.length === PAGE) {
    pager.append(link(`?session=${q(session)}&after=${turns[turns.length - 1].seq}`, "more »", go));
  }
}
