"""The recoverer: settles what dead owners left behind (terminals.recovery plans it), adopts live tmux
sessions, and watches a dead owner's docker commands to their exit.

It runs a periodic pass, and watches the other workers on this host through pidfds, so a sibling's death is
acted on the moment its leases expire rather than at the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from channels.db import database_sync_to_async as db

from terminals import actions, faults, metrics, recovery
from terminals.backends.base import Status
from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.owner.context import WorkerContext, every
from terminals.owner.host import SessionHost
from terminals.owner.launch import load_execution, session_for
from terminals.owner.leases import LeaseKeeper
from terminals.registry import backend_for

log = logging.getLogger(__name__)

CLEANUP_SECONDS = 600  # how often a worker removes final screens and recordings past their retention


class Recoverer:
    def __init__(self, context: WorkerContext, leases: LeaseKeeper, host: SessionHost):
        self.context, self.leases, self.host = context, leases, host
        self.recovering = asyncio.Lock()  # one recovery pass at a time in this worker
        self.siblings: dict[int, int | None] = {}  # other workers here: pk -> pidfd watched (None: ended)
        self.silent_pass_at = -1e9  # when a pass last ran for silent workers on other hosts (monotonic)
        self.watched: dict[int, str] = {}  # docker commands watched for a dead owner: pk -> request ("" none)

    def beaten(self, held: dict[int, tuple[int, str]]) -> None:
        """After a heartbeat: hand a request made for a watched command to its watcher."""
        for pk in self.watched:
            if request := held.get(pk, (None, ""))[1]:
                self.watched[pk] = request

    async def run(self) -> None:
        """The periodic pass, and now and then the retention cleanup of closed sessions' final screens."""
        last_cleanup = 0.0

        async def step() -> None:
            nonlocal last_cleanup
            if self.context.draining:
                return
            await self.recover_once()
            if time.monotonic() - last_cleanup > CLEANUP_SECONDS:
                last_cleanup = time.monotonic()
                actor = actions.Actor.worker(self.context.worker.worker_id)
                if expired := await db(actions.expire_closed_sessions)(actor=actor):
                    log.info("retention: expired the final screens of %d closed session(s)", len(expired))
                await self.host.recorder.clean_up(actor)

        await every(self.context.config.recovery_seconds, step, "recovery pass")

    async def recover_once(self, *, adopt: bool = True) -> list[str]:
        """Settle what dead owners left behind (see terminals.recovery). Returns what was done.

        ``adopt=False`` (recover_terminals) leaves live tmux sessions and running docker commands to a worker.
        """
        async with self.recovering:
            return await self._recover_pass(adopt)

    async def _recover_pass(self, adopt: bool) -> list[str]:
        done = []
        try:
            findings = await recovery.plan(can_adopt=adopt, can_watch=adopt)
            for finding in findings:
                if finding.lease and finding.lease.execution_id in self.context.live:
                    continue
                if finding.backend not in self.context.backends and finding.action in (
                    recovery.Action.ADOPT,
                    recovery.Action.WATCH,
                ):
                    continue  # another worker, which serves that backend, will take it
                done.append(f"{finding}: {await self._recover(finding)}")
                metrics.RECOVERY.labels(str(finding.action)).inc()
            for finding in await recovery.find_orphan_sessions():
                done.append(f"{finding}: {await recovery.remove_orphan(finding)}")
                metrics.RECOVERY.labels(recovery.Action.REMOVE).inc()
            if adopt:  # a worker's pass (it serves these backends), not recover_terminals'
                done += await recovery.sweep_settled_holders(set(self.context.backends))
            if done:
                await self.host.recorder.sweep()  # what was settled here had no owner to finish its recording
        except Exception:
            log.exception("recovery pass failed; the next one tries again")
        for line in done:
            log.info("recovery: %s", line)
        return done

    async def watch_siblings(self) -> None:
        """Watch the other workers on this host: one that dies (kill -9, a crash) is seen at once through
        its pidfd, and its sessions are recovered the moment its leases expire, not at the next
        periodic pass. A worker on another host is seen at the first heartbeat after its own stopped
        keeping its leases."""
        loop = asyncio.get_running_loop()

        async def look() -> None:
            siblings = await db(recovery.sibling_workers)(self.context.worker)  # failing: the periodic pass recovers
            for pk, pid, started_at in siblings:
                if pk not in self.siblings:
                    self._watch_sibling(loop, pk, ProcessIdentity(pid, started_at, boot_id()))
            # A worker on another host cannot be watched through a pidfd: its heartbeat going stale is what
            # says it died (or stalled). Recover its sessions then, not at the next periodic pass.
            silent = await db(recovery.silent_workers_with_work_here)(self.context.worker, self.context.backends)
            # Again while one is left (a takeover skipped a locked row), but not every beat: a lease left
            # to wait would otherwise cost a pass each time.
            due = time.monotonic() - self.silent_pass_at >= 3 * self.context.config.heartbeat_seconds
            if silent and due and not self.context.draining and not self.recovering.locked():
                self.silent_pass_at = time.monotonic()
                self.context.tasks.start(self.recover_once())

        try:
            await every(self.context.config.heartbeat_seconds, look, "listing the workers here", at_once=True)
        finally:
            for fd in self.siblings.values():
                if fd is not None:
                    loop.remove_reader(fd)
                    os.close(fd)

    def _watch_sibling(self, loop, pk: int, identity: ProcessIdentity) -> None:
        try:
            fd = os.pidfd_open(identity.pid)
        except ProcessLookupError:
            fd = None
        if fd is not None and identity.is_alive():  # checked after opening: the pidfd is that very process
            self.siblings[pk] = fd
            loop.add_reader(fd, self._sibling_ended, loop, pk)
            return
        if fd is not None:
            os.close(fd)
        self.siblings[pk] = None
        self.context.tasks.start(self._recover_after(pk))

    def _sibling_ended(self, loop, pk: int) -> None:
        fd = self.siblings.get(pk)
        if fd is not None:
            loop.remove_reader(fd)
            os.close(fd)
            self.siblings[pk] = None
            log.info("worker #%s on this host ended; recovering its sessions when its leases expire", pk)
            self.context.tasks.start(self._recover_after(pk))

    async def _recover_after(self, worker_pk: int) -> None:
        try:
            left = await db(recovery.seconds_until_leases_expire)(worker_pk)
        except Exception as error:  # the periodic pass will find them
            log.info("cannot read worker #%s's leases (%r)", worker_pk, error)
            return
        if left is None:
            return  # it held nothing (a worker that died long ago was settled by earlier passes)
        await asyncio.sleep(left + 0.05)
        if not self.context.draining:
            await self.recover_once()

    async def _recover(self, finding: recovery.Finding) -> str:
        if finding.action == recovery.Action.WAIT:
            return "left for a later pass"
        if finding.action == recovery.Action.ADOPT:
            return await self.adopt(finding)
        if finding.action == recovery.Action.WATCH:
            token = await db(actions.take_over_lease)(finding.lease, self.context.worker)
            if token is None:
                return "skipped: another worker moved first"
            self.leases.give(finding.lease.execution_id, token)
            self.context.tasks.start(self._watch_exit(finding, token))
            return f"watching under token {token}"
        return await recovery.settle(finding, self.context.worker)

    async def adopt(self, finding: recovery.Finding) -> str:
        """Take over a live held or tmux shell under a new token: same shell, viewers reattach to it.

        The lease is taken first and the shell attached after, so a worker that loses the race never
        touches it (a holder answers one client; a tmux client resumes a stopped pane). A holder keeps what
        nobody read; tmux streams only what is printed once a client is attached, so a command that ended
        before then has no end mark to read: it stays open until the shell's next command ends it
        ``unknown`` (terminals/actions/commands.py), never "exited"."""
        lease = finding.lease
        token = await db(actions.take_over_lease)(lease, self.context.worker)
        if token is None:
            return "skipped: another worker moved first"
        self.leases.give(lease.execution_id, token)
        await faults.reached("adopt.taken")
        execution = await db(load_execution)(lease.execution_id)
        backend = backend_for(execution.machine)
        process = None
        try:
            if finding.handle != lease.handle:  # found from its owner's intent: keep where it is now
                await db(actions.save_handle)(lease.execution_id, self.context.worker, token, finding.handle)
            process = await backend.attach(finding.handle)
            if backend.can_retag:
                me = self.context.me
                await backend.tag(
                    finding.handle, owner_pid=me.pid, owner_started_at=me.start_time, heartbeat=int(time.time())
                )
            screen = (await process.snapshot()).render() if process.can_snapshot else b""
        except BaseException as error:
            if process is not None:  # let go of what was attached (a tmux client closed in its turn)
                with contextlib.suppress(Exception):
                    await process.detach()
            if not isinstance(error, Exception):
                raise
            finding.detail = f"{finding.detail}; adopting failed ({error!r})"
            finding.action = recovery.Action.UNKNOWN
            await self.host.record_unknown(execution, token, f"recovery: {finding.detail}")
            return "unknown: could not adopt"
        await db(actions.record_adoption)(lease, self.context.worker, token, finding.detail)
        session = await db(session_for)(execution.pk)
        self.host.hold(
            await db(load_execution)(execution.pk), token, process, session, execution.machine.backend, screen,
            adopted=True,
        )  # fmt: skip
        return f"adopted under token {token}"

    async def _watch_exit(self, finding: recovery.Finding, token: int) -> None:
        """A docker command whose owner died: wait for docker to report its exit, then record it. A cancel
        (or kill, fail) requested meanwhile, which the heartbeat hands over, ends its tree instead."""
        pk = finding.lease.execution_id
        execution = await db(load_execution)(pk)
        backend = backend_for(execution.machine)
        self.watched[pk] = ""
        try:
            while True:
                if not self.leases.holds(pk, token):
                    log.warning("%s: lease lost while watching it; letting go", finding.label)
                    return
                if request := self.watched.get(pk):
                    await self._end_watched(finding, token, backend, request)
                    return
                try:
                    seen = await backend.inspect(finding.handle)
                except Exception as error:
                    log.warning("watching %s: %r", finding.label, error)
                    seen = None
                if seen is not None and seen.status != Status.ALIVE and seen.status != Status.UNKNOWN:
                    break
                await asyncio.sleep(0.5)
        finally:
            self.watched.pop(pk, None)
        finding.action = recovery.Action.EXITED if seen.status == Status.EXITED else recovery.Action.UNKNOWN
        finding.exit = seen.exit
        finding.detail = f"{finding.detail}; {seen.detail or seen.status}"
        await self._settle_watched(finding, token)

    async def _end_watched(self, finding: recovery.Finding, token: int, backend, request: str) -> None:
        """End a watched command's tree on request; killed once it is proven gone, else unknown."""
        log.info("%s: %s requested; ending the command it watches", finding.label, request)
        try:
            async with self.context.ending:
                await backend.remove(finding.handle, grace=1.0)
        except Exception as error:
            finding.action, finding.still_running = recovery.Action.UNKNOWN, False
            finding.detail = f"{request} requested, but ending it failed ({error!r}): it may still run"
        else:
            finding.action = recovery.Action.ENDED
            finding.detail = f"{request} requested: its watcher ended it, and none of its processes is left"
        await self._settle_watched(finding, token)

    async def _settle_watched(self, finding: recovery.Finding, token: int) -> None:
        try:
            log.info("recovery: %s: %s", finding, await recovery.settle(finding, self.context.worker, token=token))
        except actions.LeaseLost as error:
            log.warning("%s", error)
