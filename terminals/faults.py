"""Named points in the worker where a test can make it die on purpose, to put a crash exactly there.

``TETHER_FAULT_POINTS=launch.claimed,launch.spawning`` (tests only) makes a worker SIGKILL itself when it
reaches one of those points, as a power cut or the OOM killer would, with nothing cleaned up;
``launch.spawning:stop`` freezes it there instead, as a debugger or a stalled VM would, and
``launch.spawning:slow`` makes that one launch wait ``SLOW_SECONDS``, as a slow remote engine would
(``adopt.taken:slow``: an adoption, as a busy database would). Unset
(the default) they cost a lookup or two.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from django.conf import settings

log = logging.getLogger(__name__)

SLOW_SECONDS = 4.0

POINTS = frozenset(
    {
        "launch.claimed",  # claimed (dispatched), before anything was asked of the backend
        "launch.spawning",  # the intent is saved; the backend has not been asked to start anything
        "launch.starting",  # docker: the exec is created and its handle kept, not started
        "adopt.taken",  # an adopter has taken a dead owner's lease over; it has not read the shell on yet
        "settle.recorded",  # an outcome is recorded; the session holder has not been let go yet
    }
)


async def reached(point: str) -> None:
    """``point`` kills the worker; ``point:stop`` freezes it (SIGSTOP) until someone sends SIGCONT;
    ``point:slow`` holds the launch (or adoption) that reached it for SLOW_SECONDS while the rest of the
    worker goes on."""
    if point in settings.TETHER_FAULT_POINTS:
        log.warning("fault point %s reached: this worker kills itself (SIGKILL)", point)
        os.kill(os.getpid(), signal.SIGKILL)
    if f"{point}:stop" in settings.TETHER_FAULT_POINTS:
        log.warning("fault point %s reached: this worker stops itself (SIGSTOP)", point)
        os.kill(os.getpid(), signal.SIGSTOP)
    if f"{point}:slow" in settings.TETHER_FAULT_POINTS:
        log.warning("fault point %s reached: this launch waits %.0f s", point, SLOW_SECONDS)
        await asyncio.sleep(SLOW_SECONDS)
