"""poll_turn scenarios from DESIGN.md and the core issue, on both anyio backends."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from turnkeeper.core import (
    AgentSpec,
    ChatError,
    GuardConfig,
    InputError,
    LoopDetection,
    MaxTurns,
    ToolResult,
    ToolSpec,
    call_key,
    text_of,
)
from turnkeeper.events import (
    ChatFailed,
    ChatRetried,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    ModelResponded,
)
from turnkeeper.logs import decode_jsonl, encode_jsonl
from turnkeeper.providers import ScriptedChat, text_response, tool_response, with_retry
from turnkeeper.sessions import Kickoff, Resume, UserMessage, normalize, open_session, poll_turn
from turnkeeper.state import SessionState, apply_event, fold, replay

pytestmark = pytest.mark.anyio

OBJECT = {"type": "object", "properties": {"q": {"type": "string"}}}
SPEC = AgentSpec(
    system_prompt="You help.",
    tools=(ToolSpec("search", "Search", OBJECT), ToolSpec("finish", "Answer", OBJECT)),
    terminal_tool="finish",
    model="tiny",
)


def results_for(state: SessionState, text: str = "ok", *, is_error: bool = False) -> Resume:
    return Resume(state.pending, tuple(ToolResult(u.id, text, is_error) for u in state.pending))


def history_roles(state: SessionState) -> list[str]:
    return [m["role"] for m in state.history]


async def test_kickoff_sends_system_and_prompt_and_logs_open() -> None:
    chat = ScriptedChat([text_response("Hello.")])
    state = open_session(SPEC, session_id="local_0123456789abcdef")
    events, state = await poll_turn(state, Kickoff("Hi"), chat)
    assert [e.type for e in events] == [
        "local.session_opened",
        "local.user_message",
        "local.model_response",
    ]
    assert [e.seq for e in events] == [1, 2, 3]
    request = chat.requests[0]
    assert request["model"] == "tiny"
    assert request["messages"] == [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Hi"},
    ]
    assert [t["function"]["name"] for t in request["tools"]] == ["search", "finish"]
    turn = normalize(events)
    assert (turn.terminal, turn.stop_reason, turn.text) == ("end_turn", "end_turn", "Hello.")
    assert state.status == "idle"


async def test_generated_session_id_shape() -> None:
    state = open_session(SPEC)
    assert state.session_id.startswith("local_")
    assert len(state.session_id) == 22
    int(state.session_id[6:], 16)
    assert open_session(SPEC).session_id != state.session_id


async def test_repeated_call_is_self_answered_not_surfaced() -> None:
    chat = ScriptedChat(
        [
            tool_response(("search", {"q": "a"})),
            tool_response(("search", {"q": "a"}), ("search", {"q": "b"})),
        ]
    )
    state = open_session(SPEC)
    events, state = await poll_turn(state, Kickoff("go"), chat)
    assert [u.input for u in normalize(events).tool_uses] == [{"q": "a"}]
    events, state = await poll_turn(state, results_for(state, "A"), chat)
    turn = normalize(events)
    assert [u.input for u in turn.tool_uses] == [{"q": "b"}]
    duplicates = [e.event for e in events if isinstance(e.event, DuplicateToolCall)]
    assert len(duplicates) == 1
    assert duplicates[0].name == "search"
    answered = [m for m in state.history if m["role"] == "tool"]
    assert json.loads(answered[-1]["content"])["duplicate"] is True


async def test_key_order_does_not_hide_a_duplicate() -> None:
    spec = AgentSpec(tools=(ToolSpec("f"),))
    chat = ScriptedChat(
        [tool_response(("f", '{"a": 1, "b": 2}')), tool_response(("f", '{"b": 2, "a": 1}'))]
    )
    state = open_session(spec)
    _, state = await poll_turn(state, Kickoff("go"), chat)
    events, state = await poll_turn(state, results_for(state), chat)
    assert normalize(events).tool_uses == ()
    assert any(isinstance(e.event, DuplicateToolCall) for e in events)


async def test_all_duplicate_turn_requires_action_with_no_uses_and_model_sees_answers() -> None:
    chat = ScriptedChat(
        [
            tool_response(("search", {"q": "a"})),
            tool_response(("search", {"q": "a"})),
            text_response("done"),
        ]
    )
    # Without the answer after the loop guard's stop, which would follow the repeat.
    state = open_session(SPEC, guards=GuardConfig(loop=LoopDetection(answer=False)))
    _, state = await poll_turn(state, Kickoff("go"), chat)
    events, state = await poll_turn(state, results_for(state, "A"), chat)
    turn = normalize(events)
    assert turn.terminal == "requires_action"
    assert turn.tool_uses == ()
    assert state.status == "running"
    events, state = await poll_turn(state, Resume(), chat)
    last_request = chat.requests[-1]["messages"]
    assert last_request[-1]["role"] == "tool" or last_request[-1]["role"] == "user"
    tool_contents = [m["content"] for m in last_request if m["role"] == "tool"]
    assert any('"duplicate":true' in c for c in tool_contents)


async def test_repeatable_tool_is_not_deduplicated() -> None:
    spec = AgentSpec(tools=(ToolSpec("status", repeatable=True),))
    chat = ScriptedChat([tool_response(("status", {})), tool_response(("status", {}))])
    state = open_session(spec)
    _, state = await poll_turn(state, Kickoff("go"), chat)
    events, state = await poll_turn(state, results_for(state, "pending"), chat)
    assert len(normalize(events).tool_uses) == 1


async def test_two_consecutive_errors_inject_corrective_naming_tool_and_error() -> None:
    chat = ScriptedChat(
        [
            tool_response(("search", {"q": "1"})),
            tool_response(("search", {"q": "2"})),
            text_response("ok"),
        ]
    )
    state = open_session(SPEC)
    _, state = await poll_turn(state, Kickoff("go"), chat)
    events, state = await poll_turn(state, results_for(state, "bad key", is_error=True), chat)
    assert not any(isinstance(e.event, DirectiveInjected) for e in events)
    events, state = await poll_turn(state, results_for(state, "quota hit", is_error=True), chat)
    directives = [e.event for e in events if isinstance(e.event, DirectiveInjected)]
    assert len(directives) == 1
    assert directives[0].guard == "consecutive_errors"
    assert "search" in directives[0].text
    assert "quota hit" in directives[0].text
    sent = chat.requests[-1]["messages"]
    assert sent[-1] == {"role": "user", "content": directives[0].text}
    error_message = [m for m in sent if m["role"] == "tool"][-1]
    assert json.loads(error_message["content"]) == {"error": "quota hit", "isError": True}


async def test_error_then_success_gives_no_corrective() -> None:
    chat = ScriptedChat(
        [
            tool_response(("search", {"q": "1"})),
            tool_response(("search", {"q": "2"})),
            tool_response(("search", {"q": "3"})),
            text_response("ok"),
        ]
    )
    state = open_session(SPEC)
    _, state = await poll_turn(state, Kickoff("go"), chat)
    _, state = await poll_turn(state, results_for(state, "boom", is_error=True), chat)
    _, state = await poll_turn(state, results_for(state, "fine"), chat)
    events, state = await poll_turn(state, results_for(state, "boom", is_error=True), chat)
    assert not any(isinstance(e.event, DirectiveInjected) for e in events)
    assert state.error_counts == {"search": 1}


async def test_last_allowed_poll_carries_final_turn_directive_naming_terminal_tool() -> None:
    chat = ScriptedChat(
        [tool_response(("search", {"q": str(i)})) for i in range(2)] + [text_response("x")]
    )
    # Without the answer after the stop, which takes the last poll's place when the episode
    # has results (tests/guards/test_answer.py).
    guards = GuardConfig(max_turns=MaxTurns(answer=False))
    state = open_session(SPEC, max_turns=3, guards=guards)
    events, state = await poll_turn(state, Kickoff("go"), chat)
    assert not any(isinstance(e.event, DirectiveInjected) for e in events)
    events, state = await poll_turn(state, results_for(state), chat)
    assert not any(isinstance(e.event, DirectiveInjected) for e in events)
    events, state = await poll_turn(state, results_for(state), chat)
    directives = [e.event for e in events if isinstance(e.event, DirectiveInjected)]
    assert [d.guard for d in directives] == ["final_turn"]
    assert "`finish`" in directives[0].text
    assert chat.requests[-1]["messages"][-1]["content"] == directives[0].text


async def test_poll_past_max_turns_halts_without_a_model_call() -> None:
    chat = ScriptedChat([tool_response(("search", {"q": "1"}))])
    state = open_session(SPEC, max_turns=1)
    _, state = await poll_turn(state, Kickoff("go"), chat)
    events, state = await poll_turn(state, results_for(state, "the answer is 42"), chat)
    turn = normalize(events)
    assert (turn.terminal, turn.stop_reason) == ("terminated", "max_turns_exceeded")
    assert "the answer is 42" in (turn.text or "")
    assert chat.calls == 1
    assert state.polls == 1


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
async def test_transient_http_failures_are_retried(status: int) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    failure = ChatError(f"HTTP {status}", transient=True, status=status)
    chat = ScriptedChat([failure, text_response("ok")])
    state = open_session(SPEC)
    events, state = await poll_turn(state, Kickoff("go"), with_retry(chat, sleep=sleep))
    retries = [e.event for e in events if isinstance(e.event, ChatRetried)]
    assert len(retries) == 1
    assert retries[0].status == status
    assert normalize(events).text == "ok"
    assert len(slept) == 1
    assert replay(events) == state


async def test_transport_failures_are_retried() -> None:
    async def sleep(delay: float) -> None:
        return None

    chat = ScriptedChat(
        [
            ChatError("connection refused", transient=True),
            ChatError("timeout", transient=True),
            text_response("ok"),
        ]
    )
    events, _ = await poll_turn(open_session(SPEC), Kickoff("go"), with_retry(chat, sleep=sleep))
    assert sum(isinstance(e.event, ChatRetried) for e in events) == 2


@pytest.mark.parametrize("status", [400, 401])
async def test_permanent_failures_are_not_retried_and_leave_state(status: int) -> None:
    async def sleep(delay: float) -> None:
        raise AssertionError("must not sleep")

    chat = ScriptedChat([ChatError(f"HTTP {status}", transient=False, status=status)])
    state = open_session(SPEC)
    with pytest.raises(ChatError) as caught:
        await poll_turn(state, Kickoff("go"), with_retry(chat, sleep=sleep))
    assert chat.calls == 1
    assert caught.value.status == status
    assert [e.type for e in caught.value.events] == ["local.session_opened", "local.chat_error"]
    failed = caught.value.events[-1].event
    assert isinstance(failed, ChatFailed)
    assert failed.status == status
    assert not failed.transient
    logged = fold(state, caught.value.events)
    assert logged.history == state.history
    assert logged.seq == 2


async def test_failed_poll_can_be_retried_and_log_stays_contiguous() -> None:
    chat = ScriptedChat([ChatError("down", transient=False, status=400), text_response("ok")])
    state = open_session(SPEC)
    log: list[Envelope] = []
    with pytest.raises(ChatError) as caught:
        await poll_turn(state, Kickoff("go"), chat)
    log.extend(caught.value.events)
    state = fold(state, caught.value.events)
    events, state = await poll_turn(state, Kickoff("go"), chat)
    log.extend(events)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert replay(log) == state
    assert history_roles(state) == ["system", "user", "assistant"]


@pytest.mark.parametrize(
    "response",
    [
        {},
        {"choices": []},
        {"choices": [{}]},
        {"choices": [{"message": "hi"}]},
        {"choices": [{"message": {"content": 5}}]},
        {"choices": [{"message": {"tool_calls": [{"function": {}}]}}]},
        {"choices": [{"message": {"tool_calls": "x"}}]},
        ["not", "a", "dict"],
        None,
    ],
)
async def test_malformed_response_is_a_permanent_chat_error(response: Any) -> None:
    async def chat(request: dict[str, Any]) -> Any:
        return response

    state = open_session(SPEC)
    with pytest.raises(ChatError, match="malformed response") as caught:
        await poll_turn(state, Kickoff("go"), chat)
    assert not caught.value.transient
    failed = caught.value.events[-1].event
    assert isinstance(failed, ChatFailed)
    assert failed.response == response
    decode_jsonl(encode_jsonl(caught.value.events))


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ("42", "must be a JSON object"),
        ('{"q": "ok"', "not valid JSON"),
    ],
)
async def test_arguments_that_are_not_an_object_decode_to_empty_and_are_reported(
    arguments: str, problem: str
) -> None:
    chat = ScriptedChat([tool_response(("search", arguments))])
    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    turn = normalize(events)
    assert len(turn.tool_uses) == 1
    use = turn.tool_uses[0]
    assert use.input == {}
    assert use.error is not None
    assert problem in use.error
    assert len(turn.problems) == 1
    assert state.pending == turn.tool_uses


async def test_reattach_keeps_system_message_and_marks_resume() -> None:
    chat = ScriptedChat([text_response("first"), text_response("second")])
    _, state = await poll_turn(open_session(SPEC), Kickoff("one"), chat)
    transcript = list(state.history)
    again = open_session(SPEC, history=transcript)
    assert again.resume
    assert again.history == tuple(transcript)
    assert again.history[0] == {"role": "system", "content": "You help."}
    events, again = await poll_turn(again, UserMessage("two"), chat)
    assert chat.requests[-1]["messages"][: len(transcript)] == transcript
    assert sum(m["role"] == "system" for m in again.history) == 1
    assert replay(events).resume


async def test_reattach_with_unanswered_calls_requires_their_results() -> None:
    chat = ScriptedChat([tool_response(("search", {"q": "x"})), text_response("done")])
    _, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    again = open_session(SPEC, history=list(state.history))
    assert again.status == "requires_action"
    assert [u.id for u in again.pending] == [u.id for u in state.pending]
    with pytest.raises(InputError, match="waiting for the results"):
        await poll_turn(again, UserMessage("other"), chat)
    events, again = await poll_turn(again, results_for(again), chat)
    assert normalize(events).text == "done"


async def test_user_message_resets_polls_seen_and_error_counts() -> None:
    chat = ScriptedChat(
        [
            tool_response(("search", {"q": "a"})),
            tool_response(("search", {"q": "b"})),
            tool_response(("search", {"q": "c"})),
            text_response("done"),
            tool_response(("search", {"q": "a"})),
        ]
    )
    state = open_session(SPEC)
    _, state = await poll_turn(state, Kickoff("go"), chat)
    _, state = await poll_turn(state, results_for(state, "found"), chat)
    _, state = await poll_turn(state, results_for(state, "e", is_error=True), chat)
    _, state = await poll_turn(state, results_for(state, "e", is_error=True), chat)
    assert state.polls == 4
    assert state.seen == {call_key("search", {"q": "a"})}
    assert state.error_counts == {"search": 2}
    events, state = await poll_turn(state, UserMessage("again"), chat)
    assert state.polls == 1
    assert state.error_counts == {}
    assert [u.input for u in normalize(events).tool_uses] == [{"q": "a"}]


async def test_unknown_response_fields_survive_in_the_log() -> None:
    response = text_response("hi")
    response["system_fingerprint"] = "fp_123"
    response["choices"][0]["logprobs"] = {"content": [1, 2]}
    response["choices"][0]["message"]["reasoning_content"] = "thinking..."
    chat = ScriptedChat([response])
    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    decoded = decode_jsonl(encode_jsonl(events)).events
    logged = next(e.event for e in decoded if isinstance(e.event, ModelResponded))
    kept = msgspec.json.decode(logged.response)
    assert kept["system_fingerprint"] == "fp_123"
    assert kept["choices"][0]["logprobs"] == {"content": [1, 2]}
    assert state.history[-1]["reasoning_content"] == "thinking..."
    assert replay(decoded) == state


async def test_resume_rejects_unknown_missing_and_duplicate_results() -> None:
    chat = ScriptedChat([tool_response(("search", {"q": "a"}), ("search", {"q": "b"}))])
    _, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    first, second = state.pending
    with pytest.raises(InputError, match="no result for"):
        await poll_turn(state, Resume(state.pending, (ToolResult(first.id, "x"),)), chat)
    with pytest.raises(InputError, match="unknown tool call ids"):
        await poll_turn(
            state,
            Resume(
                (), (ToolResult(first.id, "x"), ToolResult(second.id, "y"), ToolResult("nope", "z"))
            ),
            chat,
        )
    with pytest.raises(InputError, match="more than one result"):
        await poll_turn(
            state,
            Resume(
                (),
                (ToolResult(first.id, "x"), ToolResult(first.id, "x"), ToolResult(second.id, "y")),
            ),
            chat,
        )


async def test_results_go_back_in_call_order() -> None:
    chat = ScriptedChat(
        [tool_response(("search", {"q": "a"}), ("search", {"q": "b"})), text_response("ok")]
    )
    _, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    first, second = state.pending
    resume = Resume((), (ToolResult(second.id, "B"), ToolResult(first.id, "A")))
    _, state = await poll_turn(state, resume, chat)
    tools = [m for m in chat.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == [first.id, second.id]


async def test_terminal_tool_ends_with_its_arguments() -> None:
    chat = ScriptedChat([tool_response(("finish", {"q": "42"}))])
    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    turn = normalize(events)
    assert (turn.terminal, turn.stop_reason, turn.result) == (
        "end_turn",
        "terminal_tool",
        {"q": "42"},
    )
    assert state.result == {"q": "42"}
    assert state.history[-1]["role"] == "tool"


async def test_terminal_tool_with_invalid_arguments_is_surfaced_not_finished() -> None:
    spec = AgentSpec(
        tools=(
            ToolSpec(
                "finish",
                "",
                {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}},
                    "required": ["answer"],
                },
            ),
        ),
        terminal_tool="finish",
    )
    chat = ScriptedChat([tool_response(("finish", {"answer": 3}))])
    events, _ = await poll_turn(open_session(spec), Kickoff("go"), chat)
    turn = normalize(events)
    assert turn.terminal == "requires_action"
    assert [u.name for u in turn.tool_uses] == ["finish"]


async def test_required_terminal_tool_reprompts_then_halts() -> None:
    config = GuardConfig(terminal=msgspec.structs.replace(GuardConfig().terminal, required=True))  # type: ignore[type-var]
    chat = ScriptedChat([text_response(f"answer {i}") for i in range(3)])
    state = open_session(SPEC, guards=config)
    events, state = await poll_turn(state, Kickoff("go"), chat)
    assert normalize(events).terminal == "requires_action"
    events, state = await poll_turn(state, Resume(), chat)
    assert normalize(events).terminal == "requires_action"
    events, state = await poll_turn(state, Resume(), chat)
    turn = normalize(events)
    assert (turn.terminal, turn.stop_reason) == ("terminated", "no_terminal_tool")
    assert chat.calls == 3
    assert "finish" in chat.requests[1]["messages"][-1]["content"]


async def test_missing_call_ids_are_filled_in_history_but_response_stays_verbatim() -> None:
    response = tool_response(("search", {"q": "a"}), ("search", {"q": "b"}))
    for call in response["choices"][0]["message"]["tool_calls"]:
        del call["id"]
    raw = json.loads(json.dumps(response))
    chat = ScriptedChat([json.loads(json.dumps(response))])
    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    ids = [u.id for u in state.pending]
    assert len(set(ids)) == 2
    logged = next(e.event for e in events if isinstance(e.event, ModelResponded))
    assert msgspec.json.decode(logged.response) == raw


async def test_seq_is_contiguous_and_apply_rejects_a_gap() -> None:
    chat = ScriptedChat([tool_response(("search", {"q": "a"})), text_response("ok")])
    log: list[Envelope] = []
    state = open_session(SPEC)
    events, state = await poll_turn(state, Kickoff("go"), chat)
    log.extend(events)
    events, state = await poll_turn(state, results_for(state), chat)
    log.extend(events)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    from turnkeeper.core import SeqError

    with pytest.raises(SeqError, match=f"session {state.session_id}: seq 3"):
        replay([log[0], log[2]])
    with pytest.raises(SeqError):
        apply_event(state, log[-1])


async def test_a_response_that_cannot_be_logged_is_malformed_not_a_crash() -> None:
    chat = ScriptedChat([text_response("bad \ud800 text")])
    with pytest.raises(ChatError, match="cannot be logged as JSON") as caught:
        await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    decode_jsonl(encode_jsonl(caught.value.events))


@pytest.mark.parametrize("depth", [129, 100_000])
async def test_a_response_nested_too_deeply_is_malformed_not_a_crash(depth: int) -> None:
    response: Any = text_response("hi")
    for _ in range(depth):
        response = {"choices": response["choices"], "extra": response}

    async def chat(request: dict[str, Any]) -> Any:
        return response

    with pytest.raises(ChatError, match="nests more than 128 levels deep") as caught:
        await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    failed = caught.value.events[-1].event
    assert isinstance(failed, ChatFailed)
    assert failed.response == "a dict nested more than 128 levels deep"
    decode_jsonl(encode_jsonl(caught.value.events))


async def test_a_response_nested_as_deep_as_allowed_is_logged() -> None:
    response: Any = text_response("hi")
    for _ in range(120):
        response = {"choices": response["choices"], "extra": response}
    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), ScriptedChat([response]))
    assert text_of(state.history[-1]) == "hi"
    assert replay(decode_jsonl(encode_jsonl(events)).events) == state


async def test_terminal_tool_arguments_are_coerced_safely_before_finishing() -> None:
    spec = AgentSpec(
        tools=(
            ToolSpec(
                "finish",
                "",
                {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            ),
        ),
        terminal_tool="finish",
    )
    chat = ScriptedChat([tool_response(("finish", {"n": "42"}))])
    events, state = await poll_turn(open_session(spec), Kickoff("go"), chat)
    assert normalize(events).result == {"n": 42}
    assert state.result == {"n": 42}
    assert replay(events) == state


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # After the kickoff (seq 2), calls without an id get call_3_<index>; the second
        # call's would be the first call's.
        (["call_3_1", None], ["call_3_1", "call_3_1_"]),
        # ... or a later call's.
        ([None, "call_3_0"], ["call_3_0_", "call_3_0"]),
        (
            [None, "call_3_0", "call_3_0_", None],
            ["call_3_0__", "call_3_0", "call_3_0_", "call_3_3"],
        ),
        (["a", "a", "call_3_1"], ["a", "call_3_1_", "call_3_1"]),
    ],
)
async def test_made_up_call_ids_are_never_an_id_the_model_gave(
    given: list[str | None], expected: list[str]
) -> None:
    response = tool_response(*(("search", {"q": str(index)}) for index in range(len(given))))
    for call, call_id in zip(response["choices"][0]["message"]["tool_calls"], given, strict=True):
        if call_id is None:
            del call["id"]
        else:
            call["id"] = call_id

    async def chat(request: dict[str, Any]) -> Any:
        return response  # not a ScriptedChat: it would number the calls itself

    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    assert [use.id for use in state.pending] == expected
    assert [use.input for use in state.pending] == [{"q": str(i)} for i in range(len(given))]
    assert replay(decode_jsonl(encode_jsonl(events)).events) == state
    results = Resume(state.pending, tuple(ToolResult(i, f"r{i}") for i in expected))
    chat = ScriptedChat([text_response("done")])
    _, state = await poll_turn(state, results, chat)
    answered = [m["tool_call_id"] for m in state.history if m["role"] == "tool"]
    assert answered == expected


async def test_a_response_json_does_not_hold_as_it_is_is_kept_as_the_log_reads_it() -> None:
    response: Any = {
        "choices": (
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {
                                "name": "finish",
                                "arguments": {"q": "x", "seen": (1, 2), "score": float("nan")},
                            },
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            },
        ),
        "usage": {1: 2},
    }
    events, state = await poll_turn(open_session(SPEC), Kickoff("go"), ScriptedChat([response]))
    assert state.result == {"q": "x", "seen": [1, 2], "score": None}
    (call,) = next(m["tool_calls"] for m in state.history if m.get("tool_calls"))
    assert call["function"]["arguments"]["seen"] == [1, 2]
    assert replay(decode_jsonl(encode_jsonl(events)).events) == state


async def test_a_chat_error_with_a_lone_surrogate_logs_with_it_replaced() -> None:
    async def chat(request: dict[str, Any]) -> Any:
        raise ChatError(b"bad \xff name".decode("utf-8", "surrogateescape"), transient=False)

    with pytest.raises(ChatError) as caught:
        await poll_turn(open_session(SPEC), Kickoff("go"), chat)
    failed = caught.value.events[-1].event
    assert isinstance(failed, ChatFailed)
    assert failed.error == "bad ? name"
    assert decode_jsonl(encode_jsonl(caught.value.events)).events == caught.value.events
