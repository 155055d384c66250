"""A chat template compiled in a sandbox: the worker renders conversations through it, and the
manifest (`spec.model.chatTemplate`) compiles one at load so that a template that does not
compile is refused before any worker starts.

A template comes from a checkpoint or an operator's file, i.e. from a stranger: it runs in
jinja2's immutable sandbox, with the few helpers Hugging Face's templates call.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    # Chat templates call this to reject conversations they cannot render (e.g. bad role order).
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # jinja2's own tojson HTML-escapes '<' and '>', which would corrupt prompts.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    # Llama 3.1 style templates stamp the current date into the system prompt.
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """ValueError when `source` is not valid Jinja."""

    def __init__(self, source: str) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
            # NOTE: what the template reads from its caller (`messages`, `tools`, ...).
            self.variables = frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.source = source

    def render(self, **variables: Any) -> str:
        """ValueError when the template refuses what it is given (`raise_exception`)."""
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template rejected the messages: {exc}") from exc
