"""Sessions: state, inputs, poll_turn, normalize, and running a session to completion."""

from turnkeeper.core import AgentSpec, Chat, ChatError, ToolResult, ToolSpec, ToolUse, Usage
from turnkeeper.sessions._driver import poll_turn
from turnkeeper.sessions._fleet import FleetHost
from turnkeeper.sessions._fleet_owner import session_id_for
from turnkeeper.sessions._fork import fork_events
from turnkeeper.sessions._host import Host
from turnkeeper.sessions._host_records import (
    Busy,
    HostStatus,
    HostStopped,
    SessionInfo,
    SessionUnreadable,
    UnknownSession,
)
from turnkeeper.sessions._inputs import Input, Kickoff, Resume, UserMessage
from turnkeeper.sessions._normalize import Terminal, TurnResult, normalize
from turnkeeper.sessions._open import check_guards_of, new_session_id, open_session
from turnkeeper.sessions._poll import (
    begin_poll,
    build_request,
    check_response,
    check_results,
    emit,
    end_poll,
    failure_events,
    opened_event,
)
from turnkeeper.sessions._recheck import Divergence, recheck
from turnkeeper.sessions._run import (
    Approver,
    DeltaCallback,
    EventCallback,
    RunResult,
    TurnGuard,
    run,
)
from turnkeeper.state import SessionState, Status
from turnkeeper.tools import Tools

__all__ = [
    "AgentSpec",
    "Approver",
    "Busy",
    "Chat",
    "ChatError",
    "DeltaCallback",
    "Divergence",
    "EventCallback",
    "FleetHost",
    "Host",
    "HostStatus",
    "HostStopped",
    "Input",
    "Kickoff",
    "Resume",
    "RunResult",
    "SessionInfo",
    "SessionState",
    "SessionUnreadable",
    "Status",
    "Terminal",
    "ToolResult",
    "ToolSpec",
    "ToolUse",
    "Tools",
    "TurnGuard",
    "TurnResult",
    "UnknownSession",
    "Usage",
    "UserMessage",
    "begin_poll",
    "build_request",
    "check_guards_of",
    "check_response",
    "check_results",
    "emit",
    "end_poll",
    "failure_events",
    "fork_events",
    "new_session_id",
    "normalize",
    "open_session",
    "opened_event",
    "poll_turn",
    "recheck",
    "run",
    "session_id_for",
]
