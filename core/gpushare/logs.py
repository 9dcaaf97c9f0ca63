"""structlog JSON logs for every gpushare process: one object per line on stderr, with the
`pod`, `node` and `card` fields bound where they are known.

The libraries' own lines (kopf's, aiohttp's, asyncio's, the Kubernetes client's, through the
standard `logging` module) come out as the same JSON objects, with the same keys: `component`
(their logger's name), `event` (the message), `level`, `timestamp`, and `exception` when there
is one. One level, `configure(level)`, applies to both.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

_STAMPED: list[Processor] = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure(level: str = "info") -> None:
    """JSON lines on stderr at `level` (debug, info, warning, error), ours and every library's."""
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *_STAMPED,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[_component_from_logger, *_STAMPED],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(sort_keys=False),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]  # kopf's own text handler included
    root.setLevel(numeric)
    # kopf silences asyncio unless debugging; its "Task exception was never retrieved" is a bug
    # report worth a line.
    asyncio_logger = logging.getLogger("asyncio")
    asyncio_logger.handlers.clear()
    asyncio_logger.propagate = True
    asyncio_logger.setLevel(max(numeric, logging.WARNING))


def _component_from_logger(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    record: logging.LogRecord = event["_record"]
    return {"component": record.name, **event}


def get(component: str, **context: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger whose lines carry `component` and `context`."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=component)
    return logger.bind(**context) if context else logger
