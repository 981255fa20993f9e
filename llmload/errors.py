"""The one error a user's input can raise (every command turns it into exit code 2 and its
message), and the one way a refused file or flag is described."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError


class InputError(ValueError):
    """A file, flag or target the user gave that cannot be used; the message names the file, key or flag."""


def validation_message(exc: ValidationError, *, flags: Mapping[str, str] | None = None) -> str:
    """Why a model refused its input, in the user's terms: `key.path: reason; ...` for a file, or
    with `flags` (field names whose flag is not `--field-name`, may be empty) `--flag: reason` for a
    command line. pydantic's "Extra inputs are not permitted" is said "unknown key"."""
    parts = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        reason = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
        if not loc:
            parts.append(reason)
            continue
        if flags is None:
            where = ".".join(loc)
        else:  # the innermost field names the flag (`faults.0.kind` came from --fault)
            field = next((part for part in reversed(loc) if not part.isdigit()), loc[-1])
            where = "--" + flags.get(field, field.replace("_", "-"))
        parts.append(f"{where}: {reason}")
    return "; ".join(parts)


def json_object(text: str | bytes, where: str) -> dict[str, Any]:
    """`text` as a JSON object; InputError naming `where` (a file or a flag) when it is not JSON or not an object."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"{where}: not a JSON object: a {type(value).__name__}")
    return value
