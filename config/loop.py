"""The event loop of the web process (daphne): uvloop, or asyncio's own (``TETHER_WEB_LOOP``).

Chosen before anything makes a loop: daphne makes its loop (under Twisted's asyncio reactor) when
``daphne.server`` is imported, so the web process starts through ``python -m config.web``. Read from the
environment, not from Django's settings, because that loop is made before Django is set up.

Workers (and ``tether_serve``, which runs a worker in its own process) stay on asyncio's loop: uvloop starts
subprocesses with its own stdio sockets inherited at other numbers too, so a daemon a worker starts (a tmux
server) would hold them, and the worker's wait for that command's end would never return.
"""

from __future__ import annotations

import asyncio
import os

CHOICES = ("uvloop", "asyncio")


def chosen() -> str:
    value = os.environ.get("TETHER_WEB_LOOP", "").strip() or "uvloop"
    if value not in CHOICES:
        raise SystemExit(f"TETHER_WEB_LOOP must be one of {', '.join(CHOICES)}, not {value!r}")
    return value


def choose() -> str:
    """Make every new event loop of this process the chosen kind; returns which it is."""
    if (kind := chosen()) == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return kind
