"""MCP tool sources against a real MCP server (tests/tools/mcp_server.py, written with the
official SDK) run as a stdio subprocess, and once over streamable HTTP; both anyio backends."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import (
    AgentSpec,
    InputError,
    McpServer,
    ToolSpec,
    ToolUse,
)
from turnkeeper.events import (
    McpFailed,
    SessionOpened,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import run
from turnkeeper.state import replay
from turnkeeper.tools._handlers import ToolContext
from turnkeeper.tools._mcp import McpError, McpPool, mcp_servers_from_commands

SERVER_SCRIPT = str(Path(__file__).with_name("mcp_server.py"))
# Generous: start-up imports the SDK, and the machine may be busy.
TEST = McpServer("test", command=sys.executable, args=(SERVER_SCRIPT,), timeout=60)


def events_of(result: Any, kind: type) -> list[Any]:
    return [envelope.event for envelope in result.events if isinstance(envelope.event, kind)]


def tool_texts(result: Any) -> dict[str, tuple[str, bool]]:
    return {e.tool_call_id: (e.text, e.is_error) for e in events_of(result, ToolReturned)}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.anyio
async def test_a_session_lists_the_server_tools_and_calls_them() -> None:
    chat = ScriptedChat(
        [
            tool_response(("add", {"a": 2, "b": 3}), ("echo", {"text": "hi", "times": 2})),
            tool_response(("fail", {"reason": "not today"})),
            text_response("done"),
        ]
    )
    spec = AgentSpec(system_prompt="Use the tools.", mcp_servers=(TEST,))
    result = await run(spec, "go", chat)
    assert (result.terminal, result.text) == ("end_turn", "done")
    offered = {tool["function"]["name"]: tool["function"] for tool in chat.requests[0]["tools"]}
    assert {"add", "echo", "fail", "hang", "crash", "pid"} <= set(offered)
    assert offered["add"]["description"] == "Add two integers."
    assert offered["add"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert offered["add"]["parameters"]["required"] == ["a", "b"]
    texts = tool_texts(result)
    assert texts["call_1"] == ("5", False)
    assert texts["call_2"] == ("hi hi", False)
    fail_text, is_error = texts["call_3"]
    assert is_error
    assert "refused: not today" in fail_text
    # The model got the error as an error result.
    last_tool = [m for m in chat.requests[2]["messages"] if m["role"] == "tool"][-1]
    assert '"isError":true' in last_tool["content"].replace(" ", "")
    opened = events_of(result, SessionOpened)[0]
    assert {tool.name: tool.mcp_server for tool in opened.spec.tools}["add"] == "test"
    assert replay(result.events) == result.state


@pytest.mark.anyio
async def test_a_long_result_from_a_server_is_cut_as_a_handlers_is() -> None:
    chat = ScriptedChat(
        [tool_response(("echo", {"text": "x" * 300, "times": 10})), text_response("ok")]
    )
    spec = AgentSpec(system_prompt="Use the tools.", mcp_servers=(TEST,))
    result = await run(spec, "go", chat, max_tool_result_chars=500)
    text, is_error = tool_texts(result)["call_1"]
    assert not is_error
    assert text.startswith(" ".join(["x" * 300] * 2)[:500] + "\n[turnkeeper: result cut: ")
    assert "[turnkeeper: result cut: " in text
    assert len(text) < 700
    assert replay(result.events) == result.state


@pytest.mark.anyio
async def test_a_call_that_hangs_times_out_into_an_error_and_an_event() -> None:
    chat = ScriptedChat(
        [tool_response(("hang", {})), tool_response(("add", {"a": 1, "b": 1})), text_response("ok")]
    )
    result = await run(AgentSpec(mcp_servers=(TEST,)), "go", chat, tool_timeout=0.5)
    assert (result.terminal, result.text) == ("end_turn", "ok")
    [failure] = events_of(result, McpFailed)
    assert (failure.server, failure.reason, failure.tool, failure.tool_call_id) == (
        "test",
        "timeout",
        "hang",
        "call_1",
    )
    text, is_error = tool_texts(result)["call_1"]
    assert is_error
    assert text.startswith("hang timed out: MCP server 'test' gave no answer within 0.5 s")
    # The connection outlives the timed-out call.
    assert tool_texts(result)["call_2"] == ("2", False)


@pytest.mark.anyio
async def test_a_server_that_dies_mid_session_is_an_error_then_is_started_again() -> None:
    chat = ScriptedChat(
        [
            tool_response(("pid", {})),
            tool_response(("crash", {})),
            tool_response(("pid", {"note": "after the crash"})),
            text_response("still here"),
        ]
    )
    result = await run(AgentSpec(mcp_servers=(TEST,)), "go", chat)
    assert (result.terminal, result.text) == ("end_turn", "still here")
    texts = tool_texts(result)
    first_pid, second_pid = int(texts["call_1"][0]), int(texts["call_3"][0])
    assert first_pid != second_pid
    assert gone(first_pid)
    crash_text, is_error = texts["call_2"]
    assert is_error
    assert "MCP server 'test' stopped while running it" in crash_text
    [failure] = events_of(result, McpFailed)
    assert (failure.reason, failure.tool, failure.tool_call_id) == ("died", "crash", "call_2")
    assert replay(result.events) == result.state


async def local() -> str:
    return "local"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("server", "error"),
    [
        (
            McpServer("ghost", command="/nonexistent/turnkeeper-mcp-server"),
            "No such file or directory",
        ),
        (
            McpServer("quitter", command=sys.executable, args=("-c", "raise SystemExit(1)")),
            "exited",
        ),
        (
            McpServer(
                "sleeper",
                command=sys.executable,
                args=("-c", "import time; time.sleep(60)"),
                timeout=0.5,
            ),
            "did not start and list its tools within 0.5 s",
        ),
    ],
    ids=["missing", "exits", "silent"],
)
async def test_a_server_that_cannot_start_is_logged_and_the_session_goes_on(
    server: McpServer, error: str
) -> None:
    chat = ScriptedChat([tool_response(("read", {})), text_response("without it")])
    spec = AgentSpec(tools=(ToolSpec("local"),), mcp_servers=(server, TEST))
    result = await run(spec, "go", chat, tools={"local": local})
    assert (result.terminal, result.text) == ("end_turn", "without it")
    assert result.events[0].type == "local.session_opened"
    assert result.events[1].type == "local.mcp_error"
    failure = result.events[1].event
    assert isinstance(failure, McpFailed)
    assert (failure.server, failure.reason) == (server.name, "start_failed")
    assert error in failure.error
    names = [tool["function"]["name"] for tool in chat.requests[0]["tools"]]
    assert "local" in names
    assert "add" in names
    [refusal] = [m["content"] for m in result.transcript if m["role"] == "tool"]
    assert "unknown tool 'read'" in refusal
    assert f"MCP server {server.name!r} could not start: {failure.error}" in refusal
    assert replay(result.events) == result.state


@pytest.mark.anyio
async def test_a_call_when_the_only_server_could_not_start_is_answered_with_why() -> None:
    ghost = McpServer("ghost", command="/nonexistent/turnkeeper-mcp-server")
    chat = ScriptedChat([tool_response(("echo", {"text": "hi"})), text_response("without it")])
    result = await run(AgentSpec(mcp_servers=(ghost,)), "go", chat)
    assert (result.terminal, result.text) == ("end_turn", "without it")
    [refusal] = [m["content"] for m in result.transcript if m["role"] == "tool"]
    assert "Error: unknown tool 'echo'. There are no tools." in refusal
    assert "MCP server 'ghost' could not start" in refusal
    assert replay(result.events) == result.state


@pytest.mark.anyio
async def test_sessions_of_one_pool_share_a_connection_closed_with_the_pool() -> None:
    pids: list[int] = []

    async def session() -> None:
        chat = ScriptedChat([tool_response(("pid", {})), text_response("ok")])
        result = await run(AgentSpec(mcp_servers=(TEST,)), "go", chat, mcp=pool)
        pids.append(int(tool_texts(result)["call_1"][0]))

    async with McpPool() as pool:
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(session)
        assert pool.connections == 1
    assert len(set(pids)) == 1
    assert pool.connections == 0
    assert gone(pids[0])


@pytest.mark.anyio
async def test_a_pool_used_outside_its_block_says_so() -> None:
    pool = McpPool()
    with pytest.raises(McpError, match="async with McpPool"):
        await pool.open(AgentSpec(mcp_servers=(TEST,)))


@pytest.mark.anyio
async def test_tool_name_collisions_are_an_error_and_a_prefix_resolves_them() -> None:
    other = msgspec.structs.replace(TEST, name="other")
    async with McpPool() as pool:
        with pytest.raises(McpError) as caught:
            await pool.open(AgentSpec(tools=(ToolSpec("add"),), mcp_servers=(TEST,)))
        assert "'add' is given by both the spec and MCP server 'test'" in str(caught.value)
        with pytest.raises(McpError, match="by both MCP server 'test' and MCP server 'other'"):
            await pool.open(AgentSpec(mcp_servers=(TEST, other)))
        prefixed = msgspec.structs.replace(other, tool_prefix="other_")
        chat = ScriptedChat(
            [
                tool_response(("other_add", {"a": 4, "b": 5}), ("add", {"a": 1, "b": 2})),
                text_response("ok"),
            ]
        )
        result = await run(AgentSpec(mcp_servers=(TEST, prefixed)), "go", chat, mcp=pool)
        assert tool_texts(result) == {"call_1": ("9", False), "call_2": ("3", False)}
        spec = result.state.spec
        assert spec.tool("other_add") is not None
        assert spec.tool("other_add").mcp_server == "other"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_logged_spec_is_not_listed_again_and_its_calls_still_route() -> None:
    async with McpPool() as pool:
        first = await run(
            AgentSpec(mcp_servers=(TEST,)), "go", ScriptedChat([text_response("hi")]), mcp=pool
        )
        logged = first.state.spec
        tools = await pool.open(logged)
        assert tools.spec == logged
        chat = ScriptedChat([tool_response(("add", {"a": 20, "b": 22})), text_response("42")])
        again = await run(logged, "go", chat, mcp=pool)
        assert tool_texts(again)["call_1"] == ("42", False)
        use = ToolUse("call_9", "add", {"a": 1, "b": 1})
        result, failure = await tools.call(use, ToolContext("s", use.id, use.name))
        assert (result.tool_use_id, result.text, result.is_error, failure) == (
            "call_9",
            "2",
            False,
            None,
        )


@pytest.mark.anyio
async def test_without_handlers_mcp_tools_still_run_and_other_tools_return_control() -> None:
    chat = ScriptedChat(
        [tool_response(("add", {"a": 1, "b": 2})), tool_response(("outside", {"q": "x"}))]
    )
    spec = AgentSpec(tools=(ToolSpec("outside"),), mcp_servers=(TEST,))
    result = await run(spec, "go", chat)
    assert tool_texts(result)["call_1"] == ("3", False)
    assert result.terminal == "requires_action"
    assert [use.name for use in result.tool_uses] == ["outside"]


@pytest.mark.anyio
async def test_env_values_are_filled_from_the_host_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TURNKEEPER_TEST_SECRET", "s3cret")
    server = msgspec.structs.replace(TEST, env={"TEST_SECRET": "pre-${TURNKEEPER_TEST_SECRET}"})
    chat = ScriptedChat([tool_response(("secret", {})), text_response("ok")])
    result = await run(AgentSpec(mcp_servers=(server,)), "go", chat)
    assert tool_texts(result)["call_1"] == ("pre-s3cret", False)
    logged = msgspec.json.encode(result.events[0]).decode()
    assert "${TURNKEEPER_TEST_SECRET}" in logged
    assert "s3cret" not in logged


@pytest.mark.anyio
async def test_an_unset_env_variable_is_a_start_failure_naming_it() -> None:
    server = msgspec.structs.replace(TEST, env={"TEST_SECRET": "${TURNKEEPER_SURELY_UNSET_VAR}"})
    result = await run(AgentSpec(mcp_servers=(server,)), "go", ScriptedChat([text_response("ok")]))
    [failure] = events_of(result, McpFailed)
    assert failure.reason == "start_failed"
    assert "TURNKEEPER_SURELY_UNSET_VAR is not set" in failure.error


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER_SCRIPT, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "the HTTP MCP server exited"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.anyio
async def test_a_streamable_http_server_gets_its_headers(
    http_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNKEEPER_TEST_TOKEN", "t0ken")
    server = McpServer(
        "web",
        url=http_server,
        headers={"X-Test": "hello", "Authorization": "Bearer ${TURNKEEPER_TEST_TOKEN}"},
        timeout=60,
    )
    chat = ScriptedChat(
        [
            tool_response(("header", {"name": "x-test"}), ("header", {"name": "authorization"})),
            tool_response(("add", {"a": 6, "b": 7})),
            text_response("ok"),
        ]
    )
    result = await run(AgentSpec(mcp_servers=(server,)), "go", chat)
    texts = tool_texts(result)
    assert texts["call_1"] == ("hello", False)
    assert texts["call_2"] == ("Bearer t0ken", False)
    assert texts["call_3"] == ("13", False)


def test_mcp_server_checks_its_fields() -> None:
    with pytest.raises(InputError, match="either a command"):
        McpServer("x")
    with pytest.raises(InputError, match="either a command"):
        McpServer("x", command="a", url="http://127.0.0.1/mcp")
    with pytest.raises(InputError, match="url must start with http"):
        McpServer("x", url="ftp://127.0.0.1")
    with pytest.raises(InputError, match=r"McpServer\.name"):
        McpServer("has space", command="a")
    with pytest.raises(InputError, match="timeout must be more than 0"):
        McpServer("x", command="a", timeout=0)
    with pytest.raises(InputError, match="args must be a list of strings"):
        McpServer("x", command="a", args="--flag")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="env must map strings to strings"):
        McpServer("x", command="a", env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(InputError, match="tool_prefix"):
        McpServer("x", command="a", tool_prefix="a b")


def test_agent_spec_checks_its_servers_and_tools() -> None:
    with pytest.raises(InputError, match="server 'test' is listed twice"):
        AgentSpec(mcp_servers=(TEST, TEST))
    with pytest.raises(InputError, match="names MCP server 'nowhere'"):
        AgentSpec(tools=(ToolSpec("add", mcp_server="nowhere"),))


@given(
    st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1)),
    st.dictionaries(st.text(min_size=1), st.text()),
    st.sampled_from([None, "https://127.0.0.1:8443/mcp"]),
)
def test_a_spec_with_servers_round_trips_through_json(
    args: list[str], env: dict[str, str], url: str | None
) -> None:
    server = (
        McpServer("s", url=url, headers=env)
        if url
        else McpServer("s", command="srv", args=tuple(args), env=env)
    )
    spec = AgentSpec(tools=(ToolSpec("t", mcp_server="s"),), mcp_servers=(server,))
    assert msgspec.json.decode(msgspec.json.encode(spec), type=AgentSpec) == spec


@given(
    st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1), min_size=1
    )
)
def test_mcp_command_lines_split_as_a_shell_would(words: list[str]) -> None:
    [server] = mcp_servers_from_commands([shlex.join(words)])
    assert (server.name, server.command, server.args) == ("mcp1", words[0], tuple(words[1:]))


def test_bad_mcp_command_lines_are_input_errors() -> None:
    with pytest.raises(InputError, match="give the server's command line"):
        mcp_servers_from_commands(["  "])
    with pytest.raises(InputError, match="No closing quotation"):
        mcp_servers_from_commands(["server 'unclosed"])
    names = [s.name for s in mcp_servers_from_commands(["a", "b --x"])]
    assert names == ["mcp1", "mcp2"]


def test_without_the_mcp_extra_a_spec_naming_servers_says_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys

        class NoMcp:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("mcp", "mcp_types"):
                    raise ImportError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoMcp())
        import anyio
        from turnkeeper.core import AgentSpec
        from turnkeeper.core import McpServer
        from turnkeeper.providers import ScriptedChat, text_response
        from turnkeeper.sessions import run
        from turnkeeper.tools._mcp import McpError

        async def main():
            spec = AgentSpec(mcp_servers=(McpServer("s", command="srv"),))
            try:
                await run(spec, "go", ScriptedChat([text_response("ok")]))
            except McpError as error:
                print(error)

        anyio.run(main)
        """
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": src},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'turnkeeper[mcp]'" in done.stdout


def test_a_stdio_server_starts_while_stderr_is_a_stream_with_no_file() -> None:
    # The SDK binds its default errlog (sys.stderr) when it is imported; here that is a
    # StringIO, which the server process cannot be given.
    code = textwrap.dedent(
        f"""
        import contextlib, io, sys
        import anyio
        from turnkeeper import AgentSpec, McpServer
        from turnkeeper.providers import ScriptedChat, text_response, tool_response
        from turnkeeper.sessions import run

        server = McpServer("test", command=sys.executable, args=({SERVER_SCRIPT!r},), timeout=60)

        async def main():
            chat = ScriptedChat([tool_response(("add", {{"a": 2, "b": 3}})), text_response("5")])
            return await run(AgentSpec(mcp_servers=(server,)), "go", chat)

        with contextlib.redirect_stderr(io.StringIO()):
            result = anyio.run(main)
        print(result.terminal, result.text)
        """
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": src},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "end_turn 5"


@pytest.mark.anyio
async def test_a_run_cancelled_from_outside_during_a_call_stops_its_server() -> None:
    pids: list[int] = []
    hanging = anyio.Event()

    async def record(envelope: Any) -> None:
        event = envelope.event
        if isinstance(event, ToolReturned) and event.tool_call_id == "call_1":
            pids.append(int(event.text))
        if isinstance(event, ToolCalled) and event.name == "hang":
            hanging.set()

    chat = ScriptedChat([tool_response(("pid", {})), tool_response(("hang", {}))])
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def session() -> None:
                await run(AgentSpec(mcp_servers=(TEST,)), "go", chat, on_event=record)

            group.start_soon(session)
            await hanging.wait()
            scope.cancel()
    assert scope.cancelled_caught
    assert gone(pids[0])


@pytest.mark.anyio
async def test_a_logged_tool_whose_server_cannot_start_is_an_error_result_and_an_event() -> None:
    ghost = McpServer("ghost", command="/nonexistent/turnkeeper-mcp-server")
    spec = AgentSpec(tools=(ToolSpec("read", mcp_server="ghost"),), mcp_servers=(ghost,))
    chat = ScriptedChat([tool_response(("read", {})), text_response("gave up")])
    result = await run(spec, "go", chat)
    assert (result.terminal, result.text) == ("end_turn", "gave up")
    [failure] = events_of(result, McpFailed)
    assert (failure.server, failure.reason, failure.tool, failure.tool_call_id) == (
        "ghost",
        "start_failed",
        "read",
        "call_1",
    )
    text, is_error = tool_texts(result)["call_1"]
    assert is_error
    assert text.startswith("read is unavailable: MCP server 'ghost' could not start: ")
    assert "No such file or directory" in text
