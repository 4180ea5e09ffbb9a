"""Small-model mode: guards and a request window that keep a weak local model on track.

They follow the on-device reference loop: resume a transcript that ends on a tool
result with a "next step" turn, restate the request after each tool step, and send
back (once per step) a plain reply that ignores the last failed call or tells the
user to use a tool that is right here. All are off unless the session's GuardConfig
has `small_model` set.
"""

from __future__ import annotations

import re

from turnkeeper.core import Message, gist, text_of
from turnkeeper.guards._builtin import repairs
from turnkeeper.guards._view import CONTINUE, Directive, GuardView, Verdict, acts_in
from turnkeeper.state import SessionState

NEXT_STEP = "Continue with the next step for my request."
CORRECTION = "Correction: "

_ACKNOWLEDGES = re.compile(
    r"\b(error|errors|fail|failed|fails|failure|couldn'?t|could not|cannot|can'?t|unable|"
    r"sorry|problem|not possible|didn'?t work|did not work)\b",
    re.IGNORECASE,
)
_PUSHES = r"\b(use|call|run|try|click|press|tap|invoke|open)\b[^.!?\n]{0,40}?"


@acts_in("before_call", setting="small_model")
def resume_next_step(view: GuardView) -> Verdict:
    """A reattached transcript that ends on a tool result resumes with a "next step" turn."""
    state = view.state
    if view.phase != "before_call" or state.guards.small_model is None:
        return CONTINUE
    if not state.resume or state.polls or state.request is not None or not state.history:
        return CONTINUE
    if state.history[-1].get("role") != "tool":
        return CONTINUE
    return Verdict(directives=(Directive("small_model", NEXT_STEP),))


@acts_in("before_call", setting="small_model")
def restate_request(view: GuardView) -> Verdict:
    """After a tool step, restate the request so a small model continues it."""
    state = view.state
    if view.phase != "before_call" or state.guards.small_model is None:
        return CONTINUE
    if not view.results or not state.request:
        return CONTINUE
    text = (
        f"My request: {state.request}\n"
        "Continue with it: call the next tool you need, or answer if you have what you need."
    )
    return Verdict(directives=(Directive("small_model", text),))


@acts_in("after_response", setting="small_model")
def correct_reply(view: GuardView) -> Verdict:
    """Once per step, send back a plain reply that ignores the last failed call, or that
    tells the user to use a tool the model has itself."""
    state = view.state
    reply = view.reply
    if view.phase != "after_response" or reply is None or state.guards.small_model is None:
        return CONTINUE
    if reply.calls or reply.finish_reason != "stop" or not reply.text or repairs(state, reply):
        return CONTINUE
    last = state.history[-1] if state.history else None
    if last is not None and last.get("role") == "user":
        said = text_of(last) or ""
        if said.startswith(CORRECTION):
            return CONTINUE
    failure = state.last_failure
    if failure is not None and not _ACKNOWLEDGES.search(reply.text):
        text = (
            f"{CORRECTION}the last tool call failed: {gist(failure)}. Don't say it worked. "
            "Fix the call and try again, or tell the user plainly that it failed."
        )
        return Verdict(directives=(Directive("small_model", text),))
    # A typed answer is judged by its schema: one that repeats a tool's JSON may be right.
    echoed = None if state.spec.output_schema else _echoed_result(state.history, reply.text)
    if echoed is not None:
        return Verdict(replacement=Directive("small_model", gist(echoed)))
    pushed = _pushed_tool(state, reply.text)
    if pushed is not None:
        text = (
            f"{CORRECTION}you have the tool `{pushed}` right here, so you do it: "
            f"call {pushed} now instead of asking the user to."
        )
        return Verdict(directives=(Directive("small_model", text),))
    return CONTINUE


def _echoed_result(history: tuple[Message, ...], text: str) -> str | None:
    """The last tool result, when `text` only echoes an earlier (not the last) result."""
    said = " ".join(text.split())
    results = [text_of(m) or "" for m in history if m.get("role") == "tool"]
    if len(results) < 2 or not said:
        return None
    last = results[-1]
    if said == " ".join(last.split()):
        return None
    if any(said == " ".join(result.split()) for result in results[:-1]):
        return last
    return None


def _pushed_tool(state: SessionState, text: str) -> str | None:
    """The tool a reply tells the user to use ("use the search tool", "click Add to cart"):
    of the tools whose whole name (its words, in order) follows such a verb, the one
    naming most of the text, so "Add to cart" is `add_to_cart` beside a tool `add`."""
    best: tuple[int, str] | None = None
    for tool in state.spec.tools:
        if tool.name == state.spec.terminal_tool:
            continue
        words = [re.escape(word) for word in re.split(r"[_.\-\s]+", tool.name) if word]
        if not words:
            continue
        name = r"[\s_.\-]*".join(words)
        for found in re.finditer(_PUSHES + rf"\b(?P<name>{name})\b", text, re.IGNORECASE):
            length = len(found.group("name"))
            if best is None or length > best[0]:
                best = (length, tool.name)
    return None if best is None else best[1]


def window(history: tuple[Message, ...], state: SessionState) -> list[Message]:
    """What a small model is sent: system messages, then the last `window_turns` turns
    (starting on a user turn), tool results cut to `max_result_chars`."""
    config = state.guards.small_model
    assert config is not None
    head = [m for m in history[:1] if m.get("role") == "system"]
    body = history[len(head) :]
    starts = [i for i, message in enumerate(body) if message.get("role") == "user"]
    # Only a log written before check_guards bounded it holds a window under one turn.
    turns = max(config.window_turns, 1)
    if len(starts) > turns:
        body = body[starts[-turns] :]
    limit = config.max_result_chars
    shown: list[Message] = list(head)
    for message in body:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, str) and len(content) > limit:
            message = {**message, "content": content[:limit] + " …(cut)"}
        shown.append(message)
    return shown
