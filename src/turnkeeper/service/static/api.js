// What both pages share: the bearer token (typed once, kept in this tab's
// sessionStorage, sent as the Authorization header; never a cookie), calls to the JSON
// API, the event stream, and building elements. Every text from a session (a model's
// reply, a tool's result, a user's message) goes into the page as text: no markup is
// ever made from it.

const TOKEN_KEY = "turnkeeper.token";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, message, field) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

// `turnkeeper ui` prints an address with `#token=...`: the token is taken from there
// and the fragment dropped, so it is neither kept in the history nor ever sent.
function takeTokenFromFragment() {
  const found = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

function headers(extra = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}`, ...extra } : { ...extra };
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  let field = null;
  try {
    const body = await response.json();
    message = body.error.message;
    field = body.error.field;
  } catch {
    // Not the service's JSON error (a proxy's page, say): the status line says enough.
  }
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    return new Unauthorized(message);
  }
  return new ApiError(response.status, message, field);
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(), signal, cache: "no-store" };
  if (body !== undefined) {
    init.headers = headers({ "Content-Type": "application/json" });
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    throw await failure(response);
  }
  return response.json();
}

// A session's events from seq `after` on, as the service streams them (Server-Sent
// Events). EventSource cannot send an Authorization header, so the stream is read with
// fetch; on a break it reconnects with Last-Event-ID, losing and repeating nothing.
export async function tail(sessionId, after, onEvents, signal) {
  let last = after;
  const path = `/v1/sessions/${encodeURIComponent(sessionId)}/events/stream`;
  while (!signal.aborted) {
    try {
      const response = await fetch(path, {
        headers: headers({ "Last-Event-ID": String(last) }),
        signal,
        cache: "no-store",
      });
      if (!response.ok) {
        throw await failure(response);
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          break;
        }
        buffer += value;
        const found = [];
        let end = buffer.indexOf("\n\n");
        while (end >= 0) {
          const data = buffer
            .slice(0, end)
            .split("\n")
            .filter((line) => line.startsWith("data: "))
            .map((line) => line.slice(6))
            .join("\n");
          buffer = buffer.slice(end + 2);
          if (data) {
            const envelope = JSON.parse(data);
            last = envelope.seq;
            found.push(envelope);
          }
          end = buffer.indexOf("\n\n");
        }
        if (found.length) {
          onEvents(found);
        }
      }
    } catch (error) {
      if (signal.aborted || error instanceof Unauthorized) {
        if (!signal.aborted) {
          throw error;
        }
        return;
      }
    }
    await sleep(1000);
  }
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// An element with properties and children; strings become text nodes, never markup.
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (key === "class") {
      node.className = value;
    } else if (key === "text") {
      node.textContent = String(value);
    } else if (key === "on") {
      for (const [name, handler] of Object.entries(value)) {
        node.addEventListener(name, handler);
      }
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null && child !== false) {
      node.append(child);
    }
  }
  return node;
}

// Formatters made once: toLocaleString makes one at each call, which for a timeline of
// thousands of events was most of the time it took to draw.
const NUMBERS = new Intl.NumberFormat("en");
const TIMES = new Intl.DateTimeFormat("en-GB", { dateStyle: "short", timeStyle: "medium" });

export function number(value) {
  return NUMBERS.format(value);
}

export function ago(at) {
  const seconds = Math.max(0, Date.now() / 1000 - at);
  if (seconds < 60) {
    return `${Math.floor(seconds)} s ago`;
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)} min ago`;
  }
  if (seconds < 86400) {
    return `${Math.floor(seconds / 3600)} h ago`;
  }
  return `${Math.floor(seconds / 86400)} d ago`;
}

export function when(at) {
  return TIMES.format(new Date(at * 1000));
}

// Marks `name` once the page has painted what was just drawn (after the next frame), so
// that the mark's time is when a person sees it.
export function markPainted(name) {
  requestAnimationFrame(() => setTimeout(() => performance.mark(name), 0));
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, text: status.replace("_", " ") });
}

// Starts the page: `start` runs once now, and again each time a token is typed into the
// form, which `locked` shows when the service refuses the token (or there is none).
export function boot(start) {
  takeTokenFromFragment();
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) {
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    input.value = "";
    document.getElementById("token").hidden = true;
    document.body.classList.remove("locked");
    start();
  });
  start();
}

// Shows the token form, saying why the service refused.
export function locked(error) {
  document.getElementById("token-why").textContent = error.message;
  document.getElementById("token").hidden = false;
  document.body.classList.add("locked");
  document.getElementById("token-input").focus();
}

export function notice(text) {
  const node = document.getElementById("notice");
  node.textContent = text || "";
  node.hidden = !text;
}
