"""How pydantic's `ValidationError` reads as the manifest's own words: one line per invalid field,
`path: invalid value X; what is allowed`, with the path spelled as in the file (camelCase)."""

from __future__ import annotations

from intentserve.policy import IntentError
from pydantic import BaseModel, ValidationError


def describe_validation_error(error: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per invalid field of a `root` model: `path: invalid value X; what is allowed`."""
    lines = []
    for item in error.errors():
        cause = (item.get("ctx") or {}).get("error")
        if isinstance(cause, IntentError):
            # A section's own check (the policy's): placed at the option it names.
            names, _ = _as_written(root, (*item["loc"], cause.field))
            lines.append(f"{'.'.join(names)}: {str(cause).removeprefix(f'{cause.field}: ')}")
            continue
        names, section = _as_written(root, item["loc"])
        path = ".".join(names) or "manifest"
        message = item["msg"].removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
        if item["type"] == "extra_forbidden":
            allowed = ", ".join(f.alias or n for n, f in (section or {}).items())
            lines.append(f"{path}: unknown field; allowed fields here are {allowed}")
        elif item["type"] == "missing":
            lines.append(f"{path}: required field is missing")
        elif isinstance(item["input"], str | int | float | bool) or item["input"] is None:
            lines.append(f"{path}: invalid value {item['input']!r}; {message}")
        else:
            lines.append(f"{path}: {message}")
    return lines


def _as_written(root: type[BaseModel], loc: tuple) -> tuple[list[str], dict | None]:
    """The path as the file spells it (camelCase), and the fields of the section holding it."""
    names: list[str] = []
    model: type[BaseModel] | None = root
    section = None
    for part in map(str, loc):
        section = model.model_fields if model is not None else None
        field = next((f for n, f in (section or {}).items() if part in (n, f.alias)), None)
        names.append(field.alias or part if field is not None else part)
        annotation = field.annotation if field is not None else None
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    return names, section
