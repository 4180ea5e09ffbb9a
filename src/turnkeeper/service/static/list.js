// The session list: counts by status (each a filter), a search by id, and a page of
// sessions, the most recently active first; paged on the server, and read again every
// two seconds (at once while the service is still reading the log).

import {
  Unauthorized,
  ago,
  api,
  boot,
  el,
  locked,
  markPainted,
  notice,
  number,
  statusBadge,
  when,
} from "./api.js";

const STATUSES = [
  "running",
  "requires_action",
  "awaiting_approval",
  "idle",
  "errored",
  "halted",
  "failed",
  "cancelled",
  "unreadable",
];
const PAGE = 50;
const REFRESH_MS = 2000;
const INDEXING_MS = 0; // at once: each request reads on in the log

const params = new URLSearchParams(location.search);
const view = {
  status: STATUSES.includes(params.get("status")) ? params.get("status") : null,
  search: params.get("q") || "",
  // The cursor of each page from the first to the one shown (null: the first).
  cursors: [null],
  timer: null,
  generation: 0,
};
let rendered = false;

function remember() {
  const query = new URLSearchParams();
  if (view.status) {
    query.set("status", view.status);
  }
  if (view.search) {
    query.set("q", view.search);
  }
  const search = query.toString();
  history.replaceState(null, "", search ? `?${search}` : location.pathname);
}

function refilter(change) {
  Object.assign(view, change, { cursors: [null] });
  remember();
  load();
}

function chip(label, status, count) {
  const chosen = view.status === status;
  return el(
    "button",
    {
      type: "button",
      class: `chip${chosen ? " chosen" : ""}${count ? "" : " none"}`,
      "aria-pressed": chosen ? "true" : "false",
      "data-status": status ?? "all",
      on: { click: () => refilter({ status }) },
    },
    status ? statusBadge(status) : el("span", { class: "badge", text: label }),
    el("span", { class: "count", text: number(count) }),
  );
}

function row(session) {
  const link = el("a", {
    href: `/ui/sessions/${encodeURIComponent(session.session_id)}`,
    class: "id",
    text: session.session_id,
  });
  const tokens = session.usage.prompt_tokens + session.usage.completion_tokens;
  return el(
    "tr",
    { "data-session": session.session_id },
    el("td", {}, link, session.prompt ? el("div", { class: "prompt", text: session.prompt }) : null),
    el("td", {}, statusBadge(session.status)),
    el("td", { title: when(session.last_at), text: ago(session.last_at) }),
    el("td", { class: "num", text: number(session.events) }),
    el("td", { class: "num", text: number(session.polls) }),
    el("td", {
      class: "num",
      title: `${number(session.usage.prompt_tokens)} in, ${number(session.usage.completion_tokens)} out`,
      text: number(tokens),
    }),
    el("td", { class: "model", text: session.model }),
    el("td", { class: "reason", text: session.error ?? session.stop_reason ?? "" }),
  );
}

function render(data) {
  document.getElementById("source").textContent = data.live
    ? `live host · ${data.source}`
    : `read-only · ${data.source}`;
  document.getElementById("statuses").replaceChildren(
    chip("all", null, data.total),
    ...STATUSES.filter((status) => data.counts[status] || status !== "unreadable").map((status) =>
      chip(status, status, data.counts[status] ?? 0),
    ),
  );
  const first = (view.cursors.length - 1) * PAGE;
  const shown = data.sessions.length;
  const parts = [
    shown
      ? `${number(first + 1)}–${number(first + shown)} of ${number(data.matched)}`
      : `0 of ${number(data.matched)}`,
    `${number(data.total)} sessions in the log`,
  ];
  if (data.indexing) {
    parts.push("reading the log…");
  }
  document.getElementById("summary").textContent = parts.join(" · ");
  document.querySelector("#sessions tbody").replaceChildren(...data.sessions.map(row));
  document.getElementById("empty").hidden = shown > 0;
  const older = document.getElementById("older");
  older.disabled = !data.next_cursor;
  older.dataset.cursor = data.next_cursor ?? "";
  document.getElementById("newer").disabled = view.cursors.length < 2;
  if (!rendered) {
    rendered = true;
    markPainted("turnkeeper:list-rendered");
  }
}

async function load() {
  clearTimeout(view.timer);
  const generation = ++view.generation;
  const query = new URLSearchParams({ limit: String(PAGE) });
  if (view.status) {
    query.set("status", view.status);
  }
  if (view.search) {
    query.set("search", view.search);
  }
  const cursor = view.cursors.at(-1);
  if (cursor) {
    query.set("cursor", cursor);
  }
  let data;
  try {
    data = await api(`/v1/inspector/sessions?${query}`);
  } catch (error) {
    if (error instanceof Unauthorized) {
      locked(error);
      return;
    }
    notice(`The service did not answer: ${error.message}`);
    view.timer = setTimeout(load, REFRESH_MS);
    return;
  }
  if (generation !== view.generation) {
    return; // a newer load (another filter, page or refresh) is on its way
  }
  notice("");
  render(data);
  view.timer = setTimeout(load, data.indexing ? INDEXING_MS : REFRESH_MS);
}

function wire() {
  const search = document.getElementById("search");
  search.value = view.search;
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => refilter({ search: search.value.trim() }), 250);
  });
  document.getElementById("older").addEventListener("click", (event) => {
    view.cursors.push(event.currentTarget.dataset.cursor);
    load();
  });
  document.getElementById("newer").addEventListener("click", () => {
    view.cursors.pop();
    load();
  });
}

wire();
boot(load);
