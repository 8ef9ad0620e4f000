// The console's navigation: the page's query says what it shows (`?` the sessions, `?session=S`
// a session's turns, `?session=S&turn=T` a turn followed live, `?view=operator` what waits for an
// operator), so every view has an address that can be shared or reloaded.
"use strict";

import { showOperator } from "./operator.js";
import { showSession, showSessions } from "./sessions.js";
import { TurnPage } from "./turn.js";

const main = document.getElementById("main");
const tokenBox = document.getElementById("token");
const start = new URLSearchParams(location.search);
tokenBox.value = start.get("token") || localStorage.getItem("tendon.token") || "";
tokenBox.addEventListener("change", () => {
  localStorage.setItem("tendon.token", tokenBox.value.trim());
  show();
});
let page = null;

function go(href) {
  history.pushState(null, "", href === "?" ? location.pathname : href);
  show();
}

async function show() {
  if (page) page.close();
  page = null;
  document.getElementById("problem").textContent = "";
  const params = new URLSearchParams(location.search);
  params.delete("token"); // a token in the address is taken once, not kept in every link
  const session = params.get("session");
  const turn = params.get("turn");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("here", a.dataset.view === (params.get("view") || "sessions"));
  try {
    if (params.get("view") === "operator") await showOperator(main, go);
    else if (turn) {
      page = new TurnPage(main, session, turn, go);
      await page.open();
    } else if (session) await showSession(main, session, params, go);
    else await showSessions(main, params, go);
  } catch (error) {
    document.getElementById("problem").textContent = error.message;
    main.dataset.problem = error.status || "error";
  }
}

for (const a of document.querySelectorAll("nav a")) {
  a.addEventListener("click", (event) => { event.preventDefault(); go(a.getAttribute("href")); });
}
window.addEventListener("popstate", show);
show();
