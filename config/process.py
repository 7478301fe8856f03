"""How a Tether process ends once its work is done."""

from __future__ import annotations

import os


def settle_heap() -> None:
    """Once a process has started: what it made to start (Django, its apps, every module: most of its heap) is
    kept out of the garbage collector's passes from now on. Each full pass walked all of it: a stall of 130 to
    190 ms of every shell's stream, in daphne and in the worker alike (docs/benchmarks.md). Collected once
    first, so no garbage of the start is kept."""
    import gc

    gc.collect()
    gc.freeze()


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
