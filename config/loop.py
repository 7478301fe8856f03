"""The event loop every Tether process runs on: uvloop, or asyncio's own (``TETHER_EVENT_LOOP``).

Chosen before anything makes a loop: daphne makes its loop (under Twisted's asyncio reactor) when
``daphne.server`` is imported, so the web process starts through ``python -m config.web``; the worker and
``tether_serve`` call ``choose()`` first. The variable is read from the environment, not from Django's
settings, because daphne's loop is made before Django is set up.
"""

from __future__ import annotations

import asyncio
import os

CHOICES = ("uvloop", "asyncio")


def chosen() -> str:
    value = os.environ.get("TETHER_EVENT_LOOP", "").strip() or "asyncio"
    if value not in CHOICES:
        raise SystemExit(f"TETHER_EVENT_LOOP must be one of {', '.join(CHOICES)}, not {value!r}")
    return value


def choose() -> str:
    """Make every new event loop of this process the chosen kind; returns which it is."""
    if (kind := chosen()) == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return kind


def leave(code: int = 0) -> None:
    """End the process once its work is done and said: logs and output flushed, database connections
    closed, then ``os._exit``. Python's own finalisation of Django and everything it imported took 1 to 2.5 s
    of CPU here after a worker had already stopped (a restart waited on it, and the tests' every stop)."""
    import logging
    import sys

    from django.db import connections

    try:
        connections.close_all()
    except Exception:  # the process is leaving: the database notices the closed socket
        pass
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
