"""The output guard: an answer that does not match the spec's `output_schema` goes back to
the model, saying what is wrong, as a bad tool call does (see `repair`); after
`max_reprompts` of them in an episode, the episode ends (`invalid_output`)."""

from __future__ import annotations

import msgspec

from turnkeeper.core import gist, read_answer
from turnkeeper.guards._builtin import repairs, with_last_result
from turnkeeper.guards._view import CONTINUE, Directive, GuardView, Halt, Reply, Verdict, acts_in
from turnkeeper.state import SessionState

_SCHEMA_CHARS = 2000
"""Longest schema quoted in a re-prompt; a longer one is named, not shown."""
_compact = msgspec.json.Encoder()


def answer_problem(state: SessionState, reply: Reply) -> str | None:
    """What keeps `reply`, a final answer (no calls, finished), from being the episode's
    typed output, or None (also when the spec has no `output_schema`)."""
    schema = state.spec.output_schema
    if not isinstance(schema, dict):
        return None
    return read_answer(schema, reply.text)[1]


def output_halt(state: SessionState, problem: str) -> Halt:
    """The halt that ends an episode whose answer does not match the output schema."""
    lead = f"I'm sorry: my answer did not match the output schema ({gist(problem, 300)})."
    return Halt("output", "invalid_output", with_last_result(state, lead))


@acts_in("after_response", setting="output")
def typed_output(view: GuardView) -> Verdict:
    """Send back an answer that does not match the spec's `output_schema` (a reply without
    calls that the repair guard leaves alone), `max_reprompts` times, then halt."""
    state = view.state
    reply = view.reply
    config = state.guards.output
    if view.phase != "after_response" or reply is None or config is None:
        return CONTINUE
    if state.spec.output_schema is None:
        return CONTINUE
    if reply.calls or reply.finish_reason != "stop" or repairs(state, reply):
        return CONTINUE
    problem = answer_problem(state, reply)
    if problem is None:
        return CONTINUE
    if state.reprompts >= config.max_reprompts:
        return Verdict(halt=output_halt(state, problem))
    schema = _compact.encode(state.spec.output_schema).decode()
    shown = f": {schema}" if len(schema) <= _SCHEMA_CHARS else " you were given"
    text = (
        f"Your answer could not be used: {problem}. Reply again with only a JSON value, and "
        f"no other text, that matches the output schema{shown}"
    )
    return Verdict(directives=(Directive("output", text, counts="reprompt"),))
