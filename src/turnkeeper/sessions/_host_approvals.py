"""The Host's part that takes decisions on tool calls awaiting approval."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from turnkeeper.core import ApprovalDecision, InputError, encodes
from turnkeeper.events import ApprovalDecided
from turnkeeper.sessions._host_base import HostBase
from turnkeeper.sessions._host_records import _Session
from turnkeeper.state import awaiting_approval


class HostApprovals(HostBase):
    """`approve`: the decisions on a session's calls awaiting approval, logged."""

    if TYPE_CHECKING:

        def _use(self, session_id: str) -> AbstractAsyncContextManager[_Session]: ...

    async def approve(self, session_id: str, decisions: Sequence[ApprovalDecision]) -> None:
        """Approve or deny calls of the session awaiting approval (status
        "awaiting_approval"), by call id; returns once the decisions are logged. Calls may
        be decided a few at a time: once every call awaiting approval is decided, the reply's
        calls go on as any do (the approved ones run, or wait for results from outside),
        and each denied one is answered with a tool error saying it was denied."""
        self._check_accepting()
        checked = check_decisions(decisions)
        async with self._use(session_id) as session:
            async with session.lock:
                awaiting = [use.id for use in awaiting_approval(session.state)]
                if not awaiting:
                    raise InputError(f"session {session_id} has no tool calls awaiting approval")
                unknown = [decision.tool_call_id for decision in checked]
                unknown = [call_id for call_id in unknown if call_id not in awaiting]
                if unknown:
                    raise InputError(
                        f"decisions: tool calls {unknown} do not await approval (awaiting: "
                        f"{awaiting})"
                    )
                events = [
                    ApprovalDecided(
                        tool_call_id=decision.tool_call_id,
                        approved=decision.approved,
                        reason=decision.reason,
                    )
                    for decision in checked
                ]
                await self._commit_events(session, events, own=False)
            self._wake(session)


def check_decisions(decisions: Iterable[object]) -> list[ApprovalDecision]:
    """`decisions` as a list, if it is a list of ApprovalDecisions with one decision per
    call id at most and a reason a log can hold; otherwise InputError naming the first
    that is wrong."""
    if isinstance(decisions, str | bytes | dict) or not isinstance(decisions, Iterable):
        raise InputError(
            f"decisions: expected a list of ApprovalDecision, got {type(decisions).__name__}"
        )
    checked: list[ApprovalDecision] = []
    seen: set[str] = set()
    for index, decision in enumerate(decisions):
        where = f"decisions[{index}]"
        if not isinstance(decision, ApprovalDecision):
            raise InputError(f"{where}: expected ApprovalDecision, got {decision!r:.80}")
        if not isinstance(decision.tool_call_id, str):
            raise InputError(f"{where}.tool_call_id: expected a string")
        if not isinstance(decision.approved, bool):
            raise InputError(f"{where}.approved: expected true or false")
        reason = decision.reason
        if reason is not None and not (isinstance(reason, str) and encodes(reason)):
            raise InputError(f"{where}.reason: expected a string a log can hold (UTF-8) or null")
        if decision.tool_call_id in seen:
            raise InputError(f"{where}: a second decision on tool call {decision.tool_call_id}")
        seen.add(decision.tool_call_id)
        checked.append(decision)
    if not checked:
        raise InputError("decisions: expected at least one decision")
    return checked
