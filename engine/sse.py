"""Server-sent events as vLLM writes them: one `data:` line per event, `[DONE]` at the end.

An error after the first byte cannot change the status code, so it travels as
an event whose data is the one error shape (`common.errors.error_body`); the
stream closes after it. Clients (and the gateway) branch on its `type`.
"""

from __future__ import annotations

import json
from typing import Any

from common.errors import error_body

DONE = "data: [DONE]\n\n"


def sse_data(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def sse_error(error_type: str, message: str, *, code: int) -> str:
    return sse_data(error_body(error_type, message, code=code))
