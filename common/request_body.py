"""Parsing OpenAI-style JSON request bodies into pydantic models.

Shared by the engine and the gateway so both answer malformed JSON, a
non-object body and a failed field check the same way: one 400 whose
`param` names the first offending field. Two defects that used to escape as
500s are refused here too:

- JSON nested deeper than the interpreter's recursion limit (the C decoder
  raises `RecursionError`);
- a string holding a lone UTF-16 surrogate (`"\\ud800"`, or its raw bytes,
  which `json.loads` lets through): it has no UTF-8 form, so a tokenizer, a
  log line or a forwarded body would fail on it later. `param` names the
  string's path (`prompt`, `messages.0.content`);
- `NaN`, `Infinity`, `-Infinity` and a number too large for a float (`1e400`,
  read as infinity): not JSON (RFC 8259), which `json.loads` accepts anyway;
  no JSON renderer can send them back, and PostgreSQL refuses them where
  SQLite stores them.

The control plane, whose bodies FastAPI parses, runs the same two checks
through `text_defect` (controlplane/json_body.py), so all three processes
refuse the same text the same way.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

Body = TypeVar("Body", bound=BaseModel)

# Where a lone surrogate could hide: a \uD800-\uDFFF escape or its raw (surrogatepass) UTF-8 bytes.
# Only bodies that match are walked, so an ordinary body costs a few byte scans.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
# Where a number too large for a double could hide: an exponent of three digits or more (JSON's follows a
# digit), or 309 digits in a row (`1000…0.5` past 1.8e308 reads as infinity too).
_BIG_NUMBER = re.compile(rb"[0-9](?:[eE]\+?[0-9]{3}|[0-9]{308})")


def _maybe_surrogate(raw: bytes) -> bool:
    # `in` first: a byte search is several times faster than the regex over a megabyte report.
    return (b"\\u" in raw or b"\xed" in raw) and _MAYBE_SURROGATE.search(raw) is not None


def _maybe_non_finite(raw: bytes) -> bool:
    return b"NaN" in raw or b"Infinity" in raw or _BIG_NUMBER.search(raw) is not None


class TextDefect(NamedTuple):
    """Why a parsed JSON body cannot be taken, and the dotted path of the value (None: the whole body)."""

    message: str
    param: str | None


class BadRequestFactory(Protocol):
    def __call__(self, message: str, *, param: str | None = None) -> Exception: ...


def parse_json_body(raw: bytes, model: type[Body], bad_request: BadRequestFactory) -> Body:
    """Validate `raw` as `model`; raise `bad_request(message, param=...)` on any defect."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise bad_request("request body must be a JSON object")
    if (defect := payload_defect(raw, payload)) is not None:
        raise bad_request(defect.message, param=defect.param)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise bad_request(f"{param}: {first['msg']}", param=param) from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None


def text_defect(raw: bytes) -> TextDefect | None:
    """The first lone surrogate or non-finite number in a JSON body; None if it has none or is not JSON.

    For a framework that parses the body itself: not-JSON is left to it, with its own message.
    """
    if not (_maybe_surrogate(raw) or _maybe_non_finite(raw)):
        return None
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return payload_defect(raw, payload)


def payload_defect(raw: bytes, payload: Any) -> TextDefect | None:
    """The first value of `payload` (parsed from `raw`) that is not JSON text; only walked when `raw` may hold one."""
    surrogates, non_finite = _maybe_surrogate(raw), _maybe_non_finite(raw)
    if not (surrogates or non_finite):
        return None
    found = _first_defect(payload, surrogates=surrogates, non_finite=non_finite)
    if found is None:
        return None
    path, what = found
    return TextDefect(f"{path or 'body'}: {what}", path or None)


_SURROGATE = "text holds a lone UTF-16 surrogate, which is not valid Unicode text"
_NON_FINITE = "NaN, Infinity and numbers beyond a double's range are not JSON numbers"


def _first_defect(payload: Any, *, surrogates: bool, non_finite: bool) -> tuple[str, str] | None:
    """(dotted path, what is wrong) of the first defect; iterative, so depth costs nothing.

    A key that holds a surrogate is named with the surrogate escaped (`\\udfff`): the error body
    carrying the path must itself be sendable.
    """
    stack: list[tuple[str, Any]] = [("", payload)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if surrogates and not _is_utf8(value):
                return path, _SURROGATE
        elif isinstance(value, float):
            if non_finite and not math.isfinite(value):
                return path, _NON_FINITE
        elif isinstance(value, dict):
            for key, item in value.items():
                name = key if _is_utf8(key) else key.encode("utf-8", "backslashreplace").decode()
                child = f"{path}.{name}" if path else name
                if name != key:
                    return child, _SURROGATE
                stack.append((child, item))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
