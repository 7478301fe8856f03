"""What every request body of the API is held to: a JSON object, of the operation's fields only (a typo such as
``evn`` ran a command without its environment), and no NUL byte anywhere (PostgreSQL cannot store one, and no
argv, path or name can hold one)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from ninja import Schema
from ninja.schema import DjangoGetter
from pydantic import ConfigDict, StringConstraints, model_validator

from executions.actions.common import IDENTITY
from executions.actions.common import MACHINE_NAME as MACHINE_PATTERN

# Text with no NUL byte, said in the schema (``pattern``) as well as held by :class:`Body`.
NO_NUL = "^[^\x00]*$"
Text = Annotated[str, StringConstraints(pattern=NO_NUL)]
MACHINE_NAME = MACHINE_PATTERN.pattern
ABSOLUTE_PATH = "^(/[^\x00]*)?$"
ENV_NAME = "^[^=\x00]+$"
# A pattern a field did not match, in words (the validation_error's message says these, not the pattern).
PATTERN_WORDS = {
    IDENTITY.pattern: "1-200 letters, digits and ._:@/- starting with a letter or digit",
    NO_NUL: "text without a NUL byte",
    MACHINE_NAME: "1-100 letters, digits, '-' or '_'",
    ABSOLUTE_PATH: "an absolute path (or empty)",
    ENV_NAME: "a name without '='",
}


def nul_at(value, where: str = "") -> str | None:
    """The path of the first string holding a NUL byte in ``value`` (keys too), or None."""
    if isinstance(value, str):
        return where or "the body" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and "\x00" in key:
                return f"a field name in {where or 'the body'}"
            if (found := nul_at(item, inner)) is not None:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if (found := nul_at(item, f"{where}[{index}]")) is not None:
                return found
    return None


HOLDS_NUL = "holds a NUL byte"
NOT_AN_OBJECT = "the body must be a JSON object"


def malformed(said: str) -> bool:
    """Whether a validation message is one of these refusals (said as invalid_request, not validation_error)."""
    return HOLDS_NUL in said or NOT_AN_OBJECT in said


class Body(Schema):
    """A request body: unknown fields refused, a JSON object, no NUL byte."""

    model_config = ConfigDict(extra="forbid")
    KEYSTROKES: ClassVar[frozenset[str]] = frozenset()  # fields whose NUL is a key (Ctrl-@), written as it is

    @model_validator(mode="before")
    @classmethod
    def _an_object_without_nul(cls, data):
        if isinstance(data, DjangoGetter):  # ninja's second pass over the same body (the first was checked)
            data = data._obj
        if not isinstance(data, dict):
            raise ValueError(f"{NOT_AN_OBJECT}, not {type(data).__name__}")
        checked = {key: value for key, value in data.items() if key not in cls.KEYSTROKES}
        if (where := nul_at(checked)) is not None:
            raise ValueError(f"{where} {HOLDS_NUL}")
        return data
