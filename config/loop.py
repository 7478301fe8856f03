"""The event loop of each process: uvloop, or asyncio's own. ``TETHER_WEB_LOOP`` for the web process
(daphne), ``TETHER_WORKER_LOOP`` for owner workers and the embedded mode (``tether_serve``).

Chosen before anything makes a loop: daphne makes its loop (under Twisted's asyncio reactor) when
``daphne.server`` is imported, so the web process starts through ``python -m config.web``. Read from the
environment, not from Django's settings, because that loop is made before Django is set up.

A worker starts its programs through ``terminals.children``, never uvloop's own subprocesses: those inherit
uvloop's stdio sockets at other numbers too, and a daemon a worker starts (a tmux server) kept them, so the
worker's wait for that command's end never returned.
"""

from __future__ import annotations

import asyncio
import os

CHOICES = ("uvloop", "asyncio")


def chosen(variable: str = "TETHER_WEB_LOOP") -> str:
    value = os.environ.get(variable, "").strip() or "uvloop"
    if value not in CHOICES:
        raise SystemExit(f"{variable} must be one of {', '.join(CHOICES)}, not {value!r}")
    return value


def choose(variable: str = "TETHER_WEB_LOOP") -> str:
    """Make every new event loop of this process the kind ``variable`` chooses; returns which it is."""
    if (kind := chosen(variable)) == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return kind
