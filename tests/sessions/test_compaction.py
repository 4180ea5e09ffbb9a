"""Compaction through the public API: `run()`, `poll_turn` and a Host summarise older turns
past the history budget in a model call of their own, log the summary as
`local.compacted`, and send the compacted history from then on; replay and re-check
rebuild it with no model call, a new Host taking the session up sends what the live one
would, and a failed summary call costs nothing but the summary (the history is sent
whole, and cut as before).

The model is `Ledger`: it reads only the request, so the same history always gets the
same reply, across restarts. It takes the steps a prompt asks for one call at a time,
counting the steps done from the tool results it is sent and from the count a summary
states; asked for a summary (a request with no tools), it states that count. So a
session reaches its answer only if every summary carried what it replaced.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from turnkeeper import (
    AgentSpec,
    ChatError,
    Compaction,
    GuardConfig,
    Host,
    LoopDetection,
    Pricing,
    ToolResult,
    ToolSpec,
    UserMessage,
    poll_turn,
    recheck,
    replay,
    run,
)
from turnkeeper.core import InputError, Usage, approx_tokens, check_spec
from turnkeeper.events import (
    ChatRetried,
    Compacted,
    CompactionFailed,
    Envelope,
    ModelResponded,
)
from turnkeeper.logs import EventLog, MemoryLog, SqliteLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response, with_retry
from turnkeeper.sessions import open_session
from turnkeeper.sessions._compaction import SUMMARY_LEAD

pytestmark = pytest.mark.anyio

STEP = ToolSpec(
    "step",
    "Take step n.",
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)
ASK = ToolSpec("ask", "Ask the person.", {"type": "object", "properties": {}})
BUDGET = Compaction(budget_tokens=400, keep_recent_turns=2, summary_tokens=20)
SPEC = AgentSpec(system_prompt="Take the steps asked for.", tools=(STEP, ASK), compaction=BUDGET)
FILLER = "lorem ipsum dolor sit amet " * 8
_WANTED = re.compile(r"take (\d+) steps")
_DONE = re.compile(r"steps done: (\d+)")


def step_result(n: int) -> str:
    return f"step {n} done: {FILLER}"


async def step(n: int) -> str:
    return step_result(n)


def is_summary_request(request: dict[str, Any]) -> bool:
    return not request["tools"]


class Ledger:
    """The model: `requests` records what it was sent; `summaries` says how it answers a
    summary request, in turn (`ok`, `empty`, `error`: a permanent ChatError, `flaky`: a
    transient one), `ok` once they are used up; `window` is the context window it
    declares, if any."""

    def __init__(self, summaries: tuple[str, ...] = (), window: int | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.summaries = list(summaries)
        if window is not None:
            self.context_window = window

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        messages = request["messages"]
        if is_summary_request(request):
            return self._summary(messages[-1]["content"])
        done = 0
        for message in messages:
            content = message.get("content") or ""
            found = _DONE.search(content) if content.startswith(SUMMARY_LEAD) else None
            if found:
                done += int(found.group(1))
            elif message["role"] == "tool" and content.startswith("step "):
                done += 1
        asked = [m for m in messages if m["role"] == "user" and _WANTED.search(m["content"])]
        wanted = int(_WANTED.search(asked[-1]["content"]).group(1))  # type: ignore[union-attr]
        if done < wanted:
            return tool_response(("step", {"n": done + 1}, f"step-{done + 1}"), usage=(50, 5))
        if "then ask" in asked[-1]["content"] and not any(
            m["role"] == "tool" and m["tool_call_id"] == "ask-1" for m in messages
        ):
            return tool_response(("ask", {}, "ask-1"), usage=(50, 5))
        return text_response(f"finished {done} steps", usage=(50, 4))

    def _summary(self, transcript: str) -> dict[str, Any]:
        how = self.summaries.pop(0) if self.summaries else "ok"
        if how == "error":
            raise ChatError("HTTP 400: no summaries today", transient=False, status=400)
        if how == "flaky":
            raise ChatError("HTTP 503: busy", transient=True, status=503)
        if how == "empty":
            return text_response("  ", usage=(100, 1))
        earlier = _DONE.search(transcript)
        done = (int(earlier.group(1)) if earlier else 0) + transcript.count("Result of step:")
        return text_response(f"The user wants steps taken; steps done: {done}.", usage=(100, 9))


def events_of(events: tuple[Envelope, ...] | list[Envelope], kind: Any) -> list[Any]:
    return [envelope.event for envelope in events if isinstance(envelope.event, kind)]


def main_requests(chat: Ledger) -> list[dict[str, Any]]:
    return [request for request in chat.requests if not is_summary_request(request)]


def check_answered(history: tuple[dict[str, Any], ...]) -> None:
    """Every tool call is answered, by exactly its results, before the next assistant message."""
    open_ids: list[str] = []
    for message in (*history, {"role": "assistant"}):
        if message["role"] == "assistant":
            assert open_ids == [], open_ids
            open_ids = [call["id"] for call in message.get("tool_calls") or []]
        elif message["role"] == "tool":
            open_ids.remove(message["tool_call_id"])


async def test_run_summarises_older_turns_past_the_budget_and_replay_rebuilds_them() -> None:
    chat = Ledger()
    result = await run(SPEC, "take 8 steps", chat, tools={"step": step})

    # Every step was counted through the summaries: each carried what it replaced.
    assert (result.terminal, result.text) == ("end_turn", "finished 8 steps")
    compactions = events_of(result.events, Compacted)
    summary_calls = [request for request in chat.requests if is_summary_request(request)]
    assert len(compactions) == len(summary_calls) >= 2
    for compacted, request in zip(compactions, summary_calls, strict=True):
        assert compacted.estimated > compacted.budget == 400
        assert compacted.message["role"] == "user"
        assert compacted.message["content"].startswith(SUMMARY_LEAD + "The user wants steps")
        assert request["max_tokens"] == 20
        assert "Result of step: step" in request["messages"][-1]["content"]
        # What the turns were for: the request, kept after the summary, is in its transcript.
        assert "\nUser: take 8 steps\n" in request["messages"][-1]["content"]
    # The summary took the place of the older turns: the request follows it, then the
    # turns kept. The next model call is sent exactly that.
    at = next(e.seq for e in result.events if isinstance(e.event, Compacted))
    after = main_requests(chat)[
        sum(isinstance(e.event, ModelResponded) for e in result.events if e.seq < at)
    ]
    messages = after["messages"]
    assert messages[0] == {"role": "system", "content": SPEC.system_prompt}
    assert messages[1] == compactions[0].message
    assert messages[2] == {"role": "user", "content": "take 8 steps"}
    assert [m["role"] for m in messages[3:]] == ["assistant", "tool", "assistant", "tool"]
    assert approx_tokens(messages, []) < compactions[0].estimated
    # The history is the compacted one; the log rebuilds it with no model call, and the
    # guards re-derive every event from it, under the logged guards and others.
    history = result.state.history
    assert history[1]["content"].startswith(SUMMARY_LEAD)
    assert sum((m.get("content") or "").startswith(SUMMARY_LEAD) for m in history) == 1
    check_answered(history)
    assert replay(result.events) == result.state
    assert recheck(result.events) is None
    assert recheck(result.events, guards=GuardConfig(loop=LoopDetection(warnings=3))) is None
    # The summaries' tokens count in the session's usage.
    usage = sum((e.usage for e in events_of(result.events, Compacted | ModelResponded)), Usage())
    assert result.usage == usage
    assert result.usage.prompt_tokens == 50 * result.turns + 100 * len(compactions)


async def test_without_compaction_or_under_the_budget_the_history_goes_whole() -> None:
    for spec in (
        msgspec.structs.replace(SPEC, compaction=None),
        msgspec.structs.replace(SPEC, compaction=Compaction(budget_tokens=100_000)),
    ):
        chat = Ledger(window=800)
        result = await run(spec, "take 8 steps", chat, tools={"step": step})
        assert result.text == "finished 8 steps"
        assert not any(is_summary_request(request) for request in chat.requests)
        assert events_of(result.events, Compacted | CompactionFailed) == []
        assert len(chat.requests[-1]["messages"]) == 2 + 2 * 8


async def test_the_default_budget_is_half_the_window_a_backend_declares() -> None:
    spec = msgspec.structs.replace(SPEC, compaction=Compaction(keep_recent_turns=2))
    declared = Ledger(window=800)
    result = await run(spec, "take 8 steps", declared, tools={"step": step})
    assert result.text == "finished 8 steps"
    compactions = events_of(result.events, Compacted)
    assert compactions
    assert {c.budget for c in compactions} == {400}
    # A backend wrapped (retries here) still declares it.
    wrapped = Ledger(window=800)
    result = await run(spec, "take 8 steps", with_retry(wrapped), tools={"step": step})
    assert len(events_of(result.events, Compacted)) == len(compactions)
    # One that declares none is never compacted by default (an OpenAIChat, say).
    silent = Ledger()
    result = await run(spec, "take 8 steps", silent, tools={"step": step})
    assert events_of(result.events, Compacted | CompactionFailed) == []
    # ScriptedChat declares the window it is given.
    assert ScriptedChat([], context_window=800).context_window == 800
    assert ScriptedChat([]).context_window is None


async def test_the_summary_request_of_a_long_transcript_is_cut_to_fit() -> None:
    # A transcript of 30 steps reattached: far past the budget, and so its summary request
    # would be, but for its oldest lines left out (an earlier summary is kept).
    earlier = {"role": "user", "content": f"{SUMMARY_LEAD}The user wants steps; steps done: 2."}
    history: list[dict[str, Any]] = [{"role": "system", "content": "Take the steps."}, earlier]
    for n in range(3, 33):
        history += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"step-{n}",
                        "type": "function",
                        "function": {"name": "step", "arguments": f'{{"n": {n}}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"step-{n}", "content": step_result(n)},
        ]
    chat = Ledger()
    result = await run(SPEC, "take 34 steps", chat, tools={"step": step}, history=history)
    assert result.text == "finished 34 steps"
    first = next(request for request in chat.requests if is_summary_request(request))
    assert approx_tokens(first["messages"], []) <= 400
    text = first["messages"][-1]["content"]
    lines = text.split("\n")
    assert lines[2:4] == ['"""', "Earlier: The user wants steps; steps done: 2."]
    left_out = re.fullmatch(r"\((\d+) earlier lines left out\)", lines[4])
    assert left_out is not None
    # Each older step (3 to 31: the last is a turn kept, as is the request) is two lines,
    # its call and its result: the oldest were left out, the newest shown.
    shown = lines[5:-3]
    assert int(left_out.group(1)) + len(shown) == 2 * 29
    assert shown[-1] == f"Result of step: {step_result(31)}".rstrip()
    assert replay(result.events) == result.state


async def test_a_backend_s_own_estimate_decides() -> None:
    class Counting(Ledger):
        async def estimate_tokens(self, messages: list[dict[str, Any]]) -> int:
            return 1_000_000 if len(messages) > 7 else 1

    chat = Counting()
    result = await run(SPEC, "take 8 steps", chat, tools={"step": step})
    assert result.text == "finished 8 steps"
    estimates = {c.estimated for c in events_of(result.events, Compacted)}
    assert estimates == {1_000_000}


async def test_a_failed_summary_call_falls_back_to_cutting_and_says_so() -> None:
    chat = Ledger(summaries=("error",))
    result = await run(SPEC, "take 8 steps", chat, tools={"step": step})
    assert result.text == "finished 8 steps"
    failed = events_of(result.events, CompactionFailed)
    assert [(f.error, f.transient, f.status) for f in failed] == [
        ("HTTP 400: no summaries today", False, 400)
    ]
    assert failed[0].estimated > failed[0].budget == 400
    # Not asked again in the episode: the rest of its calls are sent the whole history.
    assert sum(map(is_summary_request, chat.requests)) == 1
    assert events_of(result.events, Compacted) == []
    assert len(chat.requests[-1]["messages"]) == 2 + 2 * 8
    assert result.state.compaction_failed
    assert replay(result.events) == result.state
    assert recheck(result.events) is None

    # The next request may compact again.
    more = await run(SPEC, "take 9 steps", chat, tools={"step": step}, history=result.transcript)
    assert more.text == "finished 9 steps"
    assert events_of(more.events, Compacted)


async def test_an_empty_summary_is_not_used_and_its_tokens_count() -> None:
    chat = Ledger(summaries=("empty",))
    result = await run(SPEC, "take 8 steps", chat, tools={"step": step})
    assert result.text == "finished 8 steps"
    (failed,) = events_of(result.events, CompactionFailed)
    assert failed.error == "the summary was empty"
    assert failed.usage == Usage(100, 1)
    assert failed.response["choices"][0]["message"]["content"] == "  "
    assert result.usage.prompt_tokens == 50 * result.turns + 100
    assert replay(result.events) == result.state


async def test_a_summary_call_is_retried_as_any_model_call() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    chat = Ledger(summaries=("flaky", "ok"))
    result = await run(SPEC, "take 8 steps", with_retry(chat, sleep=sleep), tools={"step": step})
    assert result.text == "finished 8 steps"
    types = [envelope.type for envelope in result.events]
    first = types.index("local.chat_retry")
    assert types[first + 1] == "local.compacted"
    (retried,) = events_of(result.events, ChatRetried)
    assert (retried.attempt, retried.status) == (1, 503)
    assert len(waits) == 1
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


async def test_poll_turn_compacts_before_its_model_call() -> None:
    chat = Ledger()
    result = await run(SPEC, "take 3 steps", chat, tools={"step": step})
    assert result.text == "finished 3 steps"
    state = result.state
    assert events_of(result.events, Compacted) == []
    # A budget the history is past now: the next poll summarises first.
    tight = msgspec.structs.replace(
        state,
        spec=msgspec.structs.replace(
            state.spec,
            compaction=Compaction(budget_tokens=50, keep_recent_turns=1, summary_tokens=20),
        ),
    )
    events, after = await poll_turn(tight, UserMessage("take 4 steps"), chat, clock=lambda: 5.0)
    kinds = [envelope.type for envelope in events]
    assert kinds[:2] == ["local.user_message", "local.compacted"]
    assert kinds[-1] == "local.model_response"
    compacted = events[1].event
    assert isinstance(compacted, Compacted)
    # The summary replaced the whole last episode; the new request follows it.
    assert after.history[1] == compacted.message
    assert after.history[2] == {"role": "user", "content": "take 4 steps"}
    assert chat.requests[-1]["messages"] == [*after.history[:3]]
    assert [e.seq for e in events] == list(range(tight.seq + 1, tight.seq + 1 + len(events)))

    # The model call failing: the poll's events are not logged, and the state it was
    # given stays valid (the summary is asked for again on the retry).
    failing = ScriptedChat([text_response("steps done: 0."), ChatError("HTTP 500", transient=True)])
    with pytest.raises(ChatError) as raised:
        await poll_turn(tight, UserMessage("take 4 steps"), failing, clock=lambda: 6.0)
    assert [e.type for e in raised.value.events] == ["local.chat_error"]
    assert raised.value.events[0].seq == tight.seq + 1


async def test_host_logs_the_summary_and_counts_its_call_and_cost() -> None:
    log = MemoryLog()
    priced = msgspec.structs.replace(
        SPEC, pricing=Pricing(input_per_million=1.0, output_per_million=2.0)
    )
    chat = Ledger()
    async with Host(chat=chat, log=log, tools={"step": step}) as host:
        session_id = await host.start(priced, "take 8 steps")
        info = await host.result(session_id, wait=30)
        assert (info.status, info.text) == ("idle", "finished 8 steps")
        events = await host.events(session_id)
        compactions = events_of(events, Compacted)
        assert compactions
        assert host.counters["model_calls"] == len(chat.requests)
        costs = [e.usage.cost for e in events_of(events, Compacted | ModelResponded)]
        assert host.cost_total == sum(costs, Decimal(0)) > 0
        assert info.usage == replay(events).usage
        assert replay(await log.read(session_id)) == host._sessions[session_id].state
        assert recheck(events) is None


# A session that compacts, then waits for a person (`PARKED_PROMPT`), and the answer
# that lets it finish.
PARKED_PROMPT = "take 6 steps then ask"
PARKED_ANSWER = (ToolResult("ask-1", "go on"),)


async def run_live(log: EventLog, chat: Ledger) -> tuple[int, list[Envelope]]:
    """Run the parked session on one Host from start to end, answering it when it waits:
    how many model calls came before the wait, and the session's events."""
    async with Host(chat=chat, log=log, tools={"step": step}) as host:
        await host.start(SPEC, PARKED_PROMPT, session_id="s")
        assert (await host.result("s", wait=30)).status == "requires_action"
        parked = len(chat.requests)
        await host.submit_tool_results("s", PARKED_ANSWER)
        assert (await host.result("s", wait=30)).text == "finished 6 steps"
        return parked, await log.read("s")


async def test_a_new_host_sends_what_the_live_one_would(tmp_path: Path) -> None:
    """Two logs of the same session: on one the Host goes on live; on the other it stops
    where the session waits for a person (after its summaries), and a new Host takes it
    up. Both are sent the same messages from there."""
    live_chat, first_chat, taken_chat = Ledger(), Ledger(), Ledger()
    async with SqliteLog(tmp_path / "live.sqlite") as log:
        parked, live = await run_live(log, live_chat)
    async with (
        SqliteLog(tmp_path / "taken.sqlite") as log,
        Host(chat=first_chat, log=log, tools={"step": step}) as host,
    ):
        await host.start(SPEC, PARKED_PROMPT, session_id="s")
        assert (await host.result("s", wait=30)).status == "requires_action"
    async with (
        SqliteLog(tmp_path / "taken.sqlite") as log,
        Host(chat=taken_chat, log=log, tools={"step": step}) as host,
    ):
        assert (await host.status("s")).status == "requires_action"
        await host.submit_tool_results("s", PARKED_ANSWER)
        assert (await host.result("s", wait=30)).text == "finished 6 steps"
        taken = await log.read("s")
    assert events_of(live, Compacted)
    assert first_chat.requests == live_chat.requests[:parked]
    assert taken_chat.requests == live_chat.requests[parked:]
    assert [e.event for e in taken] == [e.event for e in live]
    assert replay(taken).history == replay(live).history


class Blocking(Ledger):
    """A Ledger whose first model call after a summary blocks until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked = anyio.Event()

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.requests and is_summary_request(self.requests[-1]) and not self.blocked.is_set():
            self.requests.append(request)
            self.blocked.set()
            await anyio.sleep_forever()
        return await super().__call__(request)


async def test_a_host_killed_after_a_summary_makes_the_same_call_again(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    blocking = Blocking()
    async with SqliteLog(path) as log:
        async with Host(chat=blocking, log=log, tools={"step": step}) as host:
            await host.start(SPEC, "take 8 steps", session_id="s")
            await blocking.blocked.wait()
            assert host._group is not None
            host._group.cancel_scope.cancel()
        before = await log.read("s")
    # Killed in the model call after the summary: the log ends with the summary, in a poll.
    assert before[-1].type == "local.compacted"
    in_flight = blocking.requests[-1]
    taken = Ledger()
    async with SqliteLog(path) as log, Host(chat=taken, log=log, tools={"step": step}) as host:
        assert (await host.result("s", wait=30)).text == "finished 8 steps"
        after = await log.read("s")
    assert taken.requests[0] == in_flight
    assert after[: len(before)] == before
    # No second summary of the same turns: the one logged stands.
    assert after[len(before)].type == "local.model_response"


def test_compaction_settings_are_checked_naming_the_field() -> None:
    for compaction, field in (
        (Compaction(budget_tokens=0), "spec.compaction.budget_tokens"),
        (Compaction(keep_recent_turns=0), "spec.compaction.keep_recent_turns"),
        (Compaction(summary_tokens=True), "spec.compaction.summary_tokens"),
    ):
        with pytest.raises(InputError, match=f"^{re.escape(field)}: expected"):
            check_spec(AgentSpec(compaction=compaction))
    with pytest.raises(InputError, match=r"^spec.compaction: expected a Compaction or None"):
        check_spec(AgentSpec(compaction={"budget_tokens": 5}))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^spec\.compaction\.budget_tokens"):
        open_session(AgentSpec(compaction=Compaction(budget_tokens=-1)))
    assert AgentSpec().compaction == Compaction(None, 4, 128)
