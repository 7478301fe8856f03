"""The background tasks a worker or a viewer's consumer starts: every one is owned here, so none is lost
or left running (Channels' rule for consumers, and the worker's: shut down what you start)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

log = logging.getLogger(__name__)


class Tasks:
    """Started in a task group while one runs (the worker's), else loose (a consumer, a test driving single
    steps); ended and awaited by ``close()``. A task may have a name: one of a name at a time, so starting
    another under that name ends the one before (a new attach replaces the one still looking)."""

    def __init__(self) -> None:
        self.group: asyncio.TaskGroup | None = None
        self.running: set[asyncio.Task] = set()
        self.named: dict[str, asyncio.Task] = {}

    def start(self, work: Coroutine, *, name: str | None = None) -> asyncio.Task:
        """Run ``work`` beside the owner's loops. Its failure is logged and stays its own: one session's
        error must never cancel the task group, and with it every other session's supervision."""
        if name is not None and (old := self.named.pop(name, None)) is not None and old is not asyncio.current_task():
            old.cancel()
        guarded = _guarded(work)
        task = self.group.create_task(guarded) if self.group is not None else asyncio.create_task(guarded)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        if name is not None:
            self.named[name] = task
            task.add_done_callback(lambda done: self.named.get(name) is done and self.named.pop(name))
        return task

    def done_with(self, name: str) -> None:
        """The current task named ``name`` has done what it was for: a new one may start while it finishes."""
        if self.named.get(name) is asyncio.current_task():
            del self.named[name]

    def has(self, name: str) -> bool:
        return name in self.named

    async def wait(self, tasks) -> None:
        await asyncio.gather(*(task for task in tasks if task is not asyncio.current_task()), return_exceptions=True)

    async def close(self) -> None:
        running = [task for task in self.running if task is not asyncio.current_task()]
        self.named.clear()
        for task in running:
            task.cancel()
        await self.wait(running)


async def _guarded(work: Coroutine) -> None:
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("a background task failed (%s); the others go on", getattr(work, "__qualname__", work))
