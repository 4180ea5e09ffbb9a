"""Typed output in Python: the answer's JSON value decoded into the type the caller gave
as the spec's `output_schema` (the log holds its JSON Schema only)."""

from __future__ import annotations

from typing import Any

import msgspec

from turnkeeper.core import decode_output, gist
from turnkeeper.guards import with_last_result
from turnkeeper.state import SessionState


def decoded(state: SessionState, kind: Any) -> tuple[Any, str | None]:
    """The state's typed output as an instance of `kind`, and None; or None and the halt
    message saying why it is not one (a value the schema admits and the type does not)."""
    try:
        return decode_output(state.output, kind), None
    except msgspec.ValidationError as error:
        name = getattr(kind, "__name__", repr(kind))
        lead = (
            f"I'm sorry: my answer matched the output schema but not the type {name} "
            f"({gist(str(error), 300)})."
        )
        return None, with_last_result(state, lead)
