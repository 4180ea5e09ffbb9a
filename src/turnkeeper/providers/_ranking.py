"""Choosing the tools a small model is shown: lexical ranking and compact schemas.

Fewer tools and shorter schemas make a small model choose better and leave room in its
context window. Both functions are pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from turnkeeper.core import InputError, ToolSpec

__all__ = ["SCHEMA_BUDGET", "compact_schema", "rank_tools"]

SCHEMA_BUDGET = 600
"""Characters of JSON a schema may take before `compact_schema` shortens it."""

# How much a query word counts when it matches a tool's name, a parameter or its description.
_NAME, _PARAMETER, _DESCRIPTION = 3.0, 2.0, 1.0
_NAMED = 4.0  # the query spells out the tool's full name
_RECENT = 2.0  # the most recently used tool; the next ones get half, a third...
_TOKEN = re.compile(r"[^\W_]+")
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_STOPWORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "by", "can", "could", "do", "does", "for",
        "from", "have", "how", "i", "in", "is", "it", "me", "my", "of", "on", "or", "please",
        "should", "that", "the", "this", "to", "was", "what", "when", "where", "which", "who",
        "will", "with", "would", "you", "your",
    }
)  # fmt: skip


def rank_tools(
    tools: Sequence[ToolSpec],
    query: str,
    *,
    max_tools: int = 8,
    recent: Sequence[str] = (),
) -> list[ToolSpec]:
    """The at most `max_tools` tools that best fit `query` (the last user message).

    A tool scores for each word of the query that its name (3), a parameter name (2) or its
    description (1) shares, words compared in lower case give or take an ending of up to
    three letters (`book`, `booking`, `books`); a query that spells out the tool's name
    adds 4.
    Tools named in `recent` (most recent first) get a bonus of 2, 1, 2/3, ... Equal scores
    keep the given order. The chosen tools come back in their given order, so the same
    choice makes the same prompt and a backend's prompt cache keeps working.
    """
    if isinstance(max_tools, bool) or not isinstance(max_tools, int) or max_tools < 1:
        raise InputError(f"rank_tools: max_tools must be an int >= 1, got {max_tools!r}")
    if len(tools) <= max_tools:
        return list(tools)
    words = [_forms(word) for word in dict.fromkeys(_words(query))]
    lowered = query.lower()
    bonus: dict[str, float] = {}
    for name in recent:
        bonus.setdefault(name, _RECENT / (len(bonus) + 1))
    scores = [_score(tool, words, lowered) + bonus.get(tool.name, 0.0) for tool in tools]
    best = sorted(range(len(tools)), key=lambda index: (-scores[index], index))[:max_tools]
    return [tools[index] for index in sorted(best)]


def _score(tool: ToolSpec, words: list[frozenset[str]], query: str) -> float:
    fields = _fields(tool.name, tool.description, tuple(_parameters(tool.input_schema)))
    score = sum(
        max((weight for weight, forms in fields if not word.isdisjoint(forms)), default=0.0)
        for word in words
    )
    spelled = re.search(rf"(?<![\w-]){re.escape(tool.name.lower())}(?![\w-])", query)
    return score + (_NAMED if spelled else 0.0)


@lru_cache(maxsize=4096)
def _fields(
    name: str, description: str, parameters: tuple[str, ...]
) -> tuple[tuple[float, frozenset[str]], ...]:
    """A tool's word forms, by the weight a match with them counts."""
    texts = ((_NAME, name), (_PARAMETER, " ".join(parameters)), (_DESCRIPTION, description))
    return tuple((weight, frozenset().union(*map(_forms, _words(text)))) for weight, text in texts)


def _parameters(schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return []
    return [name for name in properties if isinstance(name, str)]


def _words(text: str) -> list[str]:
    """The words of `text` in lower case: camelCase and snake_case split, stopwords out, and
    a plural -ies read as -y."""
    words: list[str] = []
    for token in _TOKEN.findall(text):
        for part in _CAMEL.findall(token) if token.isascii() else [token]:
            word = part.lower()
            if len(word) > 1 and word not in _STOPWORDS:
                words.append(word[:-3] + "y" if len(word) > 4 and word.endswith("ies") else word)
    return words


def _forms(word: str) -> frozenset[str]:
    """`word` and the stems left by cutting up to 3 letters off its end, down to 4 letters:
    two words match when their forms meet (`search`, `searches`; `book`, `booking`)."""
    return frozenset(
        word[:end] for end in range(min(len(word), max(4, len(word) - 3)), len(word) + 1)
    )


def compact_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` made to fit SCHEMA_BUDGET characters of JSON, if it does not already.

    In steps, each taken only while the schema is still too long: drop titles, examples,
    `$comment`s and `x-` extensions; cut descriptions to their first
    sentence (at most 80 characters); drop descriptions and defaults. Types, properties,
    `required`, enums, constants, bounds, formats and `$ref`s always stay, so a compact
    schema accepts exactly what the original does. `schema` itself is not changed.
    """
    if _size(schema) <= SCHEMA_BUDGET:
        return dict(schema)
    compact = dict(schema)
    for step in (_drop_decoration, _first_sentences, _drop_descriptions):
        compact = _each_schema(compact, step, 0)
        if _size(compact) <= SCHEMA_BUDGET:
            break
    return compact


_DECORATION = frozenset({"title", "examples", "example", "$comment", "deprecated", "readOnly"})
# Keywords whose value is a schema, a list of schemas, or a map of name to schema.
_ONE = frozenset(
    {
        "additionalProperties", "additionalItems", "items", "contains", "propertyNames", "not",
        "if", "then", "else", "unevaluatedItems", "unevaluatedProperties",
    }
)  # fmt: skip
_MANY = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_MAX_DEPTH = 64
_Step = Callable[[Mapping[str, Any]], dict[str, Any]]


def _each_schema(schema: Any, step: _Step, depth: int) -> Any:
    """`schema` with `step` applied to it and to every schema inside it."""
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return schema
    out: dict[str, Any] = {}
    for key, value in step(schema).items():
        if key in _NAMED_SCHEMAS and isinstance(value, Mapping):
            out[key] = {name: _each_schema(sub, step, depth + 1) for name, sub in value.items()}
        elif key in _MANY and isinstance(value, list):
            out[key] = [_each_schema(sub, step, depth + 1) for sub in value]
        elif key in _ONE:
            out[key] = _each_schema(value, step, depth + 1)
        else:
            out[key] = value
    return out


def _drop_decoration(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: value
        for key, value in schema.items()
        if key not in _DECORATION and not (isinstance(key, str) and key.startswith("x-"))
    }


def _first_sentences(schema: Mapping[str, Any]) -> dict[str, Any]:
    description = schema.get("description")
    if not isinstance(description, str):
        return dict(schema)
    first = re.split(r"(?<=[.!?])\s", description.strip(), maxsplit=1)[0]
    if len(first) > 80:
        first = first[:77].rstrip() + "..."
    return {**schema, "description": first}


def _drop_descriptions(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key not in ("description", "default")}


def _size(schema: Mapping[str, Any]) -> int:
    try:
        return len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return 0  # not JSON: it is sent as it is, and the backend reports it
