// A session: its summary, a timeline of every event (each kind drawn as what it is,
// its raw JSON on a click), a live tail over the event stream, the what-if re-check,
// and, where a live host runs it, the actions that drive it.

import {
  ApiError,
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
  tail,
  when,
} from "./api.js";

const sessionId = decodeURIComponent(location.pathname.split("/").pop());
const base = `/v1/sessions/${encodeURIComponent(sessionId)}`;
const GUARD_EVENTS = new Set([
  "local.directive",
  "local.duplicate_tool_call",
  "local.reply_replaced",
  "local.halted",
  "local.terminal",
]);
const INPUTS = new Set(["local.user_message", "local.tool_results"]);

const page = {
  controller: null,
  live: false,
  started: null, // the first event's time
  last: 0, // the last seq drawn
  poll: 0, // polls so far: each input (a user message, tool results) starts one
  calls: new Map(), // tool call id -> {name, at}: the call's name and when it was made
  returned: new Map(), // tool call id -> the text of its last local.tool_result
  items: new Map(), // seq -> the timeline item
  envelopes: new Map(), // seq -> the envelope
  refreshing: null,
  rendered: false,
};

// -- drawing events ----------------------------------------------------------------

function textOf(content) {
  if (typeof content === "string") {
    return content;
  }
  if (Array.isArray(content)) {
    return content
      .filter((part) => part && typeof part.text === "string")
      .map((part) => part.text)
      .join("");
  }
  return null;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function argumentsOf(call) {
  const raw = call.function?.arguments;
  if (typeof raw !== "string") {
    return pretty(raw ?? {});
  }
  try {
    return pretty(JSON.parse(raw));
  } catch {
    return raw;
  }
}

function seconds(delta) {
  if (delta < 1) {
    return `${Math.round(delta * 1000)} ms`;
  }
  return delta < 10 ? `${delta.toFixed(2)} s` : `${delta.toFixed(1)} s`;
}

function text(value, kind = "text") {
  return el("div", { class: kind, text: value });
}

function code(value) {
  return el("pre", { class: "code", text: value });
}

function line(...parts) {
  return el("p", { class: "line" }, ...parts);
}

function strong(value) {
  return el("strong", { text: value });
}

function took(callId, at) {
  const call = page.calls.get(callId);
  return call ? el("span", { class: "took", text: `took ${seconds(at - call.at)}` }) : null;
}

// Each kind of event as what it is: a title, and what it holds.
function describe(envelope) {
  const event = envelope.event;
  const at = envelope.at;
  switch (event.type) {
    case "local.session_opened": {
      const spec = event.spec;
      const tools = spec.tools.map((tool) => tool.name);
      const body = [
        line(
          "Model ",
          strong(spec.model || "(default)"),
          tools.length ? ` · tools: ${tools.join(", ")}` : " · no tools",
          spec.terminal_tool ? ` · terminal tool: ${spec.terminal_tool}` : "",
          ` · at most ${event.max_turns} model calls a request`,
        ),
      ];
      if (spec.system_prompt) {
        body.push(text(spec.system_prompt, "text system"));
      }
      if (event.resume) {
        body.push(line(`Resumed from a transcript of ${event.history.length} messages.`));
      }
      return { title: "Session opened", body };
    }
    case "local.user_message":
      return { title: `User message · poll ${page.poll}`, body: [text(event.text)] };
    case "local.message_queued":
      return { title: "Message queued (the session was busy)", body: [text(event.text)] };
    case "local.tool_results": {
      // A result its local.tool_result holds is logged there only (its position in `logged`).
      const logged = new Set(event.logged ?? []);
      const body = event.results.map((result, index) =>
        el(
          "div",
          { class: `result${result.is_error ? " error" : ""}` },
          line(
            strong(page.calls.get(result.tool_use_id)?.name ?? result.tool_use_id),
            result.is_error ? " returned an error" : " returned",
            " ",
            took(result.tool_use_id, at),
          ),
          text(logged.has(index) ? (page.returned.get(result.tool_use_id) ?? "") : result.text),
        ),
      );
      return {
        title: `Tool results · poll ${page.poll}`,
        body: body.length ? body : [line("No results: every call was answered already.")],
      };
    }
    case "local.model_response": {
      const message = event.message;
      const body = [];
      const said = textOf(message.content);
      if (said) {
        body.push(text(said));
      }
      for (const call of message.tool_calls ?? []) {
        body.push(
          el(
            "div",
            { class: "call" },
            line("Calls ", strong(call.function?.name ?? "?"), el("span", { class: "muted", text: ` ${call.id}` })),
            code(argumentsOf(call)),
          ),
        );
        page.calls.set(call.id, { name: call.function?.name ?? call.id, at });
      }
      if (!body.length) {
        body.push(line(el("span", { class: "muted", text: "(no text, no calls)" })));
      }
      const usage = event.usage;
      return {
        title: `Model reply · poll ${page.poll}`,
        meta: `${number(usage.prompt_tokens)} in · ${number(usage.completion_tokens)} out${usage.cost != null ? ` · cost ${usage.cost}` : ""} · ${event.finish_reason ?? "no finish reason"}`,
        body,
      };
    }
    case "local.compacted": {
      // Older turns summarised by a model call of its own: the summary took their place.
      const summarised = event.end - event.start - event.kept.length;
      const usage = event.usage;
      return {
        title: "Older turns summarised",
        meta: `${number(summarised)} messages · ~${number(event.estimated)} tokens, over the ${number(event.budget)} budget · ${number(usage.prompt_tokens)} in · ${number(usage.completion_tokens)} out${usage.cost != null ? ` · cost ${usage.cost}` : ""}`,
        body: [text(textOf(event.message.content) ?? "")],
      };
    }
    case "local.compaction_failed":
      return {
        title: "Summary of older turns failed",
        meta: `~${number(event.estimated)} tokens, over the ${number(event.budget)} budget · the history is sent whole, cut as before`,
        body: [text(event.error)],
        error: true,
      };
    case "local.tool_call": {
      const known = page.calls.get(event.tool_call_id);
      const body = [line("Runs ", strong(event.name), el("span", { class: "muted", text: ` ${event.tool_call_id}` })), code(pretty(event.input))];
      page.calls.set(event.tool_call_id, { name: event.name, at: known ? known.at : at });
      return { title: "Tool call", body };
    }
    case "local.tool_result":
      page.returned.set(event.tool_call_id, event.text);
      return {
        title: event.is_error ? "Tool error" : "Tool result",
        body: [
          line(strong(page.calls.get(event.tool_call_id)?.name ?? event.tool_call_id), " ", took(event.tool_call_id, at)),
          text(event.text),
        ],
        error: event.is_error,
      };
    case "local.directive":
      return {
        title: `Guard: ${event.guard}`,
        meta: "added a directive",
        body: [text(event.text)],
      };
    case "local.duplicate_tool_call":
      return {
        title: "Guard: duplicates",
        meta: "a repeated call, answered without running it",
        body: [line(strong(event.name), ` ${event.arguments}`), text(event.message)],
      };
    case "local.reply_replaced":
      return { title: `Guard: ${event.guard}`, meta: "replaced the model's reply", body: [text(event.text)] };
    case "local.halted":
      return {
        title: `Guard: ${event.guard}`,
        meta: `halted: ${event.reason}`,
        body: [text(event.message)],
        error: true,
      };
    case "local.terminal":
      return {
        title: "Terminal tool",
        meta: `${event.name} ended the run`,
        body: [code(pretty(event.result))],
      };
    case "local.output":
      return {
        title: "Typed output",
        meta: "the answer matched the output schema",
        body: [code(pretty(event.value))],
      };
    case "local.chat_retry":
      return {
        title: `Model call retried (attempt ${event.attempt})`,
        meta: `in ${seconds(event.delay)}${event.status ? ` · HTTP ${event.status}` : ""}`,
        body: [text(event.error)],
        error: true,
      };
    case "local.chat_error":
      return {
        title: "Model call failed",
        meta: `${event.transient ? "transient" : "permanent"}${event.status ? ` · HTTP ${event.status}` : ""}`,
        body: [text(event.error)],
        error: true,
      };
    case "local.mcp_error":
      return {
        title: `MCP server ${event.server}: ${event.reason}`,
        meta: event.tool ? `tool ${event.tool}` : null,
        body: [text(event.error)],
        error: true,
      };
    case "local.cancelled":
      return { title: "Cancelled", body: [text(event.reason)], error: true };
    case "local.failed":
      return { title: "Failed", meta: "crashed too often; given up", body: [text(event.error)], error: true };
    case "local.forked":
      return {
        title: "Forked",
        meta: `from ${event.origin} at seq ${event.at_seq}`,
        body: [line("The events before this are the first ", strong(String(event.at_seq)), " of session ", strong(event.origin), "'s.")],
      };
    default:
      return { title: event.type, body: [code(pretty(event))] };
  }
}

function item(envelope) {
  if (page.started === null) {
    page.started = envelope.at;
  }
  if (INPUTS.has(envelope.event.type)) {
    page.poll += 1;
  }
  const shown = describe(envelope);
  const type = envelope.event.type;
  const kind = type.replace("local.", "").replaceAll("_", "-");
  const classes = ["event", `kind-${kind}`];
  if (GUARD_EVENTS.has(type)) {
    classes.push("guard");
  }
  if (shown.error) {
    classes.push("bad");
  }
  const raw = el("button", { type: "button", class: "raw-toggle", text: "JSON", "aria-expanded": "false" });
  const node = el(
    "li",
    { class: classes.join(" "), "data-seq": envelope.seq, "data-type": type },
    el(
      "div",
      { class: "event-head" },
      el("span", { class: "seq", text: `#${envelope.seq}` }),
      el("span", { class: "at", title: when(envelope.at), text: `+${seconds(envelope.at - page.started)}` }),
      el("span", { class: "title", text: shown.title }),
      shown.meta ? el("span", { class: "meta", text: shown.meta }) : null,
      raw,
    ),
    el("div", { class: "event-body" }, ...shown.body),
  );
  page.items.set(envelope.seq, node);
  page.envelopes.set(envelope.seq, envelope);
  page.last = envelope.seq;
  return node;
}

// One listener for every event's JSON button (one each made drawing long timelines slow).
function onTimelineClick(click) {
  const button = click.target.closest(".raw-toggle");
  if (!button) {
    return;
  }
  const node = button.closest("li.event");
  toggleRaw(node, button, page.envelopes.get(Number(node.dataset.seq)));
}

function toggleRaw(node, button, envelope) {
  const open = node.querySelector(":scope > pre.raw");
  if (open) {
    open.remove();
    button.setAttribute("aria-expanded", "false");
    return;
  }
  node.append(el("pre", { class: "raw", text: pretty(envelope) }));
  button.setAttribute("aria-expanded", "true");
}

function append(envelopes) {
  const fresh = envelopes.filter((envelope) => envelope.seq > page.last);
  if (!fresh.length) {
    return;
  }
  const fragment = document.createDocumentFragment();
  for (const envelope of fresh) {
    fragment.append(item(envelope));
    if (envelope.seq === 1) {
      setGuards(envelope.event.guards);
    }
  }
  document.getElementById("timeline").append(fragment);
}

// -- the summary and the actions ---------------------------------------------------

function fact(label, value, title) {
  return el("span", { class: "fact", title }, el("span", { class: "label", text: label }), value);
}

function renderHead(view, info) {
  const session = view.session;
  const status = info ? info.status : session.status;
  document.getElementById("title").replaceChildren(el("span", { class: "id", text: session.session_id }), statusBadge(status));
  const usage = session.usage;
  const facts = [
    fact("model", session.model || "(default)"),
    fact("created", when(session.created_at)),
    fact("last activity", ago(session.last_at), when(session.last_at)),
    fact("events", number(session.events)),
    fact("model calls", number(session.polls)),
    fact("tokens", `${number(usage.prompt_tokens)} in · ${number(usage.completion_tokens)} out`),
  ];
  const reason = (info && info.error) || session.error || session.stop_reason;
  if (reason) {
    facts.push(fact(session.error || (info && info.error) ? "error" : "stop reason", reason));
  }
  document.getElementById("facts").replaceChildren(...facts);
  document.getElementById("source").textContent = view.live ? `live host · ${view.source}` : `read-only · ${view.source}`;
  if (info) {
    renderActions(info);
  }
}

function renderActions(info) {
  const ended = info.status === "cancelled" || info.status === "failed";
  document.getElementById("cancel").disabled = ended;
  document.getElementById("retry").hidden = info.status !== "errored";
  document.getElementById("message-form").hidden = ended;
  const form = document.getElementById("results-form");
  const waiting = info.status === "requires_action" ? info.pending : [];
  form.hidden = !waiting.length;
  const holder = document.getElementById("results");
  const shown = [...holder.querySelectorAll("[data-call]")].map((node) => node.dataset.call).join(",");
  if (shown === waiting.map((use) => use.id).join(",")) {
    return; // what is typed there stays
  }
  holder.replaceChildren(
    ...waiting.map((use) =>
      el(
        "div",
        { class: "pending", "data-call": use.id },
        line(strong(use.name), el("span", { class: "muted", text: ` ${use.id}` })),
        code(pretty(use.input)),
        el("textarea", { rows: 2, "aria-label": `Result of ${use.name}`, placeholder: "The result" }),
        el("label", { class: "check" }, el("input", { type: "checkbox" }), " an error"),
      ),
    ),
  );
}

function summary() {
  return api(`/v1/inspector/sessions/${encodeURIComponent(sessionId)}`);
}

function show(view, info) {
  page.live = view.live;
  renderHead(view, info);
  document.getElementById("actions").hidden = !view.live;
  document.getElementById("read-only").hidden = view.live;
}

async function refresh() {
  const view = await summary();
  show(view, view.live ? await api(base) : null);
}

// Refreshes the summary once events stop arriving for a moment.
function refreshSoon() {
  clearTimeout(page.refreshing);
  page.refreshing = setTimeout(() => refresh().catch(failed), 250);
}

function failed(error) {
  if (error instanceof Unauthorized) {
    page.controller?.abort();
    locked(error);
    return;
  }
  notice(error.message);
}

async function act(label, call) {
  const status = document.getElementById("action-status");
  status.textContent = `${label}…`;
  try {
    await call();
    status.textContent = `${label}: done.`;
    refreshSoon();
  } catch (error) {
    if (error instanceof Unauthorized) {
      failed(error);
      return;
    }
    status.textContent = `${label}: ${error.message}`;
  }
}

function wireActions() {
  document.getElementById("message-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const box = document.getElementById("message");
    const textValue = box.value;
    if (!textValue.trim()) {
      return;
    }
    act("Send", async () => {
      await api(`${base}/messages`, { method: "POST", body: { text: textValue } });
      box.value = "";
    });
  });
  document.getElementById("results-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const results = [...document.querySelectorAll("#results [data-call]")].map((node) => ({
      tool_use_id: node.dataset.call,
      text: node.querySelector("textarea").value,
      is_error: node.querySelector("input[type=checkbox]").checked,
    }));
    act("Post results", () => api(`${base}/tool_results`, { method: "POST", body: { results } }));
  });
  document.getElementById("cancel").addEventListener("click", () =>
    act("Cancel", () => api(`${base}/cancel`, { method: "POST" })),
  );
  document.getElementById("retry").addEventListener("click", () =>
    act("Retry", () => api(`${base}/retry`, { method: "POST" })),
  );
}

// -- what if -----------------------------------------------------------------------

function setGuards(guards) {
  const box = document.getElementById("guards");
  if (!box.value) {
    box.value = pretty(guards);
  }
}

function short(event) {
  const parts = [event.type];
  for (const key of ["guard", "reason", "name"]) {
    if (typeof event[key] === "string") {
      parts.push(`${key}: ${event[key]}`);
    }
  }
  return parts.join(" · ");
}

function eventList(title, events) {
  return el(
    "div",
    { class: "side-by-side" },
    el("h3", { text: title }),
    el("ul", {}, ...events.map((event) => el("li", { text: short(event) }))),
  );
}

function markDivergence(divergence) {
  for (const node of document.querySelectorAll("#timeline .diverges")) {
    node.classList.remove("diverges");
    node.querySelector(".diverge-note")?.remove();
  }
  if (!divergence) {
    return;
  }
  const node = page.items.get(divergence.seq);
  if (node) {
    node.classList.add("diverges");
    node.querySelector(".event-head").after(
      el("p", { class: "diverge-note", text: `What if: ${divergence.summary}` }),
    );
    node.scrollIntoView({ block: "center" });
  }
}

function wireWhatIf() {
  document.getElementById("whatif-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const answer = document.getElementById("whatif-answer");
    let guards;
    try {
      guards = JSON.parse(document.getElementById("guards").value || "{}");
    } catch (error) {
      answer.replaceChildren(el("p", { class: "bad-input", text: `Not JSON: ${error.message}` }));
      return;
    }
    answer.replaceChildren(el("p", { text: "Re-checking…" }));
    try {
      const result = await api(`${base}/recheck`, { method: "POST", body: { guards } });
      const divergence = result.divergence;
      markDivergence(divergence);
      if (!divergence) {
        answer.replaceChildren(
          el("p", { class: "same", text: `The same at every poll (${number(result.events)} events re-checked).` }),
        );
        return;
      }
      answer.replaceChildren(
        el("p", { class: "differs" }, strong(`Poll ${divergence.poll} (event #${divergence.seq}): `), divergence.summary),
        eventList("The log", divergence.logged),
        eventList("These guards", divergence.derived),
      );
    } catch (error) {
      if (error instanceof Unauthorized) {
        failed(error);
        return;
      }
      const where = error instanceof ApiError && error.field ? ` (${error.field})` : "";
      answer.replaceChildren(el("p", { class: "bad-input", text: `${error.message}${where}` }));
    }
  });
}

// -- loading -------------------------------------------------------------------------

async function start() {
  page.controller?.abort();
  const controller = (page.controller = new AbortController());
  document.getElementById("crumb-id").textContent = sessionId;
  try {
    const view = await summary();
    // The pages of events the summary counts, four at a time (a long session's would
    // otherwise all be asked for at once); the tail brings any later.
    const size = view.max_page;
    const starts = [];
    for (let after = page.last; after < view.session.events; after += size) {
      starts.push(after);
    }
    for (let first = 0; first < starts.length; first += 4) {
      const reads = starts
        .slice(first, first + 4)
        .map((after) => api(`${base}/events?after=${after}&limit=${size}`, { signal: controller.signal }));
      for (const found of await Promise.all(reads)) {
        append(found.events);
      }
    }
    show(view, view.live ? await api(base) : null);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      notice(`No session ${sessionId} in this log.`);
      return;
    }
    failed(error);
    return;
  }
  if (!page.rendered) {
    page.rendered = true;
    markPainted("turnkeeper:session-rendered");
  }
  const live = document.getElementById("live");
  live.hidden = false;
  tail(
    sessionId,
    page.last,
    (envelopes) => {
      append(envelopes);
      refreshSoon();
    },
    controller.signal,
  ).catch(failed);
}

document.getElementById("timeline").addEventListener("click", onTimelineClick);
wireActions();
wireWhatIf();
boot(start);
