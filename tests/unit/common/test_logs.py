"""Log configuration: the libraries that log every request do not drown the JSON lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from common.logs import QUIET_LIBRARIES, configure_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; the tests after this one get theirs back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in QUIET_LIBRARIES}
    config = structlog.get_config()
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, previous in quiet.items():
            logging.getLogger(name).setLevel(previous)
        structlog.configure(**config)
        structlog.contextvars.clear_contextvars()


def test_httpx_request_lines_are_not_logged_at_info_and_warnings_still_are(restored_logging: None) -> None:
    configure_logging("info", component="test")
    for name in QUIET_LIBRARIES:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)
    configure_logging("error", component="test")
    assert not logging.getLogger("httpx").isEnabledFor(logging.WARNING)  # a quieter level stays quieter
