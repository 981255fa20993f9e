"""Command-line flags described once, as fields of a pydantic model: the same field gives the flag's
parser entry (name, type, choices, default, help), reads the parsed value back into the model, and
writes the flag on a command line for a run started by another (`llmload soak` starting Locust).

A field's flag is `--field-name` unless its `Flag` says otherwise; the field's type decides the rest:
a Literal gives the choices, a tuple a repeatable flag, a bool a switch, int or float their parser.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from llmload.errors import InputError, validation_message


@dataclass(frozen=True)
class Flag:
    """A field's flag, where its name and type do not say all: `Annotated[float, Flag("help")]`."""

    help: str | None = None
    name: str | None = None  # without the dashes, when not the field's name with dashes
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # how the text is read, when not the field's type (a duration)


def _flag(field: FieldInfo) -> Flag:
    return next((m for m in field.metadata if isinstance(m, Flag)), Flag())


def _bare(annotation: Any) -> Any:
    """The type a flag's text is read as: `PositiveFloat | None` → float."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def _text(value: Any) -> str:
    """A value as a flag's text: floats as people write them (60, not 60.0), exactly."""
    if isinstance(value, float) and float(f"{value:g}") == value:
        return f"{value:g}"
    return str(value)


class FlagModel(BaseModel):
    """A model whose fields are command-line flags (see the module's docstring)."""

    @classmethod
    def option(cls, field: str) -> str:
        """The field's flag, `--name`."""
        return "--" + (_flag(cls.model_fields[field]).name or field.replace("_", "-"))

    @classmethod
    def add_arguments(cls, parser: Any, fields: Iterable[str] | None = None) -> None:
        """The fields' flags (all, by default) on an argparse parser or group (Locust's too)."""
        for field in cls.model_fields if fields is None else fields:
            parser.add_argument(cls.option(field), **cls._argument(field))

    @classmethod
    def _argument(cls, field: str) -> dict[str, Any]:
        """add_argument's keywords for the field, from its type, default and Flag."""
        info = cls.model_fields[field]
        flag, bare = _flag(info), _bare(info.annotation)
        default = info.get_default(call_default_factory=True)
        kwargs: dict[str, Any] = {"default": default, "help": flag.help}
        if flag.metavar is not None:
            kwargs["metavar"] = flag.metavar
        if bare is bool:
            return {**kwargs, "action": "store_true"}
        if get_origin(bare) is tuple:
            return {**kwargs, "action": "append", "default": list(default)}
        if get_origin(bare) is Literal:
            return {**kwargs, "choices": get_args(bare)}
        parse = flag.parse or (bare if bare in (int, float) else None)
        return {**kwargs, "type": parse} if parse is not None else kwargs

    @classmethod
    def flag_names(cls) -> dict[str, str]:
        """The fields whose flag is not `--field-name`, and their flag (for validation_message)."""
        return {field: cls.option(field)[2:] for field in cls.model_fields if _flag(cls.model_fields[field]).name}

    @classmethod
    def checked(cls, **values: Any) -> Self:
        """The model, or an InputError naming each flag out of its range (`--burstiness: ...`)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise InputError(validation_message(exc, flags=cls.flag_names())) from None

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        """The model from a parsed command line that has its fields' flags; InputError names a flag."""
        values = {field: getattr(options, cls.option(field)[2:].replace("-", "_")) for field in cls.model_fields}
        return cls.checked(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def options(self) -> list[str]:
        """The flags of the fields the caller set (a nested model's too), whatever their value: the
        flags a run started with this model decides, which a user may not pass again."""
        names: list[str] = []
        for field in self._given():
            value = getattr(self, field)
            names += value.options() if isinstance(value, FlagModel) else [self.option(field)]
        return names

    def argv(self) -> list[str]:
        """The command-line arguments of the fields the caller set (a nested model's too); None and
        False are not written (the flag's default), a tuple is the flag repeated."""
        argv: list[str] = []
        for field in self._given():
            value, option = getattr(self, field), self.option(field)
            if isinstance(value, FlagModel):
                argv += value.argv()
            elif isinstance(value, tuple):
                argv += [f"{option}={_text(item)}" for item in value]
            elif value is True:
                argv.append(option)
            elif value is not None and value is not False:
                argv += [option, _text(value)]
        return argv

    def _given(self) -> list[str]:
        """The fields the caller set, in the model's order (a command line reads the same each time)."""
        return [field for field in type(self).model_fields if field in self.model_fields_set]
