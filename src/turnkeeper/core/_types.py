"""Data shared by every layer: usage, tool specs, the agent spec, tool uses and results."""

from __future__ import annotations

import re
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import msgspec

from turnkeeper.core._checks import check_seconds
from turnkeeper.core._compaction import Compaction, check_compaction
from turnkeeper.core._errors import InputError
from turnkeeper.core._jsonschema import is_valid, schema_problem
from turnkeeper.core._output import output_problem
from turnkeeper.core._pricing import Pricing, add_costs

Message = dict[str, Any]
"""An OpenAI chat-completions message, string-keyed, kept verbatim."""

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_INT64 = (-(2**63), 2**63 - 1)

Approval = Literal["never", "always"] | dict[str, Any]
"""When a tool's calls need approval before they run: `never`, `always`, or a JSON Schema
of the arguments (a call whose arguments match it needs approval). A schema, not a Python
function: the spec is logged, and replay, another worker and the HTTP API must all reach
the same answer from the log alone."""

if TYPE_CHECKING:
    OutputSchema: TypeAlias = dict[str, Any] | type[Any]
else:
    # The log and the HTTP API hold a JSON Schema only: a type given in Python is turned
    # into its schema before the spec is logged (`with_output_schema`), so msgspec, which
    # decodes specs, knows the field as an object.
    OutputSchema = dict[str, Any]


class Usage(msgspec.Struct, frozen=True, gc=False):
    """Token usage of one or more model calls, and their exact cost when the spec has a
    `pricing` (None: no price known)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: Decimal | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        # Most usages have no cost: no call to add none.
        cost = other.cost
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost if cost is None else add_costs(self.cost, cost),
        )


class ToolSpec(msgspec.Struct, frozen=True):
    """A tool the model may call. `repeatable` tools (a status poll, say) are never deduplicated.

    `input_schema` must be a JSON Schema object; `check_tool` also refuses one its
    arguments cannot be checked against (invalid, or whose `$ref`s lead nowhere or round
    in a circle), as a session opens rather than when the model first calls the tool.
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    repeatable: bool = False
    mcp_server: str | None = None
    """The MCP server (by name, one of the spec's `mcp_servers`) that serves this tool;
    None for a tool run in-process or by the orchestrator."""
    approval: Approval = "never"
    """Whether a call must be approved before it runs (see `Approval`)."""
    timeout: float | None = None
    """Seconds a call of this tool may take; None: the run's or host's `tool_timeout`."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.match(self.name):
            raise InputError(
                f"ToolSpec.name: {self.name!r} must be 1 to 64 letters, digits, '_', '.' or '-'"
            )
        if not isinstance(self.input_schema, dict):
            raise InputError(
                f"ToolSpec.input_schema: the schema of tool {self.name!r} must be a JSON Schema "
                "object"
            )

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with `arguments` (as its handler gets them) needs approval."""
        approval = self.approval
        if isinstance(approval, dict):
            return is_valid(approval, arguments)
        return approval == "always"

    def to_openai(self) -> dict[str, Any]:
        """The tool in OpenAI chat-completions shape."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        }


class McpServer(msgspec.Struct, frozen=True):
    """An MCP server whose tools a session may call: a `command` started with `args` and
    `env` and spoken to over stdio, or a streamable HTTP `url` sent `headers`. Values in
    `env` and `headers` may name variables of the host's environment as `${NAME}`, filled
    in when connecting, so secrets stay out of logged specs. `tool_prefix` is put before
    each of its tool names (to tell servers with same-named tools apart); `timeout` bounds
    start-up and each call, in seconds."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    tool_prefix: str = ""
    timeout: float = 60.0

    def __post_init__(self) -> None:
        where = f"McpServer {self.name!r}"
        if not isinstance(self.name, str) or not _TOOL_NAME.match(self.name):
            raise InputError(
                f"McpServer.name: {self.name!r} must be 1 to 64 letters, digits, '_', '.' or '-'"
            )
        if (self.command is None) == (self.url is None):
            raise InputError(f"{where}: give either a command (stdio) or a url (streamable HTTP)")
        if self.command is not None and (not isinstance(self.command, str) or not self.command):
            raise InputError(f"{where}: command must be a non-empty string")
        if self.url is not None and (
            not isinstance(self.url, str) or not self.url.startswith(("http://", "https://"))
        ):
            raise InputError(f"{where}: url must start with http:// or https://, got {self.url!r}")
        args: object = self.args
        if not isinstance(args, list | tuple) or not all(isinstance(arg, str) for arg in args):
            raise InputError(f"{where}: args must be a list of strings")
        msgspec.structs.force_setattr(self, "args", tuple(self.args))
        for field in ("env", "headers"):
            value = getattr(self, field)
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise InputError(f"{where}: {field} must map strings to strings")
        if self.tool_prefix and not _TOOL_NAME.match(self.tool_prefix):
            raise InputError(
                f"{where}: tool_prefix {self.tool_prefix!r} may hold only letters, digits, "
                "'_', '.' or '-'"
            )
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float):
            raise InputError(f"{where}: timeout must be a number of seconds")
        if not self.timeout > 0:
            raise InputError(f"{where}: timeout must be more than 0 seconds, got {self.timeout}")


class AgentSpec(msgspec.Struct, frozen=True, dict=True):
    """What an agent is: its system prompt, tools, terminal tool, model and sampling params,
    and the MCP servers whose tools it may call (listed when a session opens, then added to
    `tools` with their `mcp_server` set).

    Sampling params are None (the server's default) or, as `check_spec` requires of a new
    session's spec, in OpenAI's ranges: `temperature` from 0 to 2, `top_p` more than 0 and
    at most 1, `max_tokens` 1 or more, `seed` a 64-bit integer; `stop` is a list of strings.
    `pricing` is the price of `model`, from which each call's cost is computed.

    `output_schema` types the final answer: a JSON Schema, or a type msgspec can describe
    (a msgspec Struct, a dataclass), which `run()` and the Host turn into its JSON Schema
    for the log and decode the answer into. The answer must then be JSON that matches it;
    one that does not is sent back to the model to fix (the `output` guard) and, after
    that, ends the episode (`invalid_output`). A spec with an `output_schema` has no
    `terminal_tool`, whose arguments would be the result instead.

    `compaction` says when older turns are summarised by the model (see `Compaction`; by
    default where the backend declares its context window, as the embedded model does);
    None: never (they are only cut, by the small-model window or the backend).
    """

    system_prompt: str = ""
    tools: tuple[ToolSpec, ...] = ()
    terminal_tool: str | None = None
    model: str = "default"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    mcp_servers: tuple[McpServer, ...] = ()
    pricing: Pricing | None = None
    output_schema: OutputSchema | None = None
    compaction: Compaction | None = Compaction()

    def __post_init__(self) -> None:
        tools = tuple(self.tools)
        msgspec.structs.force_setattr(self, "tools", tools)
        servers = tuple(self.mcp_servers)
        msgspec.structs.force_setattr(self, "mcp_servers", servers)
        server_names = [server.name for server in servers]
        for server in servers:
            if server_names.count(server.name) > 1:
                raise InputError(f"AgentSpec.mcp_servers: server {server.name!r} is listed twice")
        for tool in tools:
            if tool.mcp_server is not None and tool.mcp_server not in server_names:
                raise InputError(
                    f"AgentSpec.tools: tool {tool.name!r} names MCP server {tool.mcp_server!r}, "
                    "which is not one of the spec's mcp_servers"
                )
        stop: object = self.stop
        # A string is refused, not split into one-letter stops. Decoding only ever gives a
        # list of strings, so no log is refused here.
        if stop is not None and (
            not isinstance(stop, list | tuple) or not all(isinstance(item, str) for item in stop)
        ):
            raise InputError(f"AgentSpec.stop: expected a list of strings, got {stop!r:.80}")
        if self.stop is not None:
            msgspec.structs.force_setattr(self, "stop", tuple(self.stop))
        names = [tool.name for tool in tools]
        for name in names:
            if names.count(name) > 1:
                raise InputError(f"AgentSpec.tools: tool {name!r} is listed twice")
        if self.terminal_tool is not None and self.terminal_tool not in names:
            raise InputError(
                f"AgentSpec.terminal_tool: {self.terminal_tool!r} is not one of the tools "
                f"({', '.join(names) or 'none given'})"
            )

    def tool(self, name: str) -> ToolSpec | None:
        """The tool called `name`, if the spec has it."""
        return self._tools_by_name.get(name)

    # Derived from the (frozen) fields once per spec, kept in the instance's __dict__
    # (`dict=True`), which msgspec neither encodes nor compares: polls look them up often.
    @cached_property
    def _tools_by_name(self) -> dict[str, ToolSpec]:
        return {tool.name: tool for tool in self.tools}

    @cached_property
    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI chat-completions shape, for every request (which must not
        change them)."""
        return [tool.to_openai() for tool in self.tools]

    @cached_property
    def asks_approval(self) -> bool:
        """Whether any of its tools may need a call approved before it runs."""
        return any(tool.approval != "never" for tool in self.tools)

    def sampling(self) -> dict[str, Any]:
        """The sampling params that are set, as request fields."""
        params: dict[str, Any] = {}
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.seed is not None:
            params["seed"] = self.seed
        if self.stop is not None:
            params["stop"] = list(self.stop)
        return params


def check_tool(tool: ToolSpec, where: str) -> None:
    """Raise InputError, naming the field as `<where>.input_schema`, if the tool's arguments
    cannot be checked against its `input_schema`."""
    problem = schema_problem(tool.input_schema)
    if problem is not None:
        raise InputError(
            f"{where}.input_schema: the schema of tool {tool.name!r} cannot be used: {problem}"
        )


def check_spec(spec: AgentSpec) -> None:
    """Raise InputError, naming the field as `spec.<field>`, unless each tool's schema can
    check its arguments and each sampling param is None or in range. Decoding does not
    check these, so a log written before they were checked still reads."""
    if spec.pricing is not None and not isinstance(spec.pricing, Pricing):
        raise InputError(f"spec.pricing: expected a Pricing, got {type(spec.pricing).__name__}")
    problem = output_problem(spec.output_schema)
    if problem is not None:
        raise InputError(problem)
    if spec.output_schema is not None and spec.terminal_tool is not None:
        raise InputError(
            f"spec.output_schema: the spec's terminal_tool {spec.terminal_tool!r} ends the run "
            "with its arguments, checked by its input_schema; give a spec an output_schema or "
            "a terminal_tool, not both"
        )
    if spec.compaction is not None:
        check_compaction(spec.compaction, "spec.compaction")
    for index, tool in enumerate(spec.tools):
        _check_name(tool.name, f"spec.tools[{index}].name")
        check_tool(tool, f"spec.tools[{index}]")
        _check_approval(tool, f"spec.tools[{index}].approval")
        if tool.timeout is not None:
            check_seconds(
                f"spec.tools[{index}].timeout", tool.timeout, positive=True, optional=True
            )
    for index, server in enumerate(spec.mcp_servers):
        _check_name(server.name, f"spec.mcp_servers[{index}].name")
        if server.tool_prefix:
            _check_name(server.tool_prefix, f"spec.mcp_servers[{index}].tool_prefix")
    temperature, top_p = spec.temperature, spec.top_p
    if temperature is not None and not (_is_number(temperature) and 0 <= temperature <= 2):
        raise InputError(
            f"spec.temperature: expected a number from 0 to 2, got {temperature!r:.80}"
        )
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise InputError(
            f"spec.top_p: expected a number more than 0 and at most 1, got {top_p!r:.80}"
        )
    tokens = spec.max_tokens
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
    ):
        raise InputError(f"spec.max_tokens: expected an integer >= 1, got {tokens!r:.80}")
    seed = spec.seed
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not _INT64[0] <= seed <= _INT64[1]
    ):
        raise InputError(
            f"spec.seed: expected an integer from -2**63 to 2**63 - 1, got {seed!r:.80}"
        )


def _check_approval(tool: ToolSpec, where: str) -> None:
    """Raise InputError, naming `where`, unless the tool's approval policy is one a log can
    hold and that can be checked against its arguments."""
    approval: object = tool.approval
    if approval in ("never", "always"):
        return
    if not isinstance(approval, dict):
        function = (
            " (a Python function cannot be logged with the spec)" if callable(approval) else ""
        )
        raise InputError(
            f'{where}: expected "never", "always" or a JSON Schema object of the arguments '
            f"of tool {tool.name!r}, got {approval!r:.80}{function}"
        )
    problem = schema_problem(approval, of="the approval schema")
    if problem is not None:
        raise InputError(
            f"{where}: the approval schema of tool {tool.name!r} cannot be used: {problem}"
        )


def _check_name(name: str, where: str) -> None:
    """Refuse a name ending in a newline, which `$` in `_TOOL_NAME` lets through on decode
    (kept so that logs holding one still read); a chat server refuses it."""
    if not _TOOL_NAME.fullmatch(name):
        raise InputError(f"{where}: {name!r} must be 1 to 64 letters, digits, '_', '.' or '-'")


def _is_number(value: object) -> bool:
    """Whether `value` is an int or a float (not a bool). A NaN is one, but fails every range."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class ToolUse(msgspec.Struct, frozen=True, gc=False):
    """A tool call the model made. `error` says why `input` is `{}` when the arguments were bad.

    Not tracked by the cycle collector, as `SessionState`: only data, made for every reply.
    """

    id: str
    name: str
    input: dict[str, Any]
    error: str | None = None


class ToolResult(msgspec.Struct, frozen=True, gc=False):
    """The answer to one tool use."""

    tool_use_id: str
    text: str
    is_error: bool = False


class ApprovalDecision(msgspec.Struct, frozen=True, gc=False):
    """A decision on one tool call awaiting approval: approved (it runs), or denied (it
    does not; the model is told so as the call's error, with `reason` if given)."""

    tool_call_id: str
    approved: bool
    reason: str | None = None
