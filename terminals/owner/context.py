"""What the owner worker's services share: who the worker is, what it holds, and the tasks it owns."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from channels.layers import BaseChannelLayer
from django.db import InterfaceError, OperationalError, connection

from terminals import metrics
from terminals.backends.procfs import ProcessIdentity
from terminals.models import Worker
from terminals.owner.config import WorkerConfig
from terminals.owner.live import FlowBudget, LiveProcess
from terminals.screen import Screens
from terminals.tasks import Tasks

log = logging.getLogger(__name__)

# What a database restart looks like from here: worth waiting out, never a reason to give up a process.
DB_OUTAGE = (OperationalError, InterfaceError)


@dataclass
class WorkerContext:
    layer: BaseChannelLayer
    me: ProcessIdentity
    backends: set[str]
    worker: Worker | None = None
    channel: str = ""
    live: dict[int, LiveProcess] = field(default_factory=dict)  # execution pk -> the process held for it
    tasks: Tasks = field(default_factory=Tasks)
    config: WorkerConfig = field(default_factory=WorkerConfig.from_settings)  # the settings, read once
    budget: FlowBudget = field(init=False)
    # Trees ended at once: they share their passes over /proc (procfs.shared_table).
    ending: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(16))
    draining: bool = False  # taking no new work
    screens: Screens = field(init=False)  # its shells' screens (the emulator process, started on first use)

    def __post_init__(self) -> None:
        self.budget = FlowBudget(self.config.flow_worker_bytes, self.config.flow_high_bytes)
        self.screens = Screens(self.config.screen_scrollback)


def db_apart(function):
    """``function`` (database work with storage I/O in it: slow) run in a thread of its own, never the one the
    worker's heartbeats and fenced writes wait on; on SQLite (the embedded mode), which takes one writer at a
    time, in that one thread all the same."""
    return database_sync_to_async(function, thread_sensitive=connection.vendor == "sqlite")


async def until_recorded(write):
    """An observed fact must reach the record: retry through a database outage (the lease, checked inside
    the write, still decides whether we may write it)."""
    delay = 0.2
    while True:
        try:
            return await write()
        except DB_OUTAGE as error:
            log.warning("cannot record yet (%r); retrying in %.1fs", error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def every(seconds: float, step: Callable[[], Awaitable[None]], what: str, *, at_once: bool = False) -> None:
    """The one shape of a worker's periodic loops: ``step`` every ``seconds``, for ever. A step that fails
    is logged and tried at the next turn: a database or Redis restart is waited out, never a reason to stop."""
    if not at_once:
        await asyncio.sleep(seconds)
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("%s failed (%r); trying again in %.1fs", what, error, seconds)
        await asyncio.sleep(seconds)


async def receive_forever(layer: BaseChannelLayer, channel: str, handle: Callable[[dict], Awaitable[None]]) -> None:
    """Hand each message on ``channel`` to ``handle``, for ever. A receive that fails (Redis restarting) is
    tried again after a pause that grows to 5 s; the database holds every fact, so nothing is decided here."""
    backoff = 0.1
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("receiving on %s failed (%r); retrying in %.1fs", channel, error, backoff)
            metrics.LAYER_ERRORS.labels("worker_receive").inc()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
            continue
        backoff = 0.1
        await handle(message)
