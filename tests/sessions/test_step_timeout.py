"""The step timeout: a model call that never returns fails as a chat error, logged, in
`run()` and in a Host, on both anyio backends; on by default, off only when asked."""

from __future__ import annotations

import inspect
from typing import Any

import anyio
import pytest

from tests.sessions.host_worker import SPEC, prompt_for, settle, step_tool
from turnkeeper.core import ChatError, InputError
from turnkeeper.events import ChatFailed
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import text_response
from turnkeeper.sessions import Host, run
from turnkeeper.sessions._step_timeout import STEP_TIMEOUT, timed_chat
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio


async def never_returns(request: dict[str, Any]) -> dict[str, Any]:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def test_the_default_is_on_and_none_turns_it_off() -> None:
    assert STEP_TIMEOUT == 300.0
    assert inspect.signature(run).parameters["step_timeout"].default == STEP_TIMEOUT
    assert Host(chat=never_returns).step_timeout == STEP_TIMEOUT
    assert timed_chat(never_returns, None) is never_returns
    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(InputError, match="step_timeout"):
            Host(chat=never_returns, step_timeout=bad)  # type: ignore[arg-type]


async def test_a_timed_call_that_returns_in_time_is_untouched() -> None:
    async def quick(request: dict[str, Any]) -> dict[str, Any]:
        return text_response("hi")

    assert await timed_chat(quick, 5.0)({"messages": []}) == text_response("hi")


async def test_a_call_over_the_timeout_raises_a_transient_chat_error() -> None:
    with pytest.raises(ChatError, match=r"took longer than 0\.05 s") as raised:
        await timed_chat(never_returns, 0.05)({"messages": []})
    assert raised.value.transient


async def test_run_halts_on_a_model_call_that_never_returns() -> None:
    with anyio.fail_after(30):
        result = await run(SPEC, prompt_for(1), never_returns, step_timeout=0.1)
    assert (result.terminal, result.stop_reason) == ("terminated", "chat_error")
    assert result.text is not None
    assert "took longer than 0.1 s" in result.text
    failed = [e.event for e in result.events if isinstance(e.event, ChatFailed)]
    assert len(failed) == 1
    assert "took longer than 0.1 s" in failed[0].error
    assert replay(result.events).status == "halted"


async def test_a_host_session_whose_model_never_returns_ends_errored_not_running() -> None:
    log = MemoryLog()
    async with Host(chat=never_returns, log=log, tools=step_tool(), step_timeout=0.1) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        info = await settle(host, session_id, timeout=30)
        assert info.status == "errored"
        assert info.error is not None
        assert "took longer than 0.1 s" in info.error
        events = await log.read(session_id)
        assert events[-1].type == "local.chat_error"
        assert host.counters["chat_errors"] == 1
        # A retry makes the call again, and it times out again: never running for good.
        await host.retry(session_id)
        assert (await settle(host, session_id, timeout=30)).status == "errored"
        assert host.counters["chat_errors"] == 2
