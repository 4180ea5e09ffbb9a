"""What the guards do for a small embedded model: 42 tool tasks in 7 kinds, run under the
default guards, with all guards off, with each guard removed in turn, and, on the same
model through `turnkeeper model serve`, by openai-agents, pydantic-ai and turnkeeper's
OpenAIChat.

    python bench/guards_embedded.py                       # everything, the default model
    python bench/guards_embedded.py --kinds one_tool,choice --configs default,off --per-kind 2
    python bench/guards_embedded.py --model other.gguf --model base.gguf:gemma --configs default

Kinds: one tool; two tools in sequence (look up, then compute); a tool that fails first
and succeeds on a corrected (or repeated) call; a choice among 11 tools; a question needing
no tool; a session resumed from a transcript; a follow-up message in the same session.
Each task has a checkable answer: the final text must hold it (a number not as part of a
longer one; words in any case).

Rows (`--configs`): `default` is what `turnkeeper run` uses for the embedded model (the
default guards and small-model mode); `off` turns every guard off but max_turns, which
alone bounds a run (its stop a halt, no answer after it); `no_answer` is the default with
every stop a halt (each guard's `answer` setting off); `no_<guard>` is the default with
that one guard off (one row per guard the default has on, max_turns aside).
`openai-agents`, `pydantic-ai` and `openai-chat` (turnkeeper `run` with OpenAIChat,
default guards) drive the same GGUF through
`turnkeeper model serve` on 127.0.0.1, started here; a framework that is not installed or
cannot drive the endpoint gets a row that says why, and counts as no answer.

Per row it prints: answered right (the final answer holds it), right only as the gist of
a halt, wrong, mean model calls, mean seconds per task (as measured, on whatever else
the machine runs), and how the runs ended; then right answers per kind. Figures, not
assertions. Temperature 0, max_turns 8, 120 s per task. `--json FILE` writes every run.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import msgspec

from turnkeeper.core import AgentSpec, GuardConfig, InputError, MaxTurns, SmallModel, ToolSpec
from turnkeeper.providers import EmbeddedChat, OpenAIChat, default_model_path
from turnkeeper.sessions import RunResult, run
from turnkeeper.tools import EXAMPLE_TOOLS

MAX_TURNS = 8
TASK_SECONDS = 120.0
SYSTEM_PROMPT = "You are a helpful assistant. Use the tools to answer."
DEFAULT_GUARDS = GuardConfig(small_model=SmallModel())
PEERS = ("openai-agents", "pydantic-ai", "openai-chat")
SERVER_START_SECONDS = 180.0

# The tools. Each run gets fresh functions (the flaky weather service fails each run's
# first call).

ToolFunction = Callable[..., Awaitable[Any]]


def _schema(**properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


_INTEGER = {"type": "integer"}
_STRING = {"type": "string"}
POPULATIONS = {"france": 68, "japan": 125, "peru": 34, "kenya": 55, "canada": 40, "italy": 59}
PRICES = {"apple": 1.25, "bread": 3.5, "milk": 2.75, "coffee": 4.5, "cheese": 6.25}
STOCKS = {"AAPL": 190, "MSFT": 410, "GOOG": 170, "AMZN": 180}
ORDERS = {"ORD-1234": "shipped", "ORD-5678": "delivered", "ORD-4321": "processing"}
WEATHER = {"paris": "sunny, 21 C", "tokyo": "rain, 16 C", "lima": "cloudy, 19 C"}
EXAMPLES = {
    spec.name: (spec, fn) for spec, fn in (t for t in EXAMPLE_TOOLS if isinstance(t, tuple))
}


def _key(text: str) -> str:
    return " ".join(str(text).lower().split()).removeprefix("the ")


def tool_set() -> dict[str, tuple[ToolSpec, ToolFunction]]:
    """Every tool a task may offer, each with a function of its own."""
    weather_calls = 0

    async def add(a: int, b: int) -> str:
        return str(a + b)

    async def multiply(a: int, b: int) -> str:
        return str(a * b)

    async def population(country: str) -> str:
        if _key(country) not in POPULATIONS:
            raise InputError(f"population: no figure for {country!r}")
        return f"{POPULATIONS[_key(country)]} million"

    async def price(item: str) -> str:
        found = PRICES.get(_key(item).removesuffix("s"))
        if found is None:
            raise InputError(f"price: no price for {item!r}; items: {', '.join(PRICES)}")
        return f"{found} dollars"

    async def stock_price(symbol: str) -> str:
        if symbol not in STOCKS:
            raise InputError(
                f"stock_price: unknown symbol {symbol!r}; give the ticker symbol in capitals, "
                "e.g. AAPL for Apple, MSFT for Microsoft"
            )
        return f"{STOCKS[symbol]} dollars"

    async def order_status(order_id: str) -> str:
        if order_id not in ORDERS:
            raise InputError(f"order_status: no order {order_id!r}; order ids look like ORD-1234")
        return ORDERS[order_id]

    async def weather(city: str) -> str:
        nonlocal weather_calls
        weather_calls += 1
        if weather_calls == 1:
            raise InputError("weather: the weather service timed out; call again")
        if _key(city) not in WEATHER:
            raise InputError(f"weather: no report for {city!r}")
        return WEATHER[_key(city)]

    tools: dict[str, tuple[ToolSpec, ToolFunction]] = {
        "add": (ToolSpec("add", "Add two integers.", _schema(a=_INTEGER, b=_INTEGER)), add),
        "multiply": (
            ToolSpec("multiply", "Multiply two integers.", _schema(a=_INTEGER, b=_INTEGER)),
            multiply,
        ),
        "population": (
            ToolSpec("population", "The population of a country.", _schema(country=_STRING)),
            population,
        ),
        "price": (
            ToolSpec("price", "The price of a grocery item, in dollars.", _schema(item=_STRING)),
            price,
        ),
        "stock_price": (
            ToolSpec("stock_price", "A company's stock price.", _schema(symbol=_STRING)),
            stock_price,
        ),
        "order_status": (
            ToolSpec("order_status", "The status of an order.", _schema(order_id=_STRING)),
            order_status,
        ),
        "weather": (
            ToolSpec("weather", "The weather in a city now.", _schema(city=_STRING)),
            weather,
        ),
    }
    return {**tools, **EXAMPLES}


CHOICE = (
    "add",
    "multiply",
    "calculator",
    "convert_units",
    "count_text",
    "capital_of",
    "current_time",
    "population",
    "price",
    "stock_price",
    "weather",
)


class Task(msgspec.Struct, frozen=True):
    """A request, the tools offered, and what a right answer holds (any of `expected`).

    `history` is a transcript to resume (OpenAI chat messages, no system message), and
    `prompt` then may be None; `follow_up` is a second message in the same session,
    whose answer is the one judged."""

    kind: str
    prompt: str | None
    tools: tuple[str, ...]
    expected: tuple[str, ...]
    history: tuple[dict[str, Any], ...] = ()
    follow_up: str | None = None


def _call(call_id: str, name: str, **arguments: Any) -> tuple[dict[str, Any], ...]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"id": call_id, "type": "function", "function": function}
    return ({"role": "assistant", "content": None, "tool_calls": [call]},)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _tasks() -> tuple[Task, ...]:
    one = "one_tool"
    seq = "sequence"
    fix = "fail_then_fix"
    no = "no_tool"
    res = "resumed"
    fol = "follow_up"
    basic = ("add", "calculator", "capital_of", "convert_units")
    return (
        Task(one, "What is 17 plus 25?", ("add",), ("42",)),
        Task(one, "What is 12 times 13?", ("multiply",), ("156",)),
        Task(one, "Convert 5 km to mi.", ("convert_units",), ("3.10686", "3.107", "3.11")),
        Task(one, "What is the capital of Kenya?", ("capital_of",), ("Nairobi",)),
        Task(
            one,
            "How many words are in this text: the quick brown fox jumps over the lazy dog",
            ("count_text",),
            ("9",),
        ),
        Task(one, "What is 144 / 12 + 7? Use the calculator.", ("calculator",), ("19",)),
        Task(
            seq,
            "Look up the population of Japan, then multiply it by 2.",
            ("population", "multiply"),
            ("250",),
        ),
        Task(
            seq,
            "Look up the population of France, then add 10 to it.",
            ("population", "add"),
            ("78",),
        ),
        Task(
            seq,
            "Look up the price of bread, then work out what 3 loaves cost.",
            ("price", "calculator"),
            ("10.5",),
        ),
        Task(
            seq,
            "Look up the price of coffee, then work out what 4 coffees cost.",
            ("price", "calculator"),
            ("18",),
        ),
        Task(
            seq,
            "Look up the populations of Peru and Kenya, then add them.",
            ("population", "add"),
            ("89",),
        ),
        Task(
            seq,
            "Look up the price of cheese, then multiply it by 8 with the calculator.",
            ("price", "calculator"),
            ("50",),
        ),
        Task(fix, "What is the stock price of Apple?", ("stock_price",), ("190",)),
        Task(fix, "What is Microsoft's stock price?", ("stock_price",), ("410",)),
        Task(fix, "What is the status of order 1234?", ("order_status",), ("shipped",)),
        Task(fix, "Where is my order 5678?", ("order_status",), ("delivered",)),
        Task(fix, "What is the weather in Paris?", ("weather",), ("sunny",)),
        Task(fix, "What is the weather in Tokyo?", ("weather",), ("rain",)),
        Task("choice", "What is the capital of Peru?", CHOICE, ("Lima",)),
        Task("choice", "Convert 100 F to C.", CHOICE, ("37.7778", "37.78", "37.8")),
        Task("choice", "What is 81 times 3?", CHOICE, ("243",)),
        Task("choice", "What is the population of Canada?", CHOICE, ("40",)),
        Task("choice", "How much does milk cost?", CHOICE, ("2.75",)),
        Task("choice", "How many words are in 'red green blue yellow'?", CHOICE, ("4",)),
        Task(no, "Say hello in French, in one word.", basic, ("bonjour",)),
        Task(no, "What color is the sky on a clear day? One word.", basic, ("blue",)),
        Task(no, "Reply with the word yes.", basic, ("yes",)),
        Task(no, "What is the opposite of hot? One word.", basic, ("cold",)),
        Task(no, "How many days are in a week?", basic, ("7", "seven")),
        Task(no, "Which animal says meow?", basic, ("cat",)),
        Task(
            res,
            None,
            ("add",),
            ("41",),
            (_user("What is 23 plus 18?"), *_call("r1", "add", a=23, b=18), _result("r1", "41")),
        ),
        Task(
            res,
            None,
            ("capital_of",),
            ("Tokyo",),
            (
                _user("What is the capital of Japan?"),
                *_call("r2", "capital_of", country="Japan"),
                _result("r2", "Tokyo"),
            ),
        ),
        Task(
            res,
            None,
            ("convert_units",),
            ("4.40925", "4.409", "4.41"),
            (
                _user("Convert 2 kg to lb."),
                *_call("r3", "convert_units", value=2, from_unit="kg", to_unit="lb"),
                _result("r3", "2 kg = 4.40925 lb"),
            ),
        ),
        Task(
            res,
            "Now add 8 to that number.",
            ("add", "multiply"),
            ("50",),
            (
                _user("What is 6 times 7?"),
                *_call("r4", "multiply", a=6, b=7),
                _result("r4", "42"),
                _said("6 times 7 is 42."),
            ),
        ),
        Task(
            res,
            "And what is the capital of Spain?",
            ("capital_of",),
            ("Madrid",),
            (
                _user("What is the capital of Italy?"),
                *_call("r5", "capital_of", country="Italy"),
                _result("r5", "Rome"),
                _said("The capital of Italy is Rome."),
            ),
        ),
        Task(
            res,
            "How much do 2 loaves cost?",
            ("price", "calculator"),
            ("7",),
            (
                _user("What is the price of bread?"),
                *_call("r6", "price", item="bread"),
                _result("r6", "3.5 dollars"),
                _said("Bread costs 3.5 dollars."),
            ),
        ),
        Task(
            fol, "What is 12 plus 30?", ("add", "multiply"), ("84",), (), "Now multiply that by 2."
        ),
        Task(
            fol,
            "What is the capital of France?",
            ("capital_of",),
            ("Berlin",),
            (),
            "And of Germany?",
        ),
        Task(
            fol,
            "Convert 10 km to mi.",
            ("convert_units",),
            ("16.0934", "16.09", "16.1"),
            (),
            "Now convert 10 mi to km.",
        ),
        Task(
            fol, "What is the population of Italy?", ("population",), ("125",), (), "And of Japan?"
        ),
        Task(fol, "What is 9 times 9?", ("multiply", "add"), ("100",), (), "Add 19 to that."),
        Task(fol, "How much does an apple cost?", ("price",), ("4.5",), (), "And coffee?"),
    )


TASKS = _tasks()
KINDS = tuple(dict.fromkeys(task.kind for task in TASKS))


def holds(final: str, expected: Sequence[str]) -> bool:
    """Whether `final` contains one of `expected`; a number must not be part of a longer one."""
    for wanted in expected:
        if re.fullmatch(r"[\d.]+", wanted):
            if re.search(rf"(?<![\d.]){re.escape(wanted)}(?![\d])", final):
                return True
        elif re.search(rf"\b{re.escape(wanted.lower())}\b", final.lower()):
            return True
    return False


# Guard configurations


def _may_be_off(name: str) -> bool:
    hints = typing.get_type_hints(GuardConfig)
    return type(None) in typing.get_args(hints[name])


def guard_configs() -> dict[str, GuardConfig]:
    """`default`, `off` (every guard that can be off, but max_turns, without the answer
    after its stop), `no_answer` (the default, each stop a halt: no answer after it), and
    the default less each guard it has on in turn: read from GuardConfig, so a new guard
    gets its row."""
    names = [name for name in GuardConfig.__struct_fields__ if _may_be_off(name)]
    off = {name: None for name in names if name != "max_turns"}
    configs = {
        "default": DEFAULT_GUARDS,
        "off": GuardConfig(**off, max_turns=MaxTurns(answer=False)),
        "no_answer": _without_answers(DEFAULT_GUARDS),
    }
    for name in names:
        if name != "max_turns" and getattr(DEFAULT_GUARDS, name) is not None:
            configs[f"no_{name}"] = msgspec.structs.replace(DEFAULT_GUARDS, **{name: None})
    return configs


def _without_answers(config: GuardConfig) -> GuardConfig:
    """`config` with the `answer` setting of each guard that has one off."""
    changes = {
        name: msgspec.structs.replace(value, answer=False)
        for name in GuardConfig.__struct_fields__
        if hasattr(value := getattr(config, name), "answer")
    }
    return msgspec.structs.replace(config, **changes)


CONFIGS = guard_configs()


class Outcome(msgspec.Struct, frozen=True):
    """One task's run in one row."""

    row: str
    kind: str
    request: str
    verdict: str  # right, gist or wrong
    model_calls: int
    seconds: float
    ended: str
    text: str


def _judge(task: Task, text: str, answered: bool) -> str:
    if holds(text, task.expected):
        return "right" if answered else "gist"
    return "wrong"


def _described(task: Task) -> str:
    if task.follow_up is not None:
        return f"{task.prompt} / {task.follow_up}"
    return task.prompt or f"(resume) {task.history[0]['content']}"


# turnkeeper, in this process or through the served model


async def run_turnkeeper(row: str, chat: Any, task: Task, guards: GuardConfig) -> Outcome:
    tools = tool_set()
    spec = AgentSpec(
        system_prompt=SYSTEM_PROMPT,
        tools=tuple(tools[name][0] for name in task.tools),
        temperature=0.0,
    )
    functions = {name: tools[name][1] for name in task.tools}
    history = (
        [{"role": "system", "content": SYSTEM_PROMPT}, *task.history] if task.history else None
    )
    started = time.perf_counter()

    async def once(prompt: str | None, transcript: Any) -> RunResult:
        return await run(
            spec,
            prompt,
            chat,
            tools=functions,
            max_turns=MAX_TURNS,
            guards=guards,
            history=transcript,
            timeout=TASK_SECONDS,
        )

    result = await once(task.prompt, history)
    calls = result.turns
    if task.follow_up is not None:
        result = await once(task.follow_up, result.transcript)
        calls += result.turns
    seconds = time.perf_counter() - started
    final = (result.text or "") + (json.dumps(result.result) if result.result else "")
    verdict = _judge(task, final, result.terminal == "end_turn")
    ended = result.stop_reason if result.terminal != "end_turn" else "answer"
    return Outcome(row, task.kind, _described(task), verdict, calls, seconds, ended, final)


# The peers, each given the tools as JSON schemas with functions that return the result
# or the error's text (what each framework's own tool wrappers send back on an exception).


class Counter:
    """Counts the chat-completions requests sent through its HTTP client."""

    def __init__(self) -> None:
        self.requests = 0

    async def hook(self, request: Any) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.requests += 1


def _openai_client(base_url: str, counter: Counter) -> Any:
    import httpx2
    import openai

    http = httpx2.AsyncClient(event_hooks={"request": [counter.hook]}, timeout=TASK_SECONDS)
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", http_client=http, max_retries=0)


def _agents_input(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat transcript as openai-agents input items."""
    items: list[dict[str, Any]] = []
    for message in history:
        if message["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
        elif message.get("tool_calls"):
            for call in message["tool_calls"]:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
        else:
            items.append({"role": message["role"], "content": message["content"]})
    return items


async def run_openai_agents(base_url: str, model: str, task: Task) -> Outcome:
    from agents import (
        Agent,
        FunctionTool,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    counter = Counter()
    client = _openai_client(base_url, counter)
    tools = tool_set()

    def wrapped(function: ToolFunction) -> Callable[[Any, str], Awaitable[str]]:
        async def invoke(context: Any, arguments: str) -> str:
            try:
                return str(await function(**json.loads(arguments or "{}")))
            except Exception as error:  # the text function_tool's default error handler sends
                return f"An error occurred while running the tool. Please try again. Error: {error}"

        return invoke

    agent: Any = Agent(
        name="assistant",
        instructions=SYSTEM_PROMPT,
        tools=[
            FunctionTool(
                name=name,
                description=tools[name][0].description,
                params_json_schema=tools[name][0].input_schema,
                on_invoke_tool=wrapped(tools[name][1]),
                strict_json_schema=False,
            )
            for name in task.tools
        ],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=0.0),
    )
    items: Any = _agents_input(task.history)
    if task.prompt is not None:
        items = [*items, {"role": "user", "content": task.prompt}] if items else task.prompt

    async def body() -> str:
        result = await Runner.run(agent, items, max_turns=MAX_TURNS)
        if task.follow_up is not None:
            follow: Any = [*result.to_input_list(), {"role": "user", "content": task.follow_up}]
            result = await Runner.run(agent, follow, max_turns=MAX_TURNS)
        return str(result.final_output)

    try:
        return await _peer_outcome("openai-agents", task, counter, body)
    finally:
        await client.close()


def _pydantic_history(history: Sequence[dict[str, Any]]) -> list[Any]:
    """A chat transcript as pydantic-ai messages, the system prompt first (pydantic-ai adds
    it only to a run without history)."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    messages: list[Any] = []
    names: dict[str, str] = {}
    for index, message in enumerate(history):
        if message["role"] == "user":
            parts: list[Any] = [UserPromptPart(message["content"])]
            if index == 0:
                parts.insert(0, SystemPromptPart(SYSTEM_PROMPT))
            messages.append(ModelRequest(parts=parts))
        elif message["role"] == "tool":
            name = names[message["tool_call_id"]]
            part = ToolReturnPart(name, message["content"], tool_call_id=message["tool_call_id"])
            messages.append(ModelRequest(parts=[part]))
        elif message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                names[call["id"]] = call["function"]["name"]
                calls.append(
                    ToolCallPart(
                        call["function"]["name"],
                        call["function"]["arguments"],
                        tool_call_id=call["id"],
                    )
                )
            messages.append(ModelResponse(parts=calls))
        else:
            messages.append(ModelResponse(parts=[TextPart(message["content"])]))
    return messages


async def run_pydantic_ai(base_url: str, model: str, task: Task) -> Outcome:
    from pydantic_ai import Agent, ModelRetry, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    counter = Counter()
    client = _openai_client(base_url, counter)
    tools = tool_set()

    def wrapped(function: ToolFunction) -> ToolFunction:
        async def invoke(**arguments: Any) -> str:
            try:
                return str(await function(**arguments))
            except InputError as error:  # pydantic-ai's way to send a tool error back
                raise ModelRetry(str(error)) from error

        return invoke

    agent: Any = cast(Any, Agent)(
        OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)),
        system_prompt=SYSTEM_PROMPT,
        tools=[
            Tool.from_schema(
                wrapped(tools[name][1]),
                name,
                tools[name][0].description,
                tools[name][0].input_schema,
            )
            for name in task.tools
        ],
        model_settings={"temperature": 0.0},
    )
    limits = UsageLimits(request_limit=MAX_TURNS)

    async def body() -> str:
        history = _pydantic_history(task.history) or None
        result = await agent.run(task.prompt, message_history=history, usage_limits=limits)
        if task.follow_up is not None:
            result = await agent.run(
                task.follow_up, message_history=result.all_messages(), usage_limits=limits
            )
        return str(result.output)

    try:
        return await _peer_outcome("pydantic-ai", task, counter, body)
    finally:
        await client.close()


async def _peer_outcome(
    row: str, task: Task, counter: Counter, body: Callable[[], Awaitable[str]]
) -> Outcome:
    started = time.perf_counter()
    text, ended = "", "answer"
    try:
        with anyio.fail_after(TASK_SECONDS * (2 if task.follow_up else 1)):
            text = await body()
    except TimeoutError:
        ended = "timeout"
    except Exception as error:
        ended = type(error).__name__
        text = str(error)[:200]
    seconds = time.perf_counter() - started
    verdict = _judge(task, text, True) if ended == "answer" else "wrong"
    return Outcome(
        row, task.kind, _described(task), verdict, counter.requests, seconds, ended, text
    )


# The served model, for the peers' rows


class Model(msgspec.Struct, frozen=True):
    path: str
    chat_format: str | None = None

    @property
    def label(self) -> str:
        return Path(self.path).name.removesuffix(".gguf")


@contextmanager
def served(model: Model) -> Iterator[str]:
    """`turnkeeper model serve` on `model`, on a free port of 127.0.0.1: its /v1 URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "turnkeeper.cli", "model", "serve", "--port", str(port)]
    command += ["--model", model.path]
    if model.chat_format is not None:
        command += ["--chat-format", model.chat_format]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if process.poll() is not None:
                why = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"model serve exited with {process.returncode}: {why}")
            try:
                if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"model serve did not answer within {SERVER_START_SECONDS} s")
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _missing(row: str) -> str | None:
    """Why `row`'s framework cannot run here, or None."""
    needs = {"openai-agents": ("agents", "openai"), "pydantic-ai": ("pydantic_ai", "openai")}
    for module in needs.get(row, ()):
        try:
            __import__(module)
        except ImportError:
            return f"not installed (no module {module!r}; pip install -e '.[bench]')"
    return None


# Tables


def table(outcomes: Sequence[Outcome], rows: Sequence[str], notes: dict[str, str]) -> str:
    lines = [
        "| row | right | gist only | wrong | mean calls | mean s | how the runs ended |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mine = [o for o in outcomes if o.row == row]
        if row in notes:
            lines.append(f"| {row} | 0 | 0 | {len(mine) or '-'} | - | - | {notes[row]} |")
            continue
        count = max(len(mine), 1)
        counts = {v: sum(o.verdict == v for o in mine) for v in ("right", "gist", "wrong")}
        ended: dict[str, int] = {}
        for outcome in mine:
            ended[outcome.ended] = ended.get(outcome.ended, 0) + 1
        shown = ", ".join(f"{why} {n}" for why, n in sorted(ended.items(), key=lambda i: -i[1]))
        lines.append(
            f"| {row} | {counts['right']}/{len(mine)} | {counts['gist']} | {counts['wrong']} "
            f"| {sum(o.model_calls for o in mine) / count:.2f} "
            f"| {sum(o.seconds for o in mine) / count:.1f} | {shown} |"
        )
    return "\n".join(lines)


def kind_table(outcomes: Sequence[Outcome], rows: Sequence[str]) -> str:
    kinds = list(dict.fromkeys(o.kind for o in outcomes))
    lines = ["| row | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for row in rows:
        cells = []
        for kind in kinds:
            mine = [o for o in outcomes if o.row == row and o.kind == kind]
            cells.append(f"{sum(o.verdict == 'right' for o in mine)}/{len(mine)}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(outcomes: Sequence[Outcome], rows: Sequence[str]) -> str:
    def right(row: str) -> int:
        return sum(o.verdict == "right" for o in outcomes if o.row == row)

    default = [o for o in outcomes if o.row == "default"]
    if not default:
        return ""
    lines = [
        f"- default guards answered right: {right('default')}/{len(default)} "
        f"({100 * right('default') / len(default):.0f}%; target at least 85%)",
        f"- default guards runs at max_turns: "
        f"{sum(o.ended == 'max_turns_exceeded' for o in default)} (target 0)",
        f"- default guards mean model calls: "
        f"{sum(o.model_calls for o in default) / len(default):.2f} (target at most 3)",
    ]
    if "off" in rows:
        lines.append(f"- right with guards {right('default')} vs off {right('off')} (target 2x)")
    peers = [row for row in rows if row in PEERS]
    if peers:
        shown = ", ".join(f"{row} {right(row)}" for row in peers)
        lines.append(f"- right with guards {right('default')} vs the peers: {shown} (target more)")
    return "\n".join(lines)


# Main


async def run_model(
    model: Model, tasks: Sequence[Task], rows: Sequence[str], repeat_penalty: float | None
) -> tuple[list[Outcome], dict[str, str]]:
    outcomes: list[Outcome] = []
    notes: dict[str, str] = {}
    settings: dict[str, Any] = {"chat_format": model.chat_format}
    if repeat_penalty is not None:
        settings["repeat_penalty"] = repeat_penalty
    chat = EmbeddedChat(model.path, **settings)
    await chat.load()

    def show(outcome: Outcome) -> None:
        outcomes.append(outcome)
        print(
            f"{outcome.row:20} {outcome.verdict:5} {outcome.model_calls:2} calls "
            f"{outcome.seconds:6.1f} s {outcome.ended:22} {outcome.request[:44]!r} -> "
            f"{outcome.text[:60]!r}",
            flush=True,
        )

    for row in (row for row in rows if row in CONFIGS):
        for task in tasks:
            show(await run_turnkeeper(row, chat, task, CONFIGS[row]))
    peers = [row for row in rows if row in PEERS]
    for row in peers:
        why = _missing(row)
        if why is not None:
            notes[row] = why
    if any(row not in notes for row in peers):
        with served(model) as url:
            for row in (row for row in peers if row not in notes):
                for task in tasks:
                    try:
                        if row == "openai-agents":
                            show(await run_openai_agents(url, model.label, task))
                        elif row == "pydantic-ai":
                            show(await run_pydantic_ai(url, model.label, task))
                        else:
                            http = OpenAIChat(url, model.label)
                            show(await run_turnkeeper(row, http, task, DEFAULT_GUARDS))
                    except Exception as error:  # a framework that cannot drive the endpoint
                        notes[row] = f"cannot drive the endpoint: {type(error).__name__}: {error}"
                        break
    return outcomes, notes


async def main(arguments: argparse.Namespace) -> None:
    tasks = [
        task
        for kind in arguments.kinds
        for task in [t for t in TASKS if t.kind == kind][: arguments.per_kind]
    ]
    everything: list[Outcome] = []
    reports = []
    for model in arguments.models:
        outcomes, notes = await run_model(model, tasks, arguments.configs, arguments.repeat_penalty)
        everything.extend(
            msgspec.structs.replace(o, row=f"{model.label} {o.row}") for o in outcomes
        )
        reports.append(
            "\n\n".join(
                part
                for part in (
                    f"## {model.label}: {len(tasks)} tasks, max_turns {MAX_TURNS}",
                    table(outcomes, arguments.configs, notes),
                    "Right answers by kind:",
                    kind_table(outcomes, [r for r in arguments.configs if r not in notes]),
                    targets(outcomes, arguments.configs),
                )
                if part
            )
        )
    print()
    print("\n\n".join(reports))
    if arguments.json is not None:
        await anyio.Path(arguments.json).write_bytes(msgspec.json.encode(everything))


def _listed(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        chosen = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in chosen if item not in choices]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none)'}; choose from {', '.join(choices)}"
            )
        return chosen

    return parse


def _model(text: str) -> Model:
    path, _, chat_format = text.partition(":")
    if path == "default":
        path = default_model_path()
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"no GGUF file at {path!r}")
    return Model(path, chat_format or None)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    rows = [*CONFIGS, *PEERS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--kinds", type=_listed(KINDS, "kind"), default=list(KINDS), help=", ".join(KINDS)
    )
    parser.add_argument(
        "--configs", type=_listed(rows, "row"), default=rows, help="rows: " + ", ".join(rows)
    )
    parser.add_argument(
        "--model",
        dest="models",
        type=_model,
        action="append",
        metavar="GGUF[:CHAT_FORMAT]",
        help="a model to run (repeatable; `default` is the embedded default)",
    )
    parser.add_argument("--per-kind", type=int, metavar="N", help="the first N tasks of each kind")
    parser.add_argument(
        "--repeat-penalty", type=float, metavar="P", help="EmbeddedChat's repeat_penalty"
    )
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")
    arguments = parser.parse_args(argv)
    if arguments.models is None:
        arguments.models = [_model("default")]
    if arguments.per_kind is not None and arguments.per_kind < 1:
        parser.error("--per-kind: expected 1 or more")
    return arguments


if __name__ == "__main__":
    anyio.run(main, parse_arguments())
