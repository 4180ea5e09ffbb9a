"""Event types and the envelope: stable tags, JSON round trips, immutability, validation."""

from __future__ import annotations

import gc
import json
import typing
from typing import Any

import msgspec
import pytest

from turnkeeper.core import AgentSpec, Budget, GuardConfig, LogCorrupt, ToolResult, ToolSpec, Usage
from turnkeeper.events import Counts
from turnkeeper.events._codec import decode_envelope, encode_envelope
from turnkeeper.events._events import (
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
    Event,
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

# The wire names. Changing one breaks every stored log, so they are pinned here, not derived.
TAGS: dict[type[Event], str] = {
    SessionOpened: "local.session_opened",
    MessageReceived: "local.user_message",
    MessageQueued: "local.message_queued",
    ToolResultsReceived: "local.tool_results",
    DirectiveInjected: "local.directive",
    ModelResponded: "local.model_response",
    DuplicateToolCall: "local.duplicate_tool_call",
    ChatRetried: "local.chat_retry",
    ChatFailed: "local.chat_error",
    ToolCalled: "local.tool_call",
    ToolMayHaveRun: "local.tool_may_have_run",
    ApprovalRequested: "local.approval_requested",
    ApprovalDecided: "local.approval_decided",
    ToolReturned: "local.tool_result",
    Halted: "local.halted",
    AnswerRequested: "local.answer_requested",
    AnsweredAfterStop: "local.answered_after_stop",
    TerminalToolCalled: "local.terminal",
    OutputAccepted: "local.output",
    Cancelled: "local.cancelled",
    Failed: "local.failed",
    Forked: "local.forked",
    McpFailed: "local.mcp_error",
    ReplyReplaced: "local.reply_replaced",
    Compacted: "local.compacted",
    CompactionFailed: "local.compaction_failed",
}

SPEC = AgentSpec(
    system_prompt="You help.",
    tools=(ToolSpec("search", "Search the web", {"type": "object"}, repeatable=True),),
    terminal_tool="search",
    model="tiny",
    temperature=0.2,
    stop=("END",),
)
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "search", "arguments": '{"q": "x"}'},
}

EXAMPLES: list[AnyEvent] = [
    SessionOpened(
        spec=SPEC,
        history=({"role": "system", "content": "You help."},),
        max_turns=7,
        guards=GuardConfig(loop=None, budget=Budget(max_tokens=100, max_seconds=2.5)),
        resume=True,
    ),
    MessageReceived(text='héllo\n"quoted" \u2028 text'),
    ToolResultsReceived(
        results=(ToolResult("call_1", "found"), ToolResult("call_2", "boom", is_error=True))
    ),
    DirectiveInjected(guard="errors", text="Fix the error."),
    ModelResponded(
        response=msgspec.Raw(
            msgspec.json.encode(
                {
                    "id": "chatcmpl-1",
                    "choices": [{"message": {"role": "assistant", "tool_calls": [CALL]}}],
                    "x_vendor": {"nested": [1, 2.5, None, True]},
                }
            )
        ),
        message={"role": "assistant", "content": None, "tool_calls": [CALL]},
        finish_reason="tool_calls",
        usage=Usage(12, 3),
    ),
    DuplicateToolCall(
        tool_call_id="call_2", name="search", arguments='{"q":"x"}', message="already done"
    ),
    ChatRetried(attempt=2, delay=1.5, error="HTTP 503", status=503),
    ChatFailed(error="HTTP 400", transient=False, status=400, response={"error": "bad"}),
    ToolCalled(tool_call_id="call_1", name="search", input={"q": "x", "n": [1, {"a": None}]}),
    ToolReturned(tool_call_id="call_1", text="boom", is_error=True),
    ToolMayHaveRun(tool_call_id="call_1", name="search"),
    ApprovalRequested(tool_call_ids=("call_1", "call_2")),
    ApprovalDecided(tool_call_id="call_1", approved=False, reason="too much"),
    Halted(guard="loop", reason="going_in_circles", message="Stopped: going in circles."),
    AnswerRequested(
        guard="loop", reason="going_in_circles", message="2\n\nI stopped.", text="Answer now."
    ),
    AnsweredAfterStop(guard="loop", reason="going_in_circles"),
    TerminalToolCalled(tool_call_id="call_3", name="search", result={"answer": 42}),
    OutputAccepted(value={"city": "Paris", "temperature": 12.5, "tags": ["mild", None]}),
    Cancelled(reason="user asked"),
    Failed(error="crashed 3 times in 60 s"),
    Forked(origin="local_0123", at_seq=7),
    ReplyReplaced(guard="small_model", text="22 C and sunny"),
    McpFailed(
        server="files",
        reason="timeout",
        error="no answer in 60 s",
        tool="read",
        tool_call_id="call_4",
    ),
    MessageQueued(text="and then?"),
    Compacted(
        start=1,
        end=6,
        kept=(3,),
        message={"role": "user", "content": "Summary of the conversation so far: 17 * 23 = 391."},
        estimated=2100,
        budget=2048,
        response=msgspec.Raw(
            msgspec.json.encode(
                {"choices": [{"message": {"role": "assistant", "content": "17 * 23 = 391."}}]}
            )
        ),
        usage=Usage(900, 12),
    ),
    CompactionFailed(
        error="the summary was empty",
        estimated=2100,
        budget=2048,
        usage=Usage(900, 0),
        response={"choices": [{"message": {"role": "assistant", "content": ""}}]},
    ),
]


def test_every_event_type_has_its_pinned_tag() -> None:
    assert {cls: cls.__struct_config__.tag for cls in TAGS} == TAGS


def test_the_union_holds_exactly_the_pinned_event_types() -> None:
    assert set(typing.get_args(AnyEvent)) == set(TAGS)
    assert {type(event) for event in EXAMPLES} == set(TAGS)


def test_tags_are_explicit_not_derived_from_class_names() -> None:
    for cls, tag in TAGS.items():
        assert tag.startswith("local.")
        assert cls.__name__ not in tag
    assert len(set(TAGS.values())) == len(TAGS)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_envelope_round_trips_through_json(event: AnyEvent) -> None:
    envelope = Envelope("local_0123456789abcdef", 4, 1_700_000_000.25, event)
    data = encode_envelope(envelope)
    assert b"\n" not in data
    wire = json.loads(data)
    assert wire["event"]["type"] == TAGS[type(event)]
    assert (wire["session_id"], wire["seq"], wire["at"]) == (
        "local_0123456789abcdef",
        4,
        1_700_000_000.25,
    )
    back = decode_envelope(data)
    assert back == envelope
    assert type(back.event) is type(event)
    assert decode_envelope(data.decode()) == envelope


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_envelope_type_is_the_event_tag(event: AnyEvent) -> None:
    assert Envelope("s", 1, 0.0, event).type == TAGS[type(event)]


def test_a_hand_written_line_decodes_by_its_tag() -> None:
    line = '{"session_id":"s","seq":3,"at":5,"event":{"type":"local.user_message","text":"hi"}}'
    envelope = decode_envelope(line)
    assert envelope == Envelope("s", 3, 5.0, MessageReceived(text="hi"))
    assert envelope.type == "local.user_message"


def test_raw_response_is_kept_verbatim() -> None:
    responded = EXAMPLES[4]
    assert isinstance(responded, ModelResponded)
    back = decode_envelope(encode_envelope(Envelope("s", 1, 0.0, responded))).event
    assert isinstance(back, ModelResponded)
    decoded = msgspec.json.decode(back.response)
    assert decoded["x_vendor"] == {"nested": [1, 2.5, None, True]}
    assert decoded["id"] == "chatcmpl-1"
    assert back.response == responded.response


def test_a_response_spelled_another_way_reads_back_byte_for_byte() -> None:
    spelled = b'{ "id" : "x",\n  "n": 1e2, "s": "\\u00e9" }'
    line = (
        b'{"session_id":"s","seq":1,"at":0,"event":{"type":"local.model_response",'
        b'"response":' + spelled + b',"message":{"role":"assistant","content":"hi"},'
        b'"finish_reason":"stop","usage":{}}}'
    )
    event = decode_envelope(line).event
    assert isinstance(event, ModelResponded)
    assert bytes(event.response) == spelled
    assert spelled in encode_envelope(Envelope("s", 1, 0.0, event))
    assert msgspec.json.decode(event.response) == {"id": "x", "n": 100.0, "s": "é"}


def test_a_response_shows_its_json_in_repr() -> None:
    event = ModelResponded(msgspec.Raw(b'{"id":"x"}'), {"role": "assistant"}, "stop", Usage())
    assert repr(event) == (
        "ModelResponded(response=Raw(b'{\"id\":\"x\"}'), message={'role': 'assistant'}, "
        "finish_reason='stop', usage=Usage(prompt_tokens=0, completion_tokens=0, cost=None))"
    )


def test_envelopes_and_events_are_frozen() -> None:
    envelope = Envelope("s", 1, 0.0, MessageReceived(text="hi"))
    with pytest.raises(AttributeError):
        envelope.seq = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        envelope.event = Cancelled(reason="x")  # type: ignore[misc]
    for event in EXAMPLES:
        field = event.__struct_fields__[0]
        with pytest.raises(AttributeError):
            setattr(event, field, getattr(event, field))


def _line(**overrides: Any) -> bytes:
    envelope: dict[str, Any] = {
        "session_id": "s",
        "seq": 1,
        "at": 0.0,
        "event": {"type": "local.user_message", "text": "hi"},
    }
    envelope.update(overrides)
    return json.dumps(envelope).encode()


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"session_id": ""}, "`$.session_id`"),
        ({"session_id": 7}, "`$.session_id`"),
        ({"seq": 0}, "`int` >= 1 - at `$.seq`"),
        ({"seq": -3}, "`int` >= 1 - at `$.seq`"),
        ({"seq": "1"}, "`$.seq`"),
        ({"seq": 1.5}, "`$.seq`"),
        ({"at": "noon"}, "`$.at`"),
        ({"event": {"type": "local.nope", "text": "hi"}}, "'local.nope' - at `$.event.type`"),
        ({"event": {"type": "MessageReceived", "text": "hi"}}, "'MessageReceived'"),
        ({"event": {"text": "hi"}}, "missing required field `type`"),
        ({"event": {"type": "local.user_message"}}, "missing required field `text`"),
        ({"event": {"type": "local.user_message", "text": 5}}, "`$.event.text`"),
    ],
)
def test_invalid_envelopes_raise_log_corrupt_naming_the_field(
    overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(LogCorrupt, match="not an event envelope") as caught:
        decode_envelope(_line(**overrides), line=9)
    assert needle in str(caught.value)
    assert caught.value.line == 9
    assert str(caught.value).startswith("line 9: ")


def test_missing_envelope_fields_raise_log_corrupt() -> None:
    for field in ("session_id", "seq", "at", "event"):
        data = json.loads(_line())
        del data[field]
        with pytest.raises(LogCorrupt, match=f"missing required field `{field}`"):
            decode_envelope(json.dumps(data))


def test_an_opened_event_with_an_invalid_spec_is_log_corrupt() -> None:
    opened = EXAMPLES[0]
    wire = json.loads(encode_envelope(Envelope("s", 1, 0.0, opened)))
    tool = wire["event"]["spec"]["tools"][0]
    wire["event"]["spec"]["tools"] = [tool, tool]
    with pytest.raises(LogCorrupt, match="'search' is listed twice"):
        decode_envelope(json.dumps(wire))


@pytest.mark.parametrize("data", [None, 5, ["x"], {"session_id": "s"}])
def test_decode_envelope_rejects_what_is_not_bytes_or_text(data: Any) -> None:
    with pytest.raises(LogCorrupt, match=f"expected bytes or str, got {type(data).__name__}"):
        decode_envelope(data)


def test_events_compare_and_hash_by_value() -> None:
    assert MessageReceived(text="a") == MessageReceived(text="a")
    assert MessageReceived(text="a") != MessageReceived(text="b")
    assert hash(Cancelled(reason="x")) == hash(Cancelled(reason="x"))
    assert msgspec.structs.replace(EXAMPLES[1], text="other") != EXAMPLES[1]


def test_events_and_envelopes_are_left_to_reference_counting() -> None:
    envelope = Envelope("s1", 1, 0.0, ToolReturned(tool_call_id="c1", text="ok"))
    assert not gc.is_tracked(envelope)
    assert not gc.is_tracked(envelope.event)


def test_decoded_results_are_left_to_reference_counting() -> None:
    # ToolResult and Usage hold only text and numbers, so no cycle can go through them: not
    # tracked either, they let the collector stop tracking the tuples of results it meets.
    assert ToolResult.__struct_config__.gc is False
    assert Usage.__struct_config__.gc is False
    event = ToolResultsReceived(results=(ToolResult("c1", "ok"), ToolResult("c2", "no", True)))
    decoded = decode_envelope(encode_envelope(Envelope("s1", 1, 0.0, event)))
    assert isinstance(decoded.event, ToolResultsReceived)
    gc.collect()
    assert not gc.is_tracked(decoded.event.results)


@pytest.mark.parametrize(
    ("guard", "counts"), [("loop", "warning"), ("terminal", "reprompt"), ("repair", None)]
)
def test_a_directive_logged_before_counts_existed_counts_what_its_guard_did(
    guard: str, counts: Counts | None
) -> None:
    line: dict[str, Any] = {
        "session_id": "s1",
        "seq": 4,
        "at": 1.5,
        "event": {"type": "local.directive", "guard": guard, "text": "Do better."},
    }
    event = decode_envelope(msgspec.json.encode(line)).event
    assert event == DirectiveInjected(guard=guard, text="Do better.", counts=counts)
    assert msgspec.json.decode(encode_envelope(Envelope("s1", 4, 1.5, event)))["event"] == {
        **line["event"],
        "counts": counts,
    }


def test_a_directive_counts_what_it_says_whatever_its_guard() -> None:
    choices: tuple[Counts | None, ...] = (None, "warning", "reprompt")
    for counts in choices:
        event = DirectiveInjected(guard="loop", text="x", counts=counts)
        decoded = decode_envelope(encode_envelope(Envelope("s1", 2, 0.0, event))).event
        assert isinstance(decoded, DirectiveInjected)
        assert decoded.counts == counts
