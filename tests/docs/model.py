"""The model the documentation's examples talk to: the OpenAI-compatible test server
(tests/providers/openai_server.py), answering each prompt of the docs by a plan.

Each request is answered from the plan of its latest user message that names one (guard
directives are user messages too, and name none): the plan's tool calls in turn, one per
model call, then its answer. A prompt with no plan gets an HTTP 400 naming it, so an
example added with a new prompt fails until its plan is written here.

Asked for a summary of older turns (turnkeeper's summary request), it names the request
the transcript shows and counts the calls made, and a summary in the history counts in
the calls a plan has made.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any, SupportsIndex

import anyio.abc
import h11

from tests.providers.openai_server import Behaviour, ChatServer, Reply
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions._compaction import SUMMARY_LEAD, SUMMARY_SYSTEM


@dataclass(frozen=True)
class Plan:
    """How the model answers a prompt: `calls` (tool name, arguments) one per model call
    while the tool is offered, then `answer`, where `{result}` stands for the last tool
    result. With `forever`, it makes its last call again and again instead of answering,
    until the tools are withdrawn (`tool_choice: "none"`, the answer after a guard's stop):
    then it answers, `{result}` standing for the results the directive quotes."""

    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    answer: str = ""
    forever: bool = False
    repaired: str = ""
    """The answer to a directive of the output guard (an answer that did not match the
    output schema sent back), when the plan has one."""


PLANS: dict[str, Plan] = {
    "What is 2 + 3?": Plan(calls=(("add", {"a": 2, "b": 3}),), answer="2 + 3 = {result}"),
    "And 4 + 4?": Plan(calls=(("add", {"a": 4, "b": 4}),), answer="4 + 4 = {result}"),
    "What is 2+3?": Plan(answer="5"),
    "And 4+4?": Plan(answer="8"),
    "Answer briefly: what is the capital of France?": Plan(answer="Paris."),
    "What is the capital of France?": Plan(
        calls=(("capital_of", {"country": "France"}),),
        answer="The capital of France is {result}.",
        forever=True,
    ),
    "How many km is 26.2 mi?": Plan(
        calls=(("convert_units", {"value": 26.2, "from_unit": "mi", "to_unit": "km"}),),
        answer="That is {result}.",
    ),
    "Shout hi": Plan(calls=(("shout", {"text": "hi"}), ("done", {"answer": "HI"}))),
    "Look up the answer.": Plan(
        calls=(("lookup", {"key": "answer"}),), answer="The answer is {result}."
    ),
    "Keep checking the weather.": Plan(
        calls=(("weather", {"city": "Paris"}),), answer="It is {result}.", forever=True
    ),
    "Read /etc/shadow": Plan(
        calls=(("read_file", {"path": "/etc/shadow"}),), answer="I could not read it."
    ),
    "List the reports": Plan(calls=(("list_reports", {}),), answer="The reports: {result}"),
    "Refund order 9 (20 dollars).": Plan(
        calls=(("refund", {"order": 9, "amount": 20}),), answer="Order 9: {result}"
    ),
    "Refund order 7 (250 dollars).": Plan(
        calls=(("refund", {"order": 7, "amount": 250}),), answer="Order 7: {result}"
    ),
    "Refund order 8 (900 dollars).": Plan(
        calls=(("refund", {"order": 8, "amount": 900}),), answer="Order 8 was not refunded."
    ),
    "Check the slow service.": Plan(calls=(("slow_check", {}),), answer="It said: {result}"),
    "Find the report on tides": Plan(
        calls=(("remote_search", {"query": "tide"}),), answer="Found: {result}"
    ),
    "What is 2 + 3, as JSON?": Plan(
        calls=(("add", {"a": 2, "b": 3}),), answer='{{"a": 2, "b": 3, "total": {result}}}'
    ),
    "What is the weather in Paris?": Plan(
        calls=(("get_weather", {"city": "Paris"}),),
        answer='{{"city": "Paris", "celsius": 12, "conditions": "rain"}}',
    ),
    "How is the weather in Oslo?": Plan(
        calls=(("get_weather", {"city": "Oslo"}),),
        answer="It is {result} in Oslo.",
        repaired='{{"city": "Oslo", "celsius": 12, "conditions": "rain"}}',
    ),
    "Weather in Rome, as JSON?": Plan(answer='{{"city": "Rome", "celsius": 21}}'),
    "Read the five chapters.": Plan(
        calls=tuple(("read_chapter", {"n": n}) for n in range(1, 6)),
        answer="I read all five chapters.",
    ),
}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


_ANSWER_AFTER_STOP = re.compile(
    r'The user asked: "(?P<prompt>.*)"\nThe answer is (?P<results>.*)\. Say that to the user\.'
)
"""The directive of the answer after a guard's stop (turnkeeper.guards.answer_request)."""
_OUTPUT_REPAIR = "Your answer could not be used: "
"""How the output guard's directive begins (turnkeeper.guards.typed_output)."""


_CALLS_MADE = re.compile(r"calls made: (\d+)")


def summary(transcript: str) -> dict[str, Any]:
    """The reply to a summary request of `transcript`: the last request it shows, and the
    calls made (an earlier summary's count, and the calls it shows)."""
    earlier = _CALLS_MADE.search(transcript)
    made = (int(earlier[1]) if earlier else 0) + transcript.count("\nAssistant called ")
    asked = re.findall(r"^User: (.*)$", transcript, re.MULTILINE)
    what = f"The user asked: {asked[-1]} " if asked else ""
    return text_response(f"{what}Tool calls made: {made}.", usage=(60, 12))


def answer(request: dict[str, Any], ids: itertools.count[int]) -> tuple[int, dict[str, Any]]:
    """The status and body that answer a chat-completions request by its prompt's plan."""
    messages: list[dict[str, Any]] = request.get("messages", [])
    if messages and _text(messages[0]) == SUMMARY_SYSTEM:
        return 200, summary(_text(messages[-1]))
    if request.get("tool_choice") == "none" and messages:
        quoted = _ANSWER_AFTER_STOP.search(_text(messages[-1]))
        if quoted is not None and quoted["prompt"] in PLANS:
            reply = PLANS[quoted["prompt"]].answer.format(result=quoted["results"])
            return 200, text_response(reply, usage=(40, 10))
    start = next(
        (
            index
            for index in range(len(messages) - 1, -1, -1)
            if messages[index].get("role") == "user" and _text(messages[index]) in PLANS
        ),
        None,
    )
    if start is None:
        asked = [_text(message) for message in messages if message.get("role") == "user"]
        error = f"the docs model (tests/docs/model.py) has no plan for any of {asked!r}"
        return 400, {"error": {"message": error}}
    plan = PLANS[_text(messages[start])]
    since = messages[start + 1 :]
    made = sum(
        1 for message in since if message.get("role") == "assistant" and message.get("tool_calls")
    )
    for message in messages[:start]:
        said = _text(message)
        counted = _CALLS_MADE.search(said) if said.startswith(SUMMARY_LEAD) else None
        made += int(counted[1]) if counted else 0
    results = [_text(message) for message in since if message.get("role") == "tool"]
    offered = {tool["function"]["name"] for tool in request.get("tools") or ()}
    if plan.calls and (made < len(plan.calls) or plan.forever):
        name, arguments = plan.calls[min(made, len(plan.calls) - 1)]
        if name in offered:
            return 200, tool_response((name, arguments, f"call_{next(ids)}"), usage=(40, 10))
    last = results[-1] if results else ""
    if plan.repaired and _text(messages[-1]).startswith(_OUTPUT_REPAIR):
        return 200, text_response(plan.repaired.format(result=last), usage=(40, 10))
    return 200, text_response(plan.answer.format(result=last), usage=(40, 10))


@dataclass
class DocsModel:
    """A Behaviour answering the request the server has just read (its last `received`:
    nothing else runs between the server reading a request and calling `respond`)."""

    server: ChatServer
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        status, body = answer(self.server.received[-1].body, self.ids)
        return await Reply(status, body).respond(connection, stream)


class Endless(list[Behaviour]):
    """A script that never runs out: every request gets the same behaviour."""

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__([behaviour])

    def pop(self, index: SupportsIndex = -1) -> Behaviour:
        return self[0]
