"""structlog JSON logs for every gpushare process: one object per line on stderr, with the
`pod`, `node` and `card` fields bound where they are known."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(level: str = "info") -> None:
    """JSON lines on stderr at `level` (debug, info, warning, error)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(component: str, **context: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger whose lines carry `component` and `context`."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=component)
    return logger.bind(**context) if context else logger
