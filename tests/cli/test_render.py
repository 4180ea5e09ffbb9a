"""Every kind of event gets a readable line in the live view of `turnkeeper run`."""

from __future__ import annotations

from decimal import Decimal

import msgspec
import pytest

from turnkeeper.cli._render import outcome_lines, step_line
from turnkeeper.core import AgentSpec, GuardConfig, ToolResult, ToolSpec, Usage
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    AnyEvent,
    ApprovalDecided,
    ApprovalRequested,
    Cancelled,
    ChatFailed,
    ChatRetried,
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Failed,
    Forked,
    Halted,
    McpFailed,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    OutputAccepted,
    ReplyReplaced,
    SessionOpened,
    TerminalToolCalled,
    ToolCalled,
    ToolMayHaveRun,
    ToolResultsReceived,
    ToolReturned,
)
from turnkeeper.guards import default_guards
from turnkeeper.providers import tool_response
from turnkeeper.sessions import UserMessage, begin_poll, open_session
from turnkeeper.sessions._driver import Called, answer

EVENTS: list[tuple[AnyEvent, str]] = [
    (SessionOpened(AgentSpec(), (), 50, GuardConfig(), False), "session"),
    (MessageReceived("What is 2 + 2?"), "What is 2 + 2?"),
    (MessageQueued("And 3 + 3?"), "queued: And 3 + 3?"),
    (DirectiveInjected("loop", "You are going in circles."), "guard loop: You are going"),
    (
        ModelResponded(
            msgspec.Raw(b"{}"), {"role": "assistant", "content": "4"}, "stop", Usage(3, 1)
        ),
        "model: 4",
    ),
    (DuplicateToolCall("c1", "search", '{"q":"x"}', "already"), "guard duplicates: search"),
    (ReplyReplaced("small_model", "The answer is 391."), "answer replaced with: The answer is"),
    (ChatRetried(1, 0.5, "HTTP 503"), "retry 1 in 0.5 s: HTTP 503"),
    (ChatFailed("HTTP 401: bad key", False, 401), "model failed: HTTP 401"),
    (ToolCalled("c1", "search", {"q": "x"}), 'tool search({"q":"x"})'),
    (ToolReturned("c1", "found"), "-> found"),
    (ToolMayHaveRun("c1", "search"), "tool search again: it may have run before"),
    (ApprovalRequested(("c1", "c2")), "awaiting approval: c1, c2"),
    (ApprovalDecided("c1", approved=True), "approved c1"),
    (ApprovalDecided("c2", approved=False, reason="too much"), "denied c2: too much"),
    (McpFailed("fs", "died", "EOF", "read", "c1"), "MCP server fs went away (calling read): EOF"),
    (McpFailed("fs", "start_failed", "no such file"), "MCP server fs could not start: no such"),
    (Halted("loop", "going_in_circles", "I stopped."), "halted by loop (going_in_circles)"),
    (
        AnswerRequested("loop", "going_in_circles", "I stopped.", "Answer now."),
        "guard loop (going_in_circles): stopped; asking for an answer",
    ),
    (AnsweredAfterStop("loop", "going_in_circles"), "answered after loop (going_in_circles)"),
    (TerminalToolCalled("c2", "finish", {"answer": "4"}), "finished with finish"),
    (OutputAccepted({"city": "Paris", "temperature": 12}), 'typed output: {"city":"Paris",'),
    (Cancelled("the user asked"), "cancelled: the user asked"),
    (Failed("crashed 4 times"), "failed: crashed 4 times"),
    (Forked("local_origin", 7), "forked from session local_origin at seq 7"),
    (
        Compacted(
            1,
            9,
            (3,),
            {"role": "user", "content": "Summary of the conversation so far: 17 * 23 = 391."},
            2210,
            2048,
            msgspec.Raw(b"{}"),
            Usage(600, 20),
        ),
        "compacted: 7 older messages summarised (~2210 tokens, over the 2048 budget): "
        "Summary of the conversation so far: 17 * 23 = 391.",
    ),
    (
        CompactionFailed("HTTP 400: too long", 2210, 2048),
        "compaction failed (~2210 tokens, over the 2048 budget): HTTP 400: too long; "
        "the history is cut instead",
    ),
    (
        ModelResponded(
            msgspec.Raw(b"{}"),
            {"role": "assistant", "content": "5"},
            "stop",
            Usage(3, 1, Decimal("0.0000012")),
        ),
        "model: 5 [3+1 tokens, cost 0.0000012]",
    ),
]


@pytest.mark.parametrize(("event", "shown"), EVENTS, ids=lambda value: getattr(value, "type", ""))
def test_each_event_has_its_own_line(event: AnyEvent, shown: str) -> None:
    line = step_line(Envelope("local_0123456789abcdef", 1, 0.0, event))
    assert line is not None
    assert shown in line
    assert "local." not in line


def test_tool_results_get_no_line_of_their_own() -> None:
    # Each result already has its `->` line from local.tool_result.
    event = ToolResultsReceived((ToolResult("c1", "found"),))
    assert step_line(Envelope("local_0123456789abcdef", 1, 0.0, event)) is None


def test_every_kind_of_event_is_covered() -> None:
    kinds = {type(event) for event, _ in EVENTS} | {ToolResultsReceived}
    assert kinds == set(AnyEvent.__args__)


def test_the_outcome_of_a_session_awaiting_approval_says_so() -> None:
    spec = AgentSpec(tools=(ToolSpec("refund", approval="always"), ToolSpec("look")))
    state = open_session(spec, session_id="s")
    _, state, _ = begin_poll(state, UserMessage("refund it"), now=1.0)
    response = tool_response(("refund", {}, "r1"), ("look", {}, "l1"))
    answered = answer(Called(response, None, []), state, guard=default_guards, clock=lambda: 2.0)
    lines = list(outcome_lines(answered.state))
    assert "awaiting approval: refund" in lines
    assert not any(line.startswith("waiting for tool results") for line in lines)
    asked = answered.events[-1]
    assert step_line(asked) == "awaiting approval: r1"
