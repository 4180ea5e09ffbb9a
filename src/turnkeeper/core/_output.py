"""Typed output: the JSON Schema a session's final answer must match (`AgentSpec.output_schema`),
given as a schema or as a Python type, and the reading of an answer against it.

The log holds a JSON Schema only: a type given in Python (a msgspec Struct, a dataclass,
anything msgspec can describe) is turned into its schema before the spec is logged, and
the caller that gave it decodes the answer into it. Everything that judges an answer does
so from the schema, so replay, another worker and the HTTP API all reach the same verdict
from the log alone.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import msgspec

from turnkeeper.core._depth import nests_deeper
from turnkeeper.core._errors import InputError
from turnkeeper.core._jsonschema import coerce, schema_problem, validate

if TYPE_CHECKING:
    from turnkeeper.core._types import AgentSpec

_ANSWER_DEPTH = 64
"""How deep an answer may nest (as tool arguments may): deeper is too deep to check."""
_SHOWN_ERRORS = 5
_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\r?\n?(.*?)\r?\n?[ \t]*```", re.DOTALL)
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_canonical = msgspec.json.Encoder(order="sorted").encode


def output_type(given: object) -> Any | None:
    """The Python type `given` as an output schema, or None for a JSON Schema (or none)."""
    return None if given is None or isinstance(given, dict) else given


def output_json_schema(given: object) -> dict[str, Any] | None:
    """`given` as the JSON Schema the log holds: a schema as it is, a type as msgspec
    describes it (its root `$ref` resolved, so the schema's root is the type's own object).
    Raises InputError, naming `spec.output_schema`, for anything else."""
    if given is None or isinstance(given, dict):
        return given
    try:
        return _schema_of(given)
    except (TypeError, ValueError) as error:
        raise InputError(
            "spec.output_schema: expected a JSON Schema object or a type msgspec can describe "
            f"(a msgspec Struct, a dataclass, a TypedDict, list[int]...), got {given!r:.80} "
            f"({error})"
        ) from None


@lru_cache(maxsize=256)
def _schema_of(kind: Any) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(kind)
    ref = schema.get("$ref")
    definitions = schema.get("$defs")
    if set(schema) != {"$ref", "$defs"} or not isinstance(ref, str):
        return schema
    name = ref.removeprefix("#/$defs/")
    if not isinstance(definitions, dict) or name not in definitions:
        return schema
    root = dict(definitions[name])
    # The definitions stay only if something still refers to one (a tree's own type, say).
    if any(b'"$ref"' in _encode(value) for value in (root, *definitions.values())):
        root["$defs"] = definitions
    return root


def with_output_schema(spec: AgentSpec) -> AgentSpec:
    """`spec` as it is logged: with an output type replaced by its JSON Schema (`spec`
    itself when it has none)."""
    if output_type(spec.output_schema) is None:
        return spec
    return msgspec.structs.replace(spec, output_schema=output_json_schema(spec.output_schema))


def output_problem(schema: object, where: str = "spec.output_schema") -> str | None:
    """Why `schema` (a spec's `output_schema`, a JSON Schema or a type) cannot check an
    answer, as a message naming `where`; None when it can. A type msgspec cannot describe
    raises InputError (naming `spec.output_schema`)."""
    logged = output_json_schema(schema)
    if logged is None:
        return None
    problem = schema_problem(logged, of="the output schema")
    if problem is None:
        return None
    return f"{where}: the schema cannot be used: {problem}"


def schema_key(schema: dict[str, Any]) -> str:
    """The schema as canonical JSON: the same text for the same schema, however spelled."""
    return _canonical(schema).decode()


def read_answer(schema: dict[str, Any], text: str | None) -> tuple[Any, str | None]:
    """The value an answer's text gives, and None; or None and what is wrong with it.

    The text must be a JSON value (alone, or alone in a fenced code block, as models often
    write it) that matches `schema` once the safe coercions of `coerce` are made (`"3"`
    for an integer is 3), msgspec's formats asserted (a `date` is one msgspec decodes). A
    JSON object is the usual answer, but any JSON value the schema admits is one."""
    if text is None or not text.strip():
        return None, "it is empty, not a JSON value"
    body = text.strip()
    fenced = _FENCED.fullmatch(body)
    if fenced is not None:
        body = fenced[1].strip()
    try:
        value = _decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None, "it is not a JSON value"
    if nests_deeper(value, _ANSWER_DEPTH):
        return None, f"it nests more than {_ANSWER_DEPTH} levels deep"
    if isinstance(value, dict):
        value = coerce(schema, value)
    errors = validate(schema, value, formats=True)
    if errors:
        shown = "; ".join(errors[:_SHOWN_ERRORS])
        more = len(errors) - _SHOWN_ERRORS
        if more > 0:
            shown += f" (and {more} more)"
        return None, f"it does not match the output schema: {shown}"
    return value, None


def decode_output(value: Any, kind: Any) -> Any:
    """`value`, an answer `read_answer` gave, as an instance of `kind` (msgspec.convert);
    raises msgspec.ValidationError when the schema admits what the type does not (a naive
    datetime's schema is any string)."""
    return msgspec.convert(value, kind)
