"""Structured JSON logs shared by every Lifeline process.

Each line is one JSON object; components bind `instance`, `generation`,
`request_id` and `epoch` where they know them, so a 3 a.m. grep for one
request id finds every hop it took.
"""

from __future__ import annotations

import logging
import sys

import structlog


QUIET_LIBRARIES = ("httpx", "httpcore")


def configure_logging(level: str = "info", *, component: str) -> None:
    """Route stdlib and structlog output to stderr as JSON lines."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.basicConfig(stream=sys.stderr, level=numeric, format="%(message)s", force=True)
    # httpx logs every request at INFO, as plain text: a gateway's snapshot polls, reports and event batches
    # were four lines a second of it. Our own lines say what changed; a failed call surfaces as our error.
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(numeric, logging.WARNING))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.EventRenamer("msg"),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(component=component)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
