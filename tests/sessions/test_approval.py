"""Tool approval through the public API: a call whose tool's policy wants approval parks the
session in `awaiting_approval`; `Host.approve` (and `run(approve=...)`) approves or denies
each call; the decisions are logged, replay rebuilds them and recheck agrees; a denial
reaches the model as a tool error saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, ApprovalDecision, InputError, ToolResult, ToolSpec, ToolUse
from turnkeeper.events import ApprovalDecided, ApprovalRequested, ToolCalled
from turnkeeper.logs import JsonlLog, SqliteLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, RunResult, recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio

AMOUNT = {
    "type": "object",
    "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}},
    "required": ["order", "amount"],
}
REFUND = ToolSpec(
    "refund",
    "Refund an order",
    AMOUNT,
    # Refunds of 100 or more need a person's approval; smaller ones run at once.
    approval={"properties": {"amount": {"minimum": 100}}},
)
LOOKUP = ToolSpec("lookup", "Look up an order", {"type": "object"}, approval="always")
SPEC = AgentSpec(system_prompt="You refund orders.", tools=(REFUND, LOOKUP))


class Refunds:
    """The in-process refund tool, noting every refund it made."""

    def __init__(self) -> None:
        self.made: list[tuple[int, float]] = []

    async def refund(self, order: int, amount: float) -> str:
        self.made.append((order, amount))
        return f"refunded {amount} on order {order}"


def tool_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_a_small_refund_runs_without_approval() -> None:
    refunds = Refunds()
    chat = ScriptedChat(
        [tool_response(("refund", {"order": 1, "amount": 20})), text_response("Done.")]
    )
    async with Host(chat=chat, tools={"refund": refunds.refund}) as host:
        session_id = await host.start(SPEC, "Refund order 1")
        info = await host.result(session_id, wait=30)
        events = await host.events(session_id)
    assert info.status == "idle"
    assert info.text == "Done."
    assert refunds.made == [(1, 20)]
    assert not any(isinstance(e.event, ApprovalRequested) for e in events)


async def test_a_call_needing_approval_waits_then_runs_once_approved(tmp_path: Path) -> None:
    refunds = Refunds()
    chat = ScriptedChat(
        [
            tool_response(("refund", {"order": 7, "amount": 250}, "call_a")),
            text_response("Refunded."),
        ]
    )
    async with (
        SqliteLog(tmp_path / "log.sqlite") as log,
        Host(chat=chat, log=log, tools={"refund": refunds.refund}) as host,
    ):
        session_id = await host.start(SPEC, "Refund order 7")
        info = await host.result(session_id, wait=30)
        assert info.status == "awaiting_approval"
        assert [(use.id, use.name, use.input) for use in info.awaiting] == [
            ("call_a", "refund", {"order": 7, "amount": 250})
        ]
        assert info.pending == ()
        assert refunds.made == []
        # Nothing else goes on meanwhile: no message, no results from outside.
        with pytest.raises(InputError, match="approval of tool calls call_a"):
            await host.send(session_id, "hurry up")
        with pytest.raises(InputError, match="not waiting for tool results"):
            await host.submit_tool_results(session_id, [ToolResult("call_a", "done")])
        await host.approve(session_id, [ApprovalDecision("call_a", approved=True)])
        info = await host.result(session_id, wait=30)
        events = await log.read(session_id)
        live = host._sessions[session_id].state
    assert info.status == "idle"
    assert info.text == "Refunded."
    assert refunds.made == [(7, 250)]
    kinds = [e.type for e in events]
    asked = kinds.index("local.approval_requested")
    assert kinds[asked - 1] == "local.model_response"
    assert kinds[asked + 1] == "local.approval_decided"
    assert kinds[asked + 2] == "local.tool_call"
    assert replay(events) == live
    assert recheck(events) is None


async def test_a_denied_call_reaches_the_model_as_a_tool_error() -> None:
    refunds = Refunds()
    chat = ScriptedChat(
        [
            tool_response(
                ("refund", {"order": 7, "amount": 250}, "big"),
                ("refund", {"order": 8, "amount": 5}, "small"),
            ),
            text_response("I could not refund order 7."),
        ]
    )
    async with Host(chat=chat, tools={"refund": refunds.refund}, tool_concurrency=1) as host:
        session_id = await host.start(SPEC, "Refund orders 7 and 8")
        info = await host.result(session_id, wait=30)
        assert info.status == "awaiting_approval"
        # Only the big one awaits; the small one waits with it, so the calls keep their order.
        assert [use.id for use in info.awaiting] == ["big"]
        assert refunds.made == []
        await host.approve(
            session_id, [ApprovalDecision("big", approved=False, reason="over the limit")]
        )
        info = await host.result(session_id, wait=30)
        events = await host.events(session_id)
        live = host._sessions[session_id].state
    assert info.status == "idle"
    assert refunds.made == [(8, 5)]
    sent = tool_messages(chat.requests[1])
    denied = json.loads(sent[0])
    assert denied["isError"] is True
    assert "denied approval: over the limit" in denied["error"]
    assert sent[1] == "refunded 5 on order 8"
    decided = [e.event for e in events if isinstance(e.event, ApprovalDecided)]
    assert decided == [ApprovalDecided(tool_call_id="big", approved=False, reason="over the limit")]
    assert [e.event.tool_call_id for e in events if isinstance(e.event, ToolCalled)] == ["small"]
    assert replay(events) == live
    assert recheck(events) is None


async def test_calls_may_be_decided_a_few_at_a_time() -> None:
    chat = ScriptedChat(
        [
            tool_response(("lookup", {"id": 1}, "one"), ("lookup", {"id": 2}, "two")),
            text_response("Looked up."),
        ]
    )

    async def lookup(id: int) -> str:
        return f"order {id}"

    async with Host(chat=chat, tools={"lookup": lookup}) as host:
        session_id = await host.start(SPEC, "Look up orders 1 and 2")
        await host.result(session_id, wait=30)
        await host.approve(session_id, [ApprovalDecision("two", approved=True)])
        info = await host.status(session_id)
        assert info.status == "awaiting_approval"
        assert [use.id for use in info.awaiting] == ["one"]
        with pytest.raises(InputError, match=r"tool calls \['two'\] do not await approval"):
            await host.approve(session_id, [ApprovalDecision("two", approved=True)])
        await host.approve(session_id, [ApprovalDecision("one", approved=True)])
        info = await host.result(session_id, wait=30)
    assert info.status == "idle"
    assert info.text == "Looked up."
    assert tool_messages(chat.requests[1]) == ["order 1", "order 2"]


async def test_bad_decisions_are_refused_naming_what_is_wrong() -> None:
    chat = ScriptedChat([tool_response(("lookup", {}, "one")), text_response("ok")])
    async with Host(chat=chat) as host:
        session_id = await host.start(SPEC, "Look it up")
        await host.result(session_id, wait=30)
        with pytest.raises(InputError, match="decisions: expected at least one"):
            await host.approve(session_id, [])
        with pytest.raises(InputError, match=r"decisions\[1\]: a second decision on tool call one"):
            await host.approve(
                session_id,
                [ApprovalDecision("one", approved=True), ApprovalDecision("one", approved=False)],
            )
        with pytest.raises(InputError, match=r"decisions\[0\]: expected ApprovalDecision"):
            await host.approve(session_id, [{"tool_call_id": "one"}])  # type: ignore[list-item]
        assert (await host.status(session_id)).status == "awaiting_approval"
        # An orchestrator's tool: approved, it then waits for its result from outside.
        await host.approve(session_id, [ApprovalDecision("one", approved=True)])
        info = await host.result(session_id, wait=30)
        assert info.status == "requires_action"
        assert [use.id for use in info.pending] == ["one"]
        with pytest.raises(InputError, match="no tool calls awaiting approval"):
            await host.approve(session_id, [ApprovalDecision("one", approved=True)])
        await host.submit_tool_results(session_id, [ToolResult("one", "found")])
        assert (await host.result(session_id, wait=30)).text == "ok"


async def test_a_host_started_later_keeps_the_session_awaiting_approval(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    chat = ScriptedChat([tool_response(("refund", {"order": 3, "amount": 500}, "c"))])
    refunds = Refunds()
    async with SqliteLog(path) as log, Host(chat=chat, log=log) as host:
        session_id = await host.start(SPEC, "Refund order 3")
        assert (await host.result(session_id, wait=30)).status == "awaiting_approval"
    later = ScriptedChat([text_response("Refunded.")])
    async with (
        SqliteLog(path) as log,
        Host(chat=later, log=log, tools={"refund": refunds.refund}) as host,
    ):
        info = await host.status(session_id)
        assert info.status == "awaiting_approval"
        assert refunds.made == []
        await host.approve(session_id, [ApprovalDecision("c", approved=True)])
        assert (await host.result(session_id, wait=30)).text == "Refunded."
    assert refunds.made == [(3, 500)]


async def test_a_transcript_ending_in_such_a_call_asks_for_approval_first() -> None:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You refund orders."},
        {"role": "user", "content": "Refund order 9"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "refund", "arguments": '{"order": 9, "amount": 900}'},
                }
            ],
        },
    ]
    refunds = Refunds()
    chat = ScriptedChat([text_response("Refunded.")])
    async with Host(chat=chat, tools={"refund": refunds.refund}) as host:
        session_id = await host.start(SPEC, None, history=history)
        info = await host.result(session_id, wait=30)
        assert info.status == "awaiting_approval"
        assert refunds.made == []
        await host.approve(session_id, [ApprovalDecision("t1", approved=True)])
        assert (await host.result(session_id, wait=30)).text == "Refunded."
    assert refunds.made == [(9, 900)]


async def test_a_fork_between_a_reply_and_its_approval_request_asks_for_approval() -> None:
    refunds = Refunds()
    chat = ScriptedChat(
        [tool_response(("refund", {"order": 7, "amount": 900}, "c")), text_response("Refunded.")]
    )
    async with Host(chat=chat, tools={"refund": refunds.refund}) as host:
        origin = await host.start(SPEC, "Refund order 7")
        assert (await host.result(origin, wait=30)).status == "awaiting_approval"
        events = await host.events(origin)
        reply = next(e.seq for e in events if e.type == "local.model_response")
        assert isinstance(events[reply].event, ApprovalRequested)  # logged with the reply
        info = await host.fork(origin, reply, "fork")
        assert info.status == "awaiting_approval"
        assert [use.id for use in info.awaiting] == ["c"]
        assert (await host.result("fork", wait=0.2)).status == "awaiting_approval"
        assert refunds.made == []
        with pytest.raises(InputError, match="not waiting for tool results"):
            await host.submit_tool_results("fork", [ToolResult("c", "refunded by hand")])
        forked = await host.events("fork")
        assert [e.type for e in forked[reply:]] == ["local.forked", "local.approval_requested"]
        assert replay(forked) == host._sessions["fork"].state
        await host.approve("fork", [ApprovalDecision("c", approved=True)])
        assert (await host.result("fork", wait=30)).text == "Refunded."
    assert refunds.made == [(7, 900)]


@pytest.mark.parametrize("handled", [True, False], ids=["in-process tool", "tool from outside"])
async def test_a_log_cut_between_a_reply_and_its_approval_request_asks_first(
    tmp_path: Path, handled: bool
) -> None:
    # A crash in the middle of the append of the reply and its request: JSON Lines may keep
    # the first events of an append cut short (here the reply), before the order file
    # records the append. Both are cut back by hand.
    path = tmp_path / "log"
    chat = ScriptedChat([tool_response(("refund", {"order": 5, "amount": 800}, "c"))])
    async with JsonlLog(path) as log, Host(chat=chat, log=log) as host:
        session_id = await host.start(SPEC, "Refund order 5")
        assert (await host.result(session_id, wait=30)).status == "awaiting_approval"
    session_file = next(path.glob("*.jsonl"))
    lines = session_file.read_bytes().splitlines(keepends=True)
    assert b"local.approval_requested" in lines[-1]
    session_file.write_bytes(b"".join(lines[:-1]))
    order = path / "order.idx"
    order.write_bytes(b"".join(order.read_bytes().splitlines(keepends=True)[:-1]))
    refunds = Refunds()
    tools = {"refund": refunds.refund} if handled else None
    later = ScriptedChat([text_response("Refunded.")])
    async with JsonlLog(path) as log, Host(chat=later, log=log, tools=tools) as host:
        info = await host.result(session_id, wait=30)
        assert info.status == "awaiting_approval"
        assert [use.id for use in info.awaiting] == ["c"]
        assert refunds.made == []
        events = await host.events(session_id)
        assert isinstance(events[-1].event, ApprovalRequested)
        assert replay(events) == host._sessions[session_id].state
        await host.approve(session_id, [ApprovalDecision("c", approved=True)])
        if not handled:
            await host.submit_tool_results(session_id, [ToolResult("c", "refunded")])
        assert (await host.result(session_id, wait=30)).text == "Refunded."
    assert refunds.made == ([(5, 800)] if handled else [])


async def test_run_asks_its_approve_callback() -> None:
    refunds = Refunds()
    asked: list[ToolUse] = []

    async def approve(use: ToolUse) -> bool | str:
        asked.append(use)
        return True if use.input["amount"] < 1000 else "ask a manager"

    chat = ScriptedChat(
        [
            tool_response(("refund", {"order": 1, "amount": 150}, "a")),
            tool_response(("refund", {"order": 2, "amount": 5000}, "b")),
            text_response("One refunded, one not."),
        ]
    )
    result = await run(
        SPEC, "Refund orders 1 and 2", chat, tools={"refund": refunds.refund}, approve=approve
    )
    assert result.text == "One refunded, one not."
    assert [use.id for use in asked] == ["a", "b"]
    assert refunds.made == [(1, 150)]
    denied = json.loads(tool_messages(chat.requests[2])[-1])
    assert "denied approval: ask a manager" in denied["error"]
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_run_without_a_callback_stops_at_calls_awaiting_approval() -> None:
    refunds = Refunds()
    chat = ScriptedChat([tool_response(("refund", {"order": 4, "amount": 400}, "x"))])
    result = await run(SPEC, "Refund order 4", chat, tools={"refund": refunds.refund})
    assert result.terminal == "awaiting_approval"
    assert [use.id for use in result.tool_uses] == ["x"]
    assert refunds.made == []
    # Going on from its transcript, with a callback this time.
    later = ScriptedChat([text_response("Refunded.")])
    again = await run(
        SPEC,
        None,
        later,
        tools={"refund": refunds.refund},
        history=result.transcript,
        approve=lambda use: True,
    )
    assert again.text == "Refunded."
    assert refunds.made == [(4, 400)]


async def test_an_approval_policy_must_be_one_a_log_can_hold() -> None:
    def predicate(args: dict[str, Any]) -> bool:
        return True

    bad = AgentSpec(tools=(ToolSpec("t", approval=predicate),))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"spec.tools\[0\].approval: .*a Python function"):
        await run(bad, "hi", ScriptedChat([]))
    unusable = AgentSpec(tools=(ToolSpec("t", approval={"type": 5}),))
    with pytest.raises(InputError) as refused:
        await run(unusable, "hi", ScriptedChat([]))
    assert str(refused.value).startswith(
        "spec.tools[0].approval: the approval schema of tool 't' cannot be used: "
        "$: the approval schema is invalid (at $.type: 5 is not valid"
    )
    assert "input schema" not in str(refused.value)
    assert "arguments cannot be checked" not in str(refused.value)
    word = AgentSpec(tools=(ToolSpec("t", approval="sometimes"),))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"spec.tools\[0\].approval: expected"):
        await run(word, "hi", ScriptedChat([]))


# Each step of a generated run: the reply's refunds, as (amount, what `approve` says).
steps = st.lists(
    st.lists(
        st.tuples(st.sampled_from([5, 150, 5000]), st.sampled_from([True, False, "no"])),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=40)
@given(plan=steps)
def test_generated_runs_run_exactly_the_calls_approved_and_replay(
    backend: str, plan: list[list[tuple[int, bool | str]]]
) -> None:
    said: dict[str, bool | str] = {}
    script: list[dict[str, Any]] = []
    expected: list[tuple[int, float]] = []
    order = 0
    for step in plan:
        calls = []
        for amount, decision in step:
            order += 1
            call_id = f"c{order}"
            said[call_id] = decision
            calls.append(("refund", {"order": order, "amount": amount}, call_id))
            if amount < 100 or decision is True:
                expected.append((order, amount))
        script.append(tool_response(*calls))
    script.append(text_response("Done."))
    refunds = Refunds()
    asked: list[str] = []

    def approve(use: ToolUse) -> bool | str:
        asked.append(use.id)
        return said[use.id]

    async def main() -> RunResult:
        return await run(
            SPEC,
            "Refund them",
            ScriptedChat(script),
            tools={"refund": refunds.refund},
            approve=approve,
            tool_concurrency=1,
        )

    result = anyio.run(main, backend=backend)
    assert result.text == "Done."
    assert refunds.made == expected
    needing = [
        f"c{n}" for n, (amount, _) in enumerate((c for s in plan for c in s), 1) if amount >= 100
    ]
    assert asked == needing
    decided = [e.event for e in result.events if isinstance(e.event, ApprovalDecided)]
    assert [d.tool_call_id for d in decided] == needing
    assert all(d.approved == (said[d.tool_call_id] is True) for d in decided)
    assert replay(result.events) == result.state
    assert recheck(result.events) is None
