"""Launching a claimed execution: each step written before the next can happen, so a crash anywhere leaves
recovery a lease that says how far it got (see ``Launcher.launch``)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from channels.db import database_sync_to_async as db

from config import logs
from executions.models import Evidence, Execution, State
from executions.spec import ExecutionSpec
from terminals import actions, faults, marks
from terminals.backends import handles
from terminals.backends.base import BackendError, SpawnError, SpawnSpec, Tags
from terminals.backends.handles import Handle
from terminals.models import TerminalSession
from terminals.outcome import Outcome
from terminals.owner.context import WorkerContext, until_recorded
from terminals.owner.host import SessionHost
from terminals.registry import backend_for

log = logging.getLogger(__name__)


def load_execution(pk: int) -> Execution:
    return Execution.objects.select_related("machine").get(pk=pk)


def session_for(execution_pk: int) -> TerminalSession | None:
    return TerminalSession.objects.filter(execution_id=execution_pk).first()


class Launcher:
    def __init__(self, context: WorkerContext, host: SessionHost):
        self.context, self.host = context, host

    async def launch_claimed(self, execution: Execution, token: int) -> None:
        """Launch, and record what a launch that broke unexpectedly leaves: the process may have started."""
        with logs.bound(execution=execution.pk):
            try:
                await self.launch(execution, token)
            except actions.LeaseLost as error:  # another worker owns it now: nothing of ours to record
                log.warning("%s; letting go", error)
            except Exception as error:
                log.exception("launching %s failed", execution)
                await until_recorded(lambda failure=error: self._lost_at_launch(execution, token, failure))

    async def _lost_at_launch(self, execution: Execution, token: int, error: Exception) -> None:
        """A launch broke somewhere unexpected: the process may have started, so the outcome is unknown
        (retried through a database outage, so the slot is never left dispatched under a live lease)."""
        execution = await db(load_execution)(execution.pk)
        if execution.state in (State.DISPATCHED, State.RUNNING):
            try:
                await self.host.record_unknown(execution, token, f"launch failed: {error!r}")
            except actions.LeaseLost:
                log.warning("execution %s: lease lost too; its new owner records it", execution.pk)

    async def launch(self, execution: Execution, token: int) -> None:
        """Start a claimed execution's program and hold it. Each step is written before the next can
        happen, so a crash anywhere leaves recovery a lease that says how far it got:

        1. claimed (the lease's handle says so): nothing was asked of the backend;
        2. the backend object it will run in (container id, tmux server) and the intent (the tags' marker)
           are saved: the backend may now start it;
        3. docker: the created exec's handle is saved before the exec is started;
        4. the process's own handle is saved, then ``running``.
        """
        await faults.reached("launch.claimed")
        execution = await db(load_execution)(execution.pk)
        machine = execution.machine
        session = await db(session_for)(execution.pk)
        logs.bind(session=session.id if session else None)
        full_spec = ExecutionSpec.from_json(execution.spec)
        spec = SpawnSpec.from_execution_spec(full_spec)
        tags = Tags(
            session=str(session.id) if session else f"{execution.scope}/{execution.execution_id}",
            owner_pid=self.context.me.pid,
            owner_started_at=self.context.me.start_time,
            heartbeat=int(time.time()),
        )
        backend = backend_for(machine)

        async def before_start(handle: Handle) -> None:
            starting = handles.starting(handle)
            await until_recorded(lambda: db(actions.save_handle)(execution.pk, self.context.worker, token, starting))
            await faults.reached("launch.starting")

        try:
            try:
                instance = await backend.instance(ensure=True)
            except BackendError as error:  # nothing was asked to start: as plain a refusal as a failed spawn
                raise SpawnError(str(error)) from None
            if session is not None:
                spec = await self._integrate(spec, execution, token, session, backend, instance)
            if not full_spec.pty:  # on pipes: the holder's mux runs it and speaks for it (executions.pipes)
                try:
                    mux = await backend.pipes_program(instance)
                except BackendError as error:
                    raise SpawnError(str(error)) from None
                spec = replace(spec, argv=(mux, "mux", "--", *spec.argv))
            intent = handles.intent(machine.backend, instance=instance, marker=tags.marker, session=tags.session)
            execution = await until_recorded(
                lambda: db(actions.begin_spawn)(execution, self.context.worker, token, intent, instance)
            )
            await faults.reached("launch.spawning")
            process = await backend.spawn(spec, tags, before_start=before_start, instance=instance)
        except SpawnError as error:
            # Proven: nothing started. A known outcome, said plainly.
            await db(actions.settle_execution)(
                execution,
                Outcome.spawn_failed(str(error)),
                worker=self.context.worker,
                token=token,
                snapshot=str(error).encode(),
            )
            return  # the session is closed with the reason; viewers read it when they attach
        try:
            await until_recorded(
                lambda: db(actions.save_handle)(execution.pk, self.context.worker, token, process.handle)
            )
            if (placed := process.handle.instance) and placed != instance:
                # It was made in another object than the one looked up (a tmux server restarted in between).
                execution = await until_recorded(
                    lambda: db(actions.begin_spawn)(execution, self.context.worker, token, process.handle, placed)
                )
            execution = await until_recorded(
                lambda: db(actions.fenced_transition)(
                    execution, State.RUNNING, worker=self.context.worker, token=token, evidence=Evidence.OBSERVED
                )
            )
        except actions.LeaseLost as error:
            await self._started_for_nobody(execution, process, error)
            return
        self.host.hold(execution, token, process, session, machine.backend)
        log.info("execution %s running on %s (%s)", execution.pk, machine.name, machine.backend)

    async def _integrate(self, spec, execution, token: int, session, backend, instance: str) -> SpawnSpec:
        """The shell integration (terminals.marks): its nonce, or why there is none, kept before the shell
        starts, so whoever holds the shell later reads its marks."""
        place = lambda path: backend.place_file(path, instance)  # noqa: E731
        try:
            spec, nonce, note = await marks.plan(spec, machine_tracks=execution.machine.track_commands, place=place)
        except Exception as error:  # the shell starts as given: tracking is never worth a launch
            log.warning("execution %s: no shell integration: %r", execution.pk, error)
            nonce, note = "", f"the shell integration could not be set up: {error}"
        pk, generation, worker = session.pk, session.generation, self.context.worker
        await until_recorded(lambda: db(actions.begin_marks)(pk, generation, worker, token, execution.pk, nonce, note))
        session.marks_nonce, session.marks_note = nonce, note
        return spec

    async def _started_for_nobody(self, execution: Execution, process, error: Exception) -> None:
        """We stalled while starting it and recovery took the lease meanwhile. If the new owner holds the
        process by its marker (adopted it, watches it), it is left to it; otherwise nobody observes it (its
        outcome was recorded without it, say unknown or never started): it is ours to end."""
        if await db(actions.lease_follows)(execution.pk, self.context.worker, process.handle.marker):
            log.warning("%s while starting it; its new owner holds it", error)
            await process.detach()
        else:
            log.warning("%s while starting it; nobody observes it, so it is ended", error)
            try:
                await process.terminate(grace=0.5)
            except Exception as failure:
                log.error("execution %s: could not end a process nobody observes: %r", execution.pk, failure)
