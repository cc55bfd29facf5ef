"""Chat templates rendered the way transformers' `apply_chat_template` renders them, wherever a prompt is built.

The gateway renders chat prompts itself (and re-renders a session's history
to find its context); the reference engine renders the ones sent to its own
chat endpoint. One environment for all of them, so the same messages give the
same tokens on every side: a sandbox (templates ship with model files), and
transformers' `tojson` (plain `json.dumps`, non-ASCII kept) rather than
Jinja's HTML-escaping one, which would turn a tool's `<` into `\\u003c`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jinja2 import Template, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


_environment = ImmutableSandboxedEnvironment()
_environment.filters["tojson"] = _tojson


@lru_cache(maxsize=64)
def _compiled(template: str) -> Template:
    return _environment.from_string(template)


def render_chat(template: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True) -> str:
    """`messages` (`ChatMessage.template_dict()`s) and the offered `tools` through the model's template."""
    return _compiled(template).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def renders_tools(template: str) -> bool:
    """Whether the template reads `tools` at all (one that does not would leave them out of the prompt)."""
    return "tools" in meta.find_undeclared_variables(_environment.parse(template))
