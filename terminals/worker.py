"""The owner worker: claims pending executions, holds their processes, serves viewers over the channel layer.

A small root over named services (terminals/owner/), each with one concern:

- ``LeaseKeeper``: the heartbeat, and the one check that the worker's leases still stand;
- ``Launcher``: starts a claimed execution, writing each launch step before the next;
- ``SessionHost``: holds started processes, supervises them, ends them on purpose, settles their outcome;
  its ``Recorder`` keeps each shell's recording;
- ``Recoverer``: settles, adopts or watches what dead owners left behind;
- ``ViewerService``: the viewers' messages (attach, input, acks...).

The root runs them under one ``asyncio.TaskGroup``, so every task is owned, awaited and shut down, and runs
launches beside the claim loop, a few at a time, so a slow spawn never stalls claiming. Browsers never own
processes; they send messages here through their consumer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer

from config import logs
from files.protocol import FilesAsk
from files.service import FileService
from terminals import actions, metrics
from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.models import WorkerState
from terminals.owner.context import DB_OUTAGE, WorkerContext, receive_forever
from terminals.owner.host import SessionHost
from terminals.owner.http import WorkerHttp
from terminals.owner.launch import Launcher
from terminals.owner.leases import LeaseKeeper
from terminals.owner.lifetimes import LifetimeWatch
from terminals.owner.outbox import Outbox
from terminals.owner.recoverer import Recoverer
from terminals.owner.viewers import ViewerService
from terminals.registry import available_backends
from terminals.wake import WAKE_CHANNEL

log = logging.getLogger(__name__)

LAUNCHES_AT_ONCE = 8  # launches in flight beside the claim loop


class OwnerWorker:
    def __init__(self, *, backends: set[str] | None = None, poll_interval: float = 0.5, http: str = ""):
        self.poll_interval = poll_interval
        self.context = WorkerContext(
            layer=get_channel_layer(), me=ProcessIdentity.of(os.getpid()), backends=backends or available_backends()
        )
        self.leases = LeaseKeeper(self.context, self._beaten)
        outbox = Outbox(self.context)
        self.host = SessionHost(self.context, self.leases, outbox)
        self.launcher = Launcher(self.context, self.host)
        self.lifetimes = LifetimeWatch(self.context, self.leases, outbox, self.host)
        self.recoverer = Recoverer(self.context, self.leases, self.host)
        self.files = FileService(self.context, outbox)
        others = {FilesAsk.TYPE: self.files.take}
        self.viewers = ViewerService(self.context, self.leases, outbox, self.host, others)
        self.http = WorkerHttp(self.context, self.leases, http) if http else None
        self.stop: asyncio.Event | None = None
        self.drain_requested = False
        self.woken = asyncio.Event()
        self.launch_slots = asyncio.Semaphore(LAUNCHES_AT_ONCE)
        self.launching: set[asyncio.Task] = set()

    @property
    def worker(self):
        return self.context.worker

    @property
    def live(self):
        return self.context.live

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.context.channel = await self.context.layer.new_channel("tether.worker.")
        me = self.context.me
        worker_id = uuid.uuid4().hex
        # Its sessions' streams come over links of its own where the layer makes them (transport/links.py).
        listen = getattr(self.context.layer, "listen", None)
        link = await listen(worker_id) if listen is not None else ""
        self.context.worker = await db(actions.register_worker)(
            worker_id=worker_id,
            link=link,
            host=self.context.config.host,
            pid=me.pid,
            started_at=me.start_time,
            boot_id=boot_id(),
            channel_name=self.context.channel,
            backends=self.context.backends,
        )
        logs.bind(worker=self.worker.worker_id)  # every task it starts from here logs as this worker
        metrics.expose("worker")
        metrics.HELD.contexts.append(self.context)
        log.info("worker %s serving %s", self.worker.worker_id, ", ".join(sorted(self.context.backends)))

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then shut down without lying about what was held."""
        self.stop = stop
        if self.worker is None:
            await self.start()
        try:
            async with asyncio.TaskGroup() as group:
                self.context.tasks.group = group
                # Its health and metrics answer from the start: the first recovery pass may take a while (and
                # what it does, a holder swept, is counted there).
                loops = [group.create_task(self.http.run())] if self.http else []
                await self.recover_once()  # what it adopts or watches is owned by the group too
                loops += [
                    group.create_task(work)
                    for work in (
                        self.viewers.run(),
                        self.leases.run(),
                        self.lifetimes.run(),
                        self.host.recorder.run(),
                        self.recoverer.run(),
                        self.recoverer.watch_siblings(),
                        self._wake_loop(),
                    )
                ]
                try:
                    await self._claim_loop(stop)
                finally:
                    # Launches in flight end held (then shut down below) or recorded, while the heartbeat
                    # still keeps their leases.
                    await self.context.tasks.wait(list(self.launching))
                    for task in loops:
                        task.cancel()
                    await self.shutdown()
        finally:
            self.context.tasks.group = None

    async def shutdown(self) -> None:
        """Stop, releasing nothing we cannot prove finished (see SessionHost.shutdown); then end what is
        left of this worker's tasks (watchers, waits: what they watch stays recorded for the next owner)."""
        self.context.draining = True
        await self.host.shutdown()
        if self.worker is not None:
            await db(actions.stop_worker)(self.worker, "drained" if self.drain_requested else "shut down")
        await self.context.tasks.close()
        await self.context.screens.close()
        if self.context in metrics.HELD.contexts:
            metrics.HELD.contexts.remove(self.context)

    async def _beaten(self, state: str, held: dict[int, tuple[int, str]]) -> None:
        if state == WorkerState.DRAINING and not self.drain_requested:
            log.warning("drain requested: taking no new work, releasing everything, then stopping")
            self.drain_requested = self.context.draining = True
            if self.stop is not None:
                self.stop.set()
        self.recoverer.beaten(held)
        await self.host.beaten(held)

    # --- claiming ----------------------------------------------------------------------------

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                while not stop.is_set() and await self._claim_and_start():
                    pass
            except DB_OUTAGE as error:  # PostgreSQL restarting: held sessions carry on; claim again later
                log.warning("cannot claim work (%r); retrying", error)
            await self._sleep_until_woken(stop)

    async def _claim_and_start(self) -> bool:
        """Claim one execution and start its launch beside this loop. Returns whether there was one."""
        await self.launch_slots.acquire()
        try:
            # Waiting for a slot may have outlasted a stop: claim nothing another worker could run.
            claimed = None if self.stop is not None and self.stop.is_set() else await self._claim()
        except BaseException:
            self.launch_slots.release()
            raise
        if claimed is None:
            self.launch_slots.release()
            return False

        async def launch() -> None:
            try:
                await self.launcher.launch_claimed(*claimed)
            finally:
                self.launch_slots.release()

        task = self.context.tasks.start(launch())
        self.launching.add(task)
        task.add_done_callback(self.launching.discard)
        return True

    async def _claim(self):
        if self.context.draining:
            return None
        claimed = await db(actions.claim_next_execution)(self.worker, self.context.backends)
        if claimed is None:
            return None
        execution, lease = claimed
        self.leases.give(execution.pk, lease.token)
        return execution, lease.token

    async def handle_one_step(self) -> bool:
        """Claim and launch one pending execution, to its end. Returns whether there was one."""
        claimed = await self._claim()
        if claimed is not None:
            await self.launcher.launch_claimed(*claimed)
        return claimed is not None

    async def _wake_loop(self) -> None:
        """Listen for wake-ups all the time (a pub/sub layer drops what nobody is listening for)."""

        async def woken(message: dict) -> None:
            self.woken.set()

        await receive_forever(self.context.layer, WAKE_CHANNEL, woken)

    async def _sleep_until_woken(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.woken.wait())]
        await asyncio.wait(waits, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        self.woken.clear()

    # --- for commands and tests that drive single steps -----------------------------------------

    async def recover_once(self, *, adopt: bool = True) -> list[str]:
        return await self.recoverer.recover_once(adopt=adopt)

    async def heartbeat_once(self) -> None:
        await self.leases.beat()

    def check_lifetimes(self) -> None:
        self.lifetimes.check()
