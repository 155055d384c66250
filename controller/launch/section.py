"""What every section of the manifest is: a frozen pydantic model, its fields written in
camelCase (`maxNumSeqs`), an unknown key refused; and how a section reads the word an operator
writes for an enum member (`on`, `cuda`, YAML's bare on/off too)."""

from __future__ import annotations

import enum

from intentserve.policy.modes import allowed_values, lookup_choice
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Section(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)


def choice(enum_cls: type[enum.Enum], value: object) -> enum.Enum:
    """Parse an enum member from the word an operator writes (YAML's bare on/off included)."""
    member = lookup_choice(enum_cls, value)
    if member is None:
        raise ValueError(f"allowed values are {allowed_values(enum_cls)}")
    return member
