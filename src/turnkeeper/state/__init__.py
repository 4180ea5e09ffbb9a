"""State: SessionState, the pure fold that advances it by one event, and replay."""

from turnkeeper.state._approvals import approval_request, awaiting_approval, denial
from turnkeeper.state._packed import PackedState, pack_state, unpack_state
from turnkeeper.state._replay import replay
from turnkeeper.state._results import results_of, results_received, whole_results
from turnkeeper.state._state import SessionState, Status, apply_event, fold, initial_state

__all__ = [
    "PackedState",
    "SessionState",
    "Status",
    "apply_event",
    "approval_request",
    "awaiting_approval",
    "denial",
    "fold",
    "initial_state",
    "pack_state",
    "replay",
    "results_of",
    "results_received",
    "unpack_state",
    "whole_results",
]
