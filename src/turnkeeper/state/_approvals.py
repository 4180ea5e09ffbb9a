"""Tool approval, read from a state: which calls need it, which await it, which were denied.

Pure: the policy is the tool's `approval` in the logged spec, a JSON Schema or a word, so
the same state always gives the same answer, live or rebuilt from the log.
"""

from __future__ import annotations

from turnkeeper.core import ToolUse, call_problem, coerce
from turnkeeper.events import ApprovalRequested
from turnkeeper.state._state import SessionState


def approval_request(state: SessionState) -> ApprovalRequested | None:
    """The `local.approval_requested` a state waiting on tool calls needs: for its pending
    calls that may run (well formed, of a known tool) whose tool's policy wants approval
    for their arguments (as the handler gets them) and that were not asked about yet; None
    when there are none."""
    spec = state.spec
    if state.status != "requires_action" or state.in_poll or not spec.asks_approval:
        return None
    asked: list[str] = []
    for use in state.pending:
        tool = spec.tool(use.name)
        if tool is None or tool.approval == "never" or use.id in state.approvals:
            continue
        if call_problem(spec, use) is not None:
            continue  # Refused as it is, approved or not.
        if tool.needs_approval(coerce(tool.input_schema, use.input)):
            asked.append(use.id)
    return ApprovalRequested(tool_call_ids=tuple(asked)) if asked else None


def awaiting_approval(state: SessionState) -> tuple[ToolUse, ...]:
    """The pending calls whose approval was asked for and not yet given or refused."""
    approvals = state.approvals
    if not approvals:
        return ()
    return tuple(use for use in state.pending if use.id in approvals and approvals[use.id] is None)


def denial(state: SessionState, use: ToolUse) -> str | None:
    """The tool error that answers `use` if its approval was denied, or None."""
    decided = state.approvals.get(use.id)
    if decided is None or decided.approved:
        return None
    why = f": {decided.reason}" if decided.reason else ""
    return f"Error: the call of {use.name} was denied approval{why}. It was not run."
