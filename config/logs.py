"""Structured logs: with ``TETHER_LOG_FORMAT=json`` every line is one JSON object (time, level, logger,
message, host, pid) with the ids of what it is about (session, execution, worker, user, viewer), so that a
log query can follow one session across daphne and the worker that holds it.

The ids come from the context the line is logged in: a consumer binds its session, user and viewer when it
connects; a worker binds its id when it starts, each launch its execution and session, each message the
execution it is about. Asyncio tasks inherit the context they were started in.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
from contextlib import contextmanager
from datetime import UTC, datetime

_context: contextvars.ContextVar[dict] = contextvars.ContextVar("tether_log_context", default={})  # noqa: B039

FIELDS = ("session", "execution", "worker", "user", "viewer", "token")


def bind(**ids) -> contextvars.Token:
    """Add ids to this task's context (and the tasks it starts from now on)."""
    return _context.set({**_context.get(), **{k: str(v) for k, v in ids.items() if v is not None}})


@contextmanager
def bound(**ids):
    """Ids for the lines logged inside the block only."""
    token = bind(**ids)
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    def __init__(self, *args, host: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.host = host

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "host": self.host,
            "pid": os.getpid(),
            **_context.get(),
        }
        for name in FIELDS:  # given with extra= on the call itself
            if (value := getattr(record, name, None)) is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted (and redacted) already: config/redact.py
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)
