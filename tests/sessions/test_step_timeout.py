"""The step timeout: a model call that never returns fails as a chat error, logged, in
`run()` and in a Host, on both anyio backends; on by default, off only when asked."""

from __future__ import annotations

import inspect
import random
from typing import Any

import anyio
import pytest

from tests.sessions.host_worker import (
    SPEC,
    answer_for,
    check_log,
    prompt_for,
    settle,
    step_tool,
    stepper,
)
from turnkeeper.core import ChatError, InputError
from turnkeeper.events import ChatFailed, ChatRetried
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import text_response, with_retry
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


async def test_a_host_logs_the_retries_a_call_made_before_its_timeout() -> None:
    attempts = 0

    async def busy_then_silent(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ChatError("busy", transient=True, status=503)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    chat = with_retry(busy_then_silent, base_delay=0.0, jitter=lambda: 0.0)
    log = MemoryLog()
    async with Host(chat=chat, log=log, tools=step_tool(), step_timeout=0.2) as host:
        session_id = await host.start(SPEC, prompt_for(1))
        assert (await settle(host, session_id, timeout=30)).status == "errored"
        events = await log.read(session_id)
    assert [e.type for e in events[-2:]] == ["local.chat_retry", "local.chat_error"]
    retried = events[-2].event
    assert isinstance(retried, ChatRetried)
    assert (retried.attempt, retried.status) == (1, 503)
    assert replay(events).status == "running"


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_calls_ending_about_when_their_timeout_does_are_logged_once_either_way(
    seed: int,
) -> None:
    # Replies come from just before to just after the timeout, so some calls are cut short
    # at the moment their reply comes back. Each call is logged once, as its reply or as
    # the timeout, and the sessions sharing a task with a cut-short one go on unharmed.
    timeout = 0.05
    chance = random.Random(seed)
    model = stepper()

    async def around_the_timeout(request: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep(timeout * chance.uniform(0.8, 1.2))
        return await model(request)

    log = MemoryLog()
    host = Host(
        chat=around_the_timeout,
        log=log,
        tools=step_tool(),
        step_timeout=timeout,
        max_model_calls=4,
    )
    async with host:
        ids = [await host.start(SPEC, prompt_for(3, f"s{i}")) for i in range(30)]
        for _ in range(20):
            infos = [await settle(host, session_id, timeout=30) for session_id in ids]
            errored = [info.session_id for info in infos if info.status == "errored"]
            if not errored:
                break
            for session_id in errored:
                await host.retry(session_id)
        assert [info.status for info in infos] == ["idle"] * len(ids)
        assert host.counters["chat_errors"] > 0
        assert host.counters.get("session_crashes", 0) == 0
        for session_id in ids:
            events = await log.read(session_id)
            state = check_log(events)
            assert state.history[-1]["content"] == answer_for(3)
            failures = [e.event for e in events if isinstance(e.event, ChatFailed)]
            assert all("took longer than 0.05 s" in f.error for f in failures)
            # One step call and one result per step: no reply logged twice.
            calls = [e for e in events if e.type == "local.tool_call"]
            assert len(calls) == 3
