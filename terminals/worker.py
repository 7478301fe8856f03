"""The owner worker: claims pending executions, holds their processes, serves viewers over the channel layer.

It is a loop over ``handle_one_step()`` (claim and launch one execution) with
two helpers beside it: a heartbeat that extends leases and drops any it lost,
and a receiver for viewer messages. Browsers never own processes; they send
messages here through their consumer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError

from executions.models import Backend as BackendKind
from executions.models import Evidence, Execution, Kind, State
from executions.spec import ExecutionSpec
from terminals import actions, faults, recovery
from terminals.backends.base import BackendError, Launch, SpawnError, SpawnSpec, Status, Tags
from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.lifetimes import CHECK_SECONDS, Limits, judge
from terminals.live import FlowBudget, LiveProcess
from terminals.models import CloseReason, TerminalSession, Worker, WorkerState
from terminals.registry import available_backends, backend_for
from terminals.viewing import ViewerHandlers
from terminals.wake import WAKE_CHANNEL

log = logging.getLogger(__name__)

# What a database restart looks like from here: worth waiting out, never a reason to give up a process.
DB_OUTAGE = (OperationalError, InterfaceError)
CLEANUP_SECONDS = 600  # how often a worker removes final screens past their retention


# A requested action -> the close reason the owner ends the process with.
_REQUESTS = {
    "cancel": CloseReason.KILLED,
    "kill": CloseReason.KILLED,
    "fail": CloseReason.FAILED,
    "reset": CloseReason.RESET,
    "complete": CloseReason.COMPLETED,
}

# close_reason -> (evidence recorded when we ended the process ourselves)
_ENDED_BY_US = {
    CloseReason.RESET: Evidence.RESET,
    CloseReason.KILLED: Evidence.KILLED,
    CloseReason.FAILED: Evidence.KILLED,
    CloseReason.IDLE: Evidence.IDLE_REAPED,
    CloseReason.DEADLINE: Evidence.DEADLINE,
    CloseReason.OUTPUT_LIMIT: Evidence.OUTPUT_LIMIT,
    "server_restart": Evidence.KILLED,
}


def _load_execution(pk: int) -> Execution:
    return Execution.objects.select_related("machine").get(pk=pk)


def _session_for(execution_pk: int) -> TerminalSession | None:
    return TerminalSession.objects.filter(execution_id=execution_pk).first()


class OwnerWorker(ViewerHandlers):
    def __init__(self, *, backends: set[str] | None = None, poll_interval: float = 0.5):
        self.backends = backends or available_backends()
        self.poll_interval = poll_interval
        self.layer = get_channel_layer()
        self.live: dict[int, LiveProcess] = {}
        # {execution id: token} for every lease this worker was given (claimed, adopted, watched): the
        # heartbeat extends a lease only under the token it holds.
        self.tokens: dict[int, int] = {}
        self.worker: Worker | None = None
        self.channel = ""
        self.draining = False
        self.drain_requested = False
        self.me = ProcessIdentity.of(os.getpid())
        self._tasks: set[asyncio.Task] = set()
        self.leases_fresh_until = 0.0
        self.stop: asyncio.Event | None = None
        self.woken = asyncio.Event()
        self.budget = FlowBudget(settings.TETHER_FLOW_WORKER_BYTES)  # output in flight to all viewers
        self.recovering = asyncio.Lock()  # one recovery pass at a time in this worker
        self.ending = asyncio.Semaphore(4)  # process trees being ended at once
        self.siblings: dict[int, int | None] = {}  # other workers here: pk -> pidfd watched (None: ended)
        self.watched: dict[int, str] = {}  # docker commands watched for a dead owner: pk -> request ("" none)

    def _background(self, work) -> None:
        """Run ``work`` beside the loop, keeping a reference so it is not collected mid-flight."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.channel = await self.layer.new_channel("tether.worker.")
        self.worker = await db(actions.register_worker)(
            worker_id=uuid.uuid4().hex,
            host=settings.TETHER_HOST,
            pid=self.me.pid,
            started_at=self.me.start_time,
            boot_id=boot_id(),
            channel_name=self.channel,
        )
        log.info("worker %s serving %s", self.worker.worker_id, ", ".join(sorted(self.backends)))

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then shut down without lying about what was held."""
        self.stop = stop
        if self.worker is None:
            await self.start()
        await self.recover_once()
        helpers = [
            asyncio.create_task(self._receive_loop()),
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._lifetimes_loop()),
            asyncio.create_task(self._recovery_loop()),
            asyncio.create_task(self._wake_loop()),
            asyncio.create_task(self._sibling_loop()),
        ]
        try:
            while not stop.is_set():
                try:
                    while not stop.is_set() and await self.handle_one_step():
                        pass
                except DB_OUTAGE as error:  # PostgreSQL restarting: held sessions carry on; claim again later
                    log.warning("cannot claim work (%r); retrying", error)
                await self._sleep_until_woken(stop)
        finally:
            for task in helpers:
                task.cancel()
            await self.shutdown()

    async def _wake_loop(self) -> None:
        """Listen for wake-ups all the time (a pub/sub layer drops what nobody is listening for)."""
        while True:
            try:
                await self.layer.receive(WAKE_CHANNEL)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis restarting: the poll interval still finds the work
                log.info("wake-up channel: %r", error)
                await asyncio.sleep(1)
                continue
            self.woken.set()

    async def _sleep_until_woken(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.woken.wait())]
        await asyncio.wait(waits, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        self.woken.clear()

    async def handle_one_step(self) -> bool:
        """Claim and launch one pending execution. Returns whether there was one."""
        if self.draining:
            return False
        claimed = await db(actions.claim_next_execution)(self.worker, self.backends)
        if claimed is None:
            return False
        execution, lease = claimed
        self.tokens[execution.pk] = lease.token
        try:
            await self.launch(execution, lease.token)
        except actions.LeaseLost as error:  # another worker owns it now: nothing of ours to record
            log.warning("%s; letting go", error)
        except Exception as error:
            log.exception("launching %s failed", execution)
            await self._until_recorded(lambda failure=error: self._lost_at_launch(execution, lease.token, failure))
        return True

    async def _lost_at_launch(self, execution: Execution, token: int, error: Exception) -> None:
        """A launch broke somewhere unexpected: the process may have started, so the outcome is unknown
        (retried through a database outage, so the slot is never left dispatched under a live lease)."""
        execution = await db(_load_execution)(execution.pk)
        if execution.state in (State.DISPATCHED, State.RUNNING):
            try:
                await self._record_unknown(execution, token, f"launch failed: {error!r}")
            except actions.LeaseLost:
                log.warning("execution %s: lease lost too; its new owner records it", execution.pk)

    async def _record_unknown(self, execution: Execution, token: int, reason: str) -> None:
        """No trustworthy exit can be had: unknown (controller_lost), the slot kept, the session closed."""
        await db(actions.settle_execution)(
            execution,
            worker=self.worker,
            token=token,
            to_state=State.UNKNOWN,
            evidence=Evidence.CONTROLLER_LOST,
            reason=reason,
            close_reason=CloseReason.CONTROLLER_LOST,
        )

    async def shutdown(self) -> None:
        """Stop, releasing nothing we cannot prove finished.

        What a later owner can take over is left running: tmux sessions (adopted, screen and all) and
        docker commands (docker keeps the exec and reports its exit to whoever inspects it next). A
        local process or a docker shell cannot be observed again by anyone: it is ended here, proven
        gone, and recorded as killed.
        """
        self.draining = True
        for live in list(self.live.values()):
            if self._later_owner_can_take(live.handle_backend, live.kind):
                await self._let_go(live, "left running for a later owner")
            else:
                await self._end(live, "server_restart")
        if self.worker is not None:
            await db(actions.stop_worker)(self.worker, "drained" if self.drain_requested else "shut down")

    @staticmethod
    def _later_owner_can_take(backend: str, kind: str) -> bool:
        """tmux sessions are adopted; docker commands are watched until docker reports their exit."""
        return backend == BackendKind.TMUX or (backend == BackendKind.DOCKER and kind == Kind.COMMAND)

    # --- launching ---------------------------------------------------------------------------

    async def launch(self, execution: Execution, token: int) -> None:
        """Start a claimed execution's program and hold it. Each step is written before the next can
        happen, so a crash anywhere leaves recovery a lease that says how far it got:

        1. claimed (the lease's handle says so): nothing was asked of the backend;
        2. the backend object it will run in (container id, tmux server) and the intent (the tags' marker)
           are saved: the backend may now start it;
        3. docker: the created exec's handle is saved before the exec is started;
        4. the process's own handle is saved, then ``running``.
        """
        faults.reached("launch.claimed")
        execution = await db(_load_execution)(execution.pk)
        machine = execution.machine
        session = await db(_session_for)(execution.pk)
        full_spec = ExecutionSpec.from_json(execution.spec)
        spec = SpawnSpec.from_execution_spec(full_spec)
        tags = Tags(
            session=str(session.id) if session else f"{execution.scope}/{execution.execution_id}",
            owner_pid=self.me.pid,
            owner_started_at=self.me.start_time,
            heartbeat=int(time.time()),
        )
        backend = backend_for(machine)

        async def before_start(handle: dict) -> None:
            starting = {**handle, "launch": Launch.STARTING}
            await self._until_recorded(lambda: db(actions.save_handle)(execution.pk, self.worker, token, starting))
            faults.reached("launch.starting")

        try:
            try:
                instance = await backend.instance(ensure=True)
            except BackendError as error:  # nothing was asked to start: as plain a refusal as a failed spawn
                raise SpawnError(str(error)) from None
            intent = {"launch": Launch.SPAWNING, "backend": machine.backend, "instance": instance}
            intent |= {"marker": tags.marker, "session": tags.session}
            execution = await self._until_recorded(
                lambda: db(actions.begin_spawn)(execution, self.worker, token, intent, instance)
            )
            faults.reached("launch.spawning")
            process = await backend.spawn(spec, tags, before_start=before_start, instance=instance)
        except SpawnError as error:
            # Proven: nothing started. A known outcome, said plainly.
            await db(actions.settle_execution)(
                execution,
                worker=self.worker,
                token=token,
                to_state=State.COMPLETED,
                evidence=Evidence.SPAWN_FAILED,
                reason=str(error),
                close_reason=CloseReason.SPAWN_FAILED,
                snapshot=str(error).encode(),
            )
            return  # the session is closed with the reason; viewers read it when they attach
        try:
            await self._until_recorded(
                lambda: db(actions.save_handle)(execution.pk, self.worker, token, process.handle)
            )
            if (placed := process.handle.get("instance")) and placed != instance:
                # It was made in another object than the one looked up (a tmux server restarted in between).
                execution = await self._until_recorded(
                    lambda: db(actions.begin_spawn)(execution, self.worker, token, process.handle, placed)
                )
            execution = await self._until_recorded(
                lambda: db(actions.fenced_transition)(
                    execution, State.RUNNING, worker=self.worker, token=token, evidence=Evidence.OBSERVED
                )
            )
        except actions.LeaseLost as error:
            await self._started_for_nobody(execution, process, error)
            return
        self._hold(execution, token, process, session, machine.backend)

    async def _started_for_nobody(self, execution: Execution, process, error: Exception) -> None:
        """We stalled while starting it and recovery took the lease meanwhile. If the new owner holds the
        process by its marker (adopted it, watches it), it is left to it; otherwise nobody observes it (its
        outcome was recorded without it, say unknown or never started): it is ours to end."""
        if await db(actions.lease_follows)(execution.pk, self.worker, process.handle.get("marker")):
            log.warning("%s while starting it; its new owner holds it", error)
            await process.detach()
        else:
            log.warning("%s while starting it; nobody observes it, so it is ended", error)
            try:
                await process.terminate(grace=0.5)
            except Exception as failure:
                log.error("execution %s: could not end a process nobody observes: %r", execution.pk, failure)

    def _hold(self, execution, token: int, process, session: TerminalSession | None, backend: str, screen=b"") -> None:
        """Hold ``process`` under ``token``: its output pump, buffer and viewer. ``screen`` starts the buffer
        (an adopted shell's stream begins with its screen as it is)."""
        spec = ExecutionSpec.from_json(execution.spec)
        live = LiveProcess(
            execution_pk=execution.pk,
            token=token,
            kind=execution.kind,
            process=process,
            session_id=str(session.id) if session else None,
            generation=session.generation if session else 0,
            handle_backend=backend,
            limits=Limits(spec.idle_seconds, spec.session_seconds, spec.output_limit_bytes),
            budget=self.budget,
        )
        if screen:
            live.buffer.append(screen)
            live.adopted_screen = len(screen)
        self.live[execution.pk] = live
        live.pump_task = asyncio.create_task(self._supervise(live, execution))

    # --- recovery ----------------------------------------------------------------------------

    async def _recovery_loop(self) -> None:
        last_cleanup = 0.0
        while True:
            await asyncio.sleep(settings.TETHER_RECOVERY_SECONDS)
            if self.draining:
                continue
            await self.recover_once()
            if time.monotonic() - last_cleanup > CLEANUP_SECONDS:
                last_cleanup = time.monotonic()
                try:
                    expired = await db(actions.expire_closed_sessions)(
                        actor=actions.Actor.worker(self.worker.worker_id)
                    )
                except Exception as error:
                    log.warning("retention cleanup failed (%r); next time", error)
                else:
                    if expired:
                        log.info("retention: expired the final screens of %d closed session(s)", len(expired))

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
                if finding.lease and finding.lease.execution_id in self.live:
                    continue
                if finding.backend not in self.backends and finding.action in (recovery.ADOPT, recovery.WATCH):
                    continue  # another worker, which serves that backend, will take it
                done.append(f"{finding}: {await self._recover(finding)}")
            for finding in await recovery.find_orphan_sessions():
                done.append(f"{finding}: {await recovery.remove_orphan(finding)}")
        except Exception:
            log.exception("recovery pass failed; the next one tries again")
        for line in done:
            log.info("recovery: %s", line)
        return done

    async def _sibling_loop(self) -> None:
        """Watch the other workers on this host: one that dies (kill -9, a crash) is seen at once through
        its pidfd, and its sessions are recovered the moment its leases expire, not at the next
        periodic pass (workers on other hosts are left to that pass)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    siblings = await db(recovery.sibling_workers)(self.worker)
                except Exception as error:  # the database is away: the periodic pass still recovers
                    log.info("cannot list the workers here (%r)", error)
                    siblings = []
                for pk, pid, started_at in siblings:
                    if pk not in self.siblings:
                        self._watch_sibling(loop, pk, ProcessIdentity(pid, started_at, boot_id()))
                await asyncio.sleep(settings.TETHER_HEARTBEAT_SECONDS)
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
        self._background(self._recover_after(pk))

    def _sibling_ended(self, loop, pk: int) -> None:
        fd = self.siblings.get(pk)
        if fd is not None:
            loop.remove_reader(fd)
            os.close(fd)
            self.siblings[pk] = None
            log.info("worker #%s on this host ended; recovering its sessions when its leases expire", pk)
            self._background(self._recover_after(pk))

    async def _recover_after(self, worker_pk: int) -> None:
        try:
            left = await db(recovery.seconds_until_leases_expire)(worker_pk)
        except Exception as error:  # the periodic pass will find them
            log.info("cannot read worker #%s's leases (%r)", worker_pk, error)
            return
        if left is None:
            return  # it held nothing (a worker that died long ago was settled by earlier passes)
        await asyncio.sleep(left + 0.05)
        if not self.draining:
            await self.recover_once()

    async def _recover(self, finding: recovery.Finding) -> str:
        if finding.action == recovery.WAIT:
            return "left for a later pass"
        if finding.action == recovery.ADOPT:
            return await self.adopt(finding)
        if finding.action == recovery.WATCH:
            token = await db(recovery.take_over)(finding.lease, self.worker)
            if token is None:
                return "skipped: another worker moved first"
            self.tokens[finding.lease.execution_id] = token
            self._background(self._watch_exit(finding, token))
            return f"watching under token {token}"
        return await recovery.settle(finding, self.worker)

    async def adopt(self, finding: recovery.Finding) -> str:
        """Take over a live tmux session under a new token: same shell, viewers reattach to it."""
        lease = finding.lease
        token = await db(recovery.take_over)(lease, self.worker)
        if token is None:
            return "skipped: another worker moved first"
        self.tokens[lease.execution_id] = token
        execution = await db(_load_execution)(lease.execution_id)
        backend = backend_for(execution.machine)
        try:
            if finding.handle != lease.handle:  # found from its owner's intent: keep where it is now
                await db(actions.save_handle)(lease.execution_id, self.worker, token, finding.handle)
            process = await backend.attach(finding.handle)
            await backend.tag(
                finding.handle, owner_pid=self.me.pid, owner_started_at=self.me.start_time, heartbeat=int(time.time())
            )
            screen = (await process.snapshot()).render()
        except Exception as error:
            finding.detail = f"{finding.detail}; adopting failed ({error!r})"
            finding.action = recovery.UNKNOWN
            await self._record_unknown(execution, token, f"recovery: {finding.detail}")
            return "unknown: could not adopt"
        await db(recovery.record_adoption)(lease, self.worker, token, finding.detail)
        session = await db(_session_for)(execution.pk)
        self._hold(await db(_load_execution)(execution.pk), token, process, session, execution.machine.backend, screen)
        return f"adopted under token {token}"

    async def _watch_exit(self, finding: recovery.Finding, token: int) -> None:
        """A docker command whose owner died: wait for docker to report its exit, then record it. A cancel
        (or kill, fail) requested meanwhile, which the heartbeat hands over, ends its tree instead."""
        pk = finding.lease.execution_id
        execution = await db(_load_execution)(pk)
        backend = backend_for(execution.machine)
        self.watched[pk] = ""
        try:
            while True:
                if self.tokens.get(pk) != token:
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
        finding.action = recovery.EXITED if seen.status == Status.EXITED else recovery.UNKNOWN
        finding.exit = seen.exit
        finding.detail = f"{finding.detail}; {seen.detail or seen.status}"
        await self._settle_watched(finding, token)

    async def _end_watched(self, finding: recovery.Finding, token: int, backend, request: str) -> None:
        """End a watched command's tree on request; killed once it is proven gone, else unknown."""
        log.info("%s: %s requested; ending the command it watches", finding.label, request)
        try:
            async with self.ending:
                await backend.remove(finding.handle, grace=1.0)
        except Exception as error:
            finding.action, finding.still_running = recovery.UNKNOWN, False
            finding.detail = f"{request} requested, but ending it failed ({error!r}): it may still run"
        else:
            finding.action = recovery.ENDED
            finding.detail = f"{request} requested: its watcher ended it, and none of its processes is left"
        await self._settle_watched(finding, token)

    async def _settle_watched(self, finding: recovery.Finding, token: int) -> None:
        try:
            log.info("recovery: %s: %s", finding, await recovery.settle(finding, self.worker, token=token))
        except actions.LeaseLost as error:
            log.warning("%s", error)

    async def _supervise(self, live: LiveProcess, execution: Execution) -> None:
        captured = bytearray()
        limit = settings.TETHER_COMMAND_OUTPUT_BYTES

        async def deliver(offset: int, data: bytes) -> None:
            if not await self._still_owner(live):
                raise actions.LeaseLost(f"execution {live.execution_pk}: lease lost while the worker stalled")
            if live.kind == Kind.COMMAND:
                captured.extend(data)
                if len(captured) > limit:
                    del captured[: len(captured) - limit]
            await self._send_output(live, offset, data)

        try:
            await live.pump(deliver)
            exit = await live.observe_exit()
            # No longer a live process of ours: the heartbeat must not mistake the lease it is about
            # to release for a lost one.
            self.live.pop(live.execution_pk, None)
            await self._until_recorded(
                lambda: self._settle(live, execution, exit, bytes(captured), live.buffer.end - len(captured))
            )
            if live.handle_backend == BackendKind.TMUX and not live.closing:
                # The dead pane only held the exit status, which is now recorded: remove the session.
                await live.process.terminate(grace=0.5)
        except actions.LeaseLost as error:
            log.warning("%s; letting go", error)
            await self._let_go(live, "lease lost")
        except Exception:
            log.exception("supervising execution %s failed", execution.pk)
            raise
        finally:
            self.live.pop(live.execution_pk, None)
            live.forget_flow()

    async def _until_recorded(self, write) -> None:
        """An observed exit must reach the record: retry through a database outage (the lease, checked
        inside, still decides whether we may write it)."""
        delay = 0.2
        while True:
            try:
                return await write()
            except DB_OUTAGE as error:
                log.warning("cannot record yet (%r); retrying in %.1fs", error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _settle(self, live, execution, exit, output: bytes, truncated: int) -> None:
        reason = live.close_reason if live.closing else CloseReason.EXITED
        fields = {}
        if live.kind == Kind.COMMAND:
            fields = {"output": output, "output_truncated": max(truncated, 0)}
        if exit is None or (live.closing and live.lost_observation):
            # No trustworthy exit, or we could not prove the tree we ended is gone.
            state, evidence = State.UNKNOWN, Evidence.CONTROLLER_LOST
            note = live.lost_observation
        elif live.closing and reason in _ENDED_BY_US:
            state, evidence, note = State.COMPLETED, _ENDED_BY_US[reason], exit.describe()
            fields["exit_signal"] = exit.signal
        else:
            evidence, exit_fields = actions.exit_record(exit)
            state, note = State.COMPLETED, exit.describe()
            fields |= exit_fields
        execution = await db(actions.settle_execution)(
            execution,
            worker=self.worker,
            token=live.token,
            to_state=state,
            evidence=evidence,
            reason=note,
            close_reason=reason if state == State.COMPLETED else CloseReason.CONTROLLER_LOST,
            snapshot=live.buffer.tail(64 * 1024),
            output_offset=live.buffer.end,
            restart_session=bool(live.session_id) and reason == CloseReason.RESET,
            **fields,
        )
        if live.viewer:
            asked = await db(actions.closed_by)(execution.pk) if live.handled_request else {}
            await self._send(
                live.viewer.channel,
                {
                    "type": "terminal.exit",
                    "state": execution.state,
                    "evidence": execution.evidence,
                    "exit_code": execution.exit_code,
                    "outcome": execution.outcome_label,
                    "reason": reason,
                    "generation": live.generation,
                    "epoch": live.token,
                    **asked,  # who asked for the end (by, action, why), told to the user
                },
            )
        if live.session_id and reason == CloseReason.RESET and execution.state == State.COMPLETED:
            await self._restarted(live)

    async def _restarted(self, live: LiveProcess) -> None:
        """The reset's next generation is pending (settle_execution started it): claim it, tell the viewer."""
        await self.layer.send(WAKE_CHANNEL, {"type": "wake"})
        if live.viewer:
            await self._send(
                live.viewer.channel,
                {"type": "terminal.generation", "reason": "reset", "ended": live.generation, "epoch": live.token},
            )

    async def _end(self, live: LiveProcess, reason: str) -> None:
        """End a held process tree on purpose; the supervisor records how it ended."""
        if live.closing:
            return
        live.closing, live.close_reason = True, reason
        live.update_flow()  # a closing session reads on to EOF
        try:
            # A few at a time: a thousand sessions killed at once, each scanning every process on the
            # host, ran out of time and were left alive (and honestly recorded unknown).
            async with self.ending:
                await live.process.terminate(grace=1.0)
        except Exception as error:  # cannot prove it gone: the supervisor records unknown
            live.lost_observation = f"terminate failed: {error!r}"
        if live.pump_task:
            await asyncio.wait([live.pump_task], timeout=15)

    async def _let_go(self, live: LiveProcess, why: str) -> None:
        """Stop observing without touching the process or writing anything about it."""
        if live.let_go:
            return
        live.let_go = True
        self.live.pop(live.execution_pk, None)
        if live.pump_task and live.pump_task is not asyncio.current_task():
            live.pump_task.cancel()
        if live.viewer:
            await self._send(
                live.viewer.channel,
                {"type": "terminal.closed", "reason": "server_restart", "text": why, "epoch": live.token},
            )
        await live.process.detach()

    async def _still_owner(self, live: LiveProcess) -> bool:
        """Before acting after a stall (SIGSTOP, a frozen VM, a database outage) longer than our leases
        provably last, confirm them: until then output waits, so two owners never act on one session."""
        while time.monotonic() > self.leases_fresh_until:
            try:
                await self.heartbeat_once()
            except Exception as error:
                log.warning("cannot confirm leases (%r); holding output", error)
                await asyncio.sleep(0.5)
        return self.live.get(live.execution_pk) is live

    # --- leases ------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.TETHER_HEARTBEAT_SECONDS)
            try:
                await self.heartbeat_once()
            except Exception as error:  # PostgreSQL restarting: beat again next time; stale leases stop output
                log.warning("heartbeat failed (%r); retrying", error)

    async def heartbeat_once(self) -> None:
        began = time.monotonic()
        given = dict(self.tokens)
        state, held = await db(actions.worker_heartbeat)(self.worker, given)
        for pk, token in given.items():  # released, or claimed by another worker: nothing left to extend
            if pk not in held and self.tokens.get(pk) == token:
                del self.tokens[pk]
        # Until then our leases provably stand: no other worker may claim them before they expire.
        self.leases_fresh_until = began + settings.TETHER_LEASE_TTL_SECONDS
        if state == WorkerState.DRAINING and not self.drain_requested:
            log.warning("drain requested: taking no new work, releasing everything, then stopping")
            self.drain_requested = self.draining = True
            if self.stop is not None:
                self.stop.set()
        for pk in self.watched:
            if request := held.get(pk, (None, ""))[1]:
                self.watched[pk] = request
        for live in list(self.live.values()):
            token, request = held.get(live.execution_pk, (None, ""))
            if token != live.token:
                log.warning("execution %s: lease lost; letting go", live.execution_pk)
                await self._let_go(live, "lease lost")
            elif request and request != live.handled_request:
                live.handled_request = request
                log.info("execution %s: %s requested", live.execution_pk, request)
                self._background(self._end(live, _REQUESTS[request]))

    async def _lifetimes_loop(self) -> None:
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            self.check_lifetimes()

    def check_lifetimes(self) -> None:
        """Warn the viewer before an idle or deadline close; close what is past its limits."""
        now = time.monotonic()
        for live in list(self.live.values()):
            if live.closing:
                continue
            live.update_flow()  # a departed viewer's grace period may have run out
            verdict = judge(
                live.limits,
                now=now,
                started=live.started,
                last_activity=live.last_activity,
                produced=live.buffer.end,
                interactive=live.session_id is not None,
            )
            if verdict is None:
                continue
            if verdict.action == "close":
                self._background(self._end(live, verdict.reason))
            elif live.viewer and live.warned != verdict.reason:
                live.warned = verdict.reason
                self._background(
                    self._send(
                        live.viewer.channel,
                        {
                            "type": "terminal.warning",
                            "reason": verdict.reason,
                            "seconds_left": verdict.seconds_left,
                            "epoch": live.token,
                        },
                    )
                )
