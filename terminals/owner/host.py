"""The session host: holds started processes, supervises them to their end, and settles how they ended.

A held process has one supervisor task: it pumps output to the buffer and the viewer (while the leases
provably stand), observes the exit, and records it. Ending a process on purpose (a request, a lifetime, a
reset, shutdown) marks why, ends the tree, and leaves the recording to the supervisor, so every end is
recorded in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace

from channels.db import database_sync_to_async as db

from config import logs
from executions import pipes
from executions.models import Backend as BackendKind
from executions.models import Execution, Kind, State
from executions.spec import ExecutionSpec
from recordings.recorder import Recorder
from terminals import actions, faults
from terminals.backends.base import Exit, Process
from terminals.lifetimes import Limits
from terminals.marks import MarkReader
from terminals.models import TerminalSession
from terminals.outcome import ENDED_BY_US, Outcome
from terminals.owner.capture import Capture, PipesCapture, Saver
from terminals.owner.commands import CommandTracker
from terminals.owner.context import WorkerContext, until_recorded
from terminals.owner.leases import LeaseKeeper
from terminals.owner.live import LiveProcess, Phase
from terminals.owner.outbox import Outbox
from terminals.owner.screens import keep_screen, last_screen
from terminals.protocol import Closed, Exited, NextGeneration, Reason, Request
from terminals.wake import WAKE_CHANNEL

log = logging.getLogger(__name__)


class SessionHost:
    def __init__(self, context: WorkerContext, leases: LeaseKeeper, outbox: Outbox):
        self.context, self.leases, self.outbox = context, leases, outbox
        self.recorder = Recorder(context)
        self.commands = CommandTracker(context, outbox, self.recorder)

    def hold(
        self,
        execution: Execution,
        token: int,
        process: Process,
        session: TerminalSession | None,
        backend: str,
        screen=b"",
        adopted: bool = False,
    ) -> None:
        """Hold ``process`` (on ``backend``) under ``token``: its output pump, buffer and viewer. ``screen``
        starts the buffer (an adopted shell's stream begins with its screen as it is); ``adopted``: taken
        over from a dead or stopped owner."""
        spec = ExecutionSpec.from_json(execution.spec)
        live = LiveProcess(
            execution_pk=execution.pk,
            token=token,
            kind=execution.kind,
            process=process,
            config=self.context.config,
            session_id=str(session.id) if session else None,
            generation=session.generation if session else 0,
            handle_backend=backend,
            limits=Limits(spec.idle_seconds, spec.session_seconds, spec.output_limit_bytes),
            budget=self.context.budget,
            grid=(spec.cols, spec.rows),
        )
        if session and session.marks_nonce:
            live.marks = MarkReader(session.marks_nonce)
            live.marks_seen = session.marks_generation == session.generation  # an adopted shell's, seen before
            kept = session.marks_history or {}
            # Only where offsets go on across owners (a holder's stream): a tmux owner's stream starts at 0 again.
            same = kept.get("generation") == session.generation and "end" in kept
            if adopted and same and process.offsets_survive_owner:
                live.marks.resume(kept)
        live.adopted = adopted
        if screen:
            live.buffer.append(screen)
            live.adopted_screen = len(screen)
        # A held stream resumed by a new owner goes on at the holder's offsets: viewers keep their place.
        live.buffer.start = live.acked = process.stream_origin
        if not adopted or (live.buffer.start == 0 and not screen):
            live.whole_from = live.buffer.start
        live.grids.append((live.buffer.start, *live.grid))
        if live.session_id and not process.can_snapshot:
            keep_screen(self.context.screens, live, process, adopted)
        if adopted and process.offsets_survive_owner:
            # Its viewer, or an API client reading its output, is on its way back: keep the window it left, as
            # for a viewer that just went away, so the holder's output waits for it instead of running past
            # its offset (a caught-up API reader lost 130 to 770 KB at each worker kill).
            live.viewer_gone_at = time.monotonic()
            # A shell's page may come back after an API reader: it keeps its window until the grace ends. A
            # command has no page: its first reader back is who the window waited for.
            live.kept_for_return = live.session_id is None
        self.context.live[execution.pk] = live
        live.pump_task = self.context.tasks.start(self._supervise(live, execution, screen))

    async def record_unknown(self, execution: Execution, token: int, reason: str) -> None:
        """No trustworthy exit can be had: unknown (controller_lost), the slot kept, the session closed."""
        await db(actions.settle_execution)(execution, Outcome.unknown(reason), worker=self.context.worker, token=token)

    # --- supervising -------------------------------------------------------------------------

    async def _supervise(self, live: LiveProcess, execution: Execution, screen: bytes = b"") -> None:
        logs.bind(execution=live.execution_pk, session=live.session_id)  # this task's lines are about it
        command = live.kind == Kind.COMMAND
        capture = capture_of(live, execution)
        saver = Saver(self.context, live, capture)

        async def deliver(offset: int, data: bytes) -> None:
            if not await self._still_owner(live):
                raise actions.LeaseLost(f"execution {live.execution_pk}: lease lost while the worker stalled")
            if command:
                capture.add(offset, data)
                saver.poke()  # saved while it runs: a worker lost now leaves what it saw
            await self.outbox.output(live, offset, data)
            marks = self.commands.read(live, offset, data)
            # Each command's marker at the very byte its output starts, so a jump to it shows none of it yet.
            self.recorder.output(live, offset, data, self.commands.labels(marks))
            # After the output is on its way: a command's record never holds back what it printed.
            await self.commands.record(live, marks)

        try:
            await self.recorder.begin(live, screen)
            await live.pump(deliver)
            exit = await live.observe_exit()
            await self.recorder.flush_last(live)  # while the lease, which fences it, is still ours
            # No longer a live process of ours: the heartbeat must not mistake the lease it is about
            # to release for a lost one.
            self.context.live.pop(live.execution_pk, None)
            saver.stop()
            output = bytes(capture.data), capture.start
            behind = capture.by_offset and isinstance(capture, Capture)  # (on pipes each stream's tail is kept)
            if behind and (unread := live.unread_from()) is not None and unread < output[1]:
                # An API reader is further back than the record keeps: it keeps what the reader has to come.
                first, data, _ = live.buffer.since(unread)
                output = data, first
            complete = capture.complete and not live.lost_observation
            await until_recorded(lambda: self._settle(live, execution, exit, *output, complete))
            await faults.reached("settle.recorded")
            if live.recording is not None:
                await self.recorder.finish(live.recording.pk)
            if live.handle_backend == BackendKind.TMUX and not live.ended_for:
                # The dead pane only held the exit status, which is now recorded: remove the session.
                await live.process.terminate(grace=0.5)
            await live.process.release()  # a holder kept the exit until now
            if (handle := getattr(live.process, "handle", None)) is not None and handle.held:
                # Let go: recovery need not look for it (a crash before this line leaves it to recovery's sweep).
                with contextlib.suppress(Exception):
                    await db(actions.note_holder_ended)(live.execution_pk)
        except actions.LeaseLost as error:
            log.warning("%s; letting go", error)
            await self.let_go(live, "lease lost")
        except Exception:  # its lease stays: recovery settles it when the lease expires, honestly
            log.exception("supervising execution %s failed", execution.pk)
        finally:
            saver.stop()
            self.context.live.pop(live.execution_pk, None)
            live.forget_flow()
            if live.screen is not None:
                live.screen.close()

    async def _still_owner(self, live: LiveProcess) -> bool:
        """Output waits until the leases are confirmed (after a stall), so two owners never act on one
        session; then whether this process is still ours."""
        while not await self.leases.confirmed():
            await asyncio.sleep(0.5)
        return self.context.live.get(live.execution_pk) is live

    async def _settle(
        self, live: LiveProcess, execution, exit: Exit | None, output: bytes, truncated: int, complete: bool = True
    ) -> None:
        outcome = Outcome.of(exit, ended_for=live.ended_for, lost=live.lost_observation)
        if not execution.spec.get("pty", True) and exit is not None and exit.code in (126, 127):
            if why := pipes.not_started(live.buffer.tail(4096)):  # the mux said its program never ran
                outcome = Outcome.spawn_failed(why)
        asked = await db(actions.closed_by)(execution.pk) if live.handled_request else {}
        if asked.get("why") and outcome.close_reason in ENDED_BY_US:  # why it was asked, kept with how it ended
            outcome = replace(outcome, note=f"{outcome.note} ({asked['action']}: {asked['why']})")
        command = live.kind == Kind.COMMAND
        reset = outcome.close_reason == Reason.RESET
        screen = await last_screen(self.context.screens, live) if live.session_id else None  # bounded: never fails
        execution = await db(actions.settle_execution)(
            execution,
            outcome,
            worker=self.context.worker,
            token=live.token,
            snapshot=live.buffer.tail(64 * 1024),
            screen=screen,
            output_offset=live.buffer.end,
            restart_session=bool(live.session_id) and reset,
            output=output if command else None,
            output_truncated=truncated,
            output_complete=complete,
        )
        log.info("execution %s %s: %s", execution.pk, execution.state, execution.outcome_label)
        if live.viewer or live.observers:
            # The outcome's reason, not the one we ended it for: an end not observed is controller_lost (4014).
            told = Exited.of(
                execution, reason=outcome.close_reason, generation=live.generation, epoch=live.token, asked=asked
            )
            await self.outbox.to_all(live, told)
        if live.session_id and reset and execution.state == State.COMPLETED:
            # The reset's next generation is pending (settle_execution started it): claim it, tell the viewer.
            try:
                await self.context.layer.send(WAKE_CHANNEL, {"type": "wake"})
            except Exception as error:  # Redis away: the claim loop's poll finds the pending one anyway
                log.info("could not wake the workers: %r", error)
            await self.outbox.to_all(live, NextGeneration(ended=live.generation, epoch=live.token))

    # --- ending and letting go ---------------------------------------------------------------

    async def end(self, live: LiveProcess, reason: Reason) -> None:
        """End a held process tree on purpose; the supervisor records how it ended."""
        if not live.advance(Phase.CLOSING):
            return
        live.ended_for = reason
        live.update_flow()  # a closing session reads on to EOF
        try:
            # Many at a time, not all: the trees ended at once share their passes over the host's processes.
            async with self.context.ending:
                await live.process.terminate(grace=1.0)
        except Exception as error:  # cannot prove it gone: the supervisor records unknown
            live.lost_observation = f"terminate failed: {error!r}"
        if live.pump_task:
            await asyncio.wait([live.pump_task], timeout=15)

    async def let_go(self, live: LiveProcess, why: str) -> None:
        """Stop observing without touching the process or writing anything about it."""
        if not live.advance(Phase.LET_GO):
            return
        self.context.live.pop(live.execution_pk, None)
        if live.screen is not None:
            live.screen.close()
        if live.pump_task and live.pump_task is not asyncio.current_task():
            live.pump_task.cancel()
        await self.outbox.to_all(live, Closed(Reason.LET_GO, why, live.token))
        await live.process.detach()

    async def beaten(self, held: dict[int, tuple[int, str]]) -> None:
        """After a heartbeat: let go of what another worker now holds; carry out what was requested."""
        for live in list(self.context.live.values()):
            token, request = held.get(live.execution_pk, (None, ""))
            if token != live.token:
                log.warning("execution %s: lease lost; letting go", live.execution_pk)
                await self.let_go(live, "lease lost")
            elif request and request != live.handled_request:
                live.handled_request = request
                log.info("execution %s: %s requested", live.execution_pk, request)
                self.context.tasks.start(self.end(live, Request(request).reason))

    async def shutdown(self) -> None:
        """Let go of what a later owner can take over: held shells (a session holder keeps them), tmux
        sessions (adopted, screen and all) and docker commands (docker keeps the exec and reports its exit
        to whoever inspects it next). A shell this worker holds itself (no holder: a plain local PTY or
        docker exec) cannot be observed again by anyone: it is ended here, proven gone, and recorded.
        Sessions already ending (an operator's Kill, a lifetime) are waited for too."""
        held = list(self.context.live.values())
        for live in held:
            later = live.process.survives_owner or (
                live.handle_backend == BackendKind.DOCKER and live.kind == Kind.COMMAND
            )
            if later:
                await self.recorder.flush(live)  # the next owner goes on from what was written
                await self.let_go(live, "left running for a later owner")
            else:
                await self.end(live, Reason.SERVER_RESTART)
        ending = [live.pump_task for live in held if live.pump_task and live.phase is not Phase.LET_GO]
        if ending:
            await asyncio.wait(ending, timeout=15)


def capture_of(live: LiveProcess, execution: Execution) -> Capture:
    """Where a command's capture starts: empty for a fresh one; an adopted one goes on from its record (what its
    earlier owner saved), joined by offset to what a holder resends, else after it and not complete."""
    limit = live.config.command_output_bytes
    kind = Capture if execution.spec.get("pty", True) else PipesCapture  # on pipes: each stream's tail kept
    if not live.adopted or live.kind != Kind.COMMAND:
        return kind(limit, start=live.buffer.end)
    saved, first = bytes(execution.output or b""), execution.output_truncated
    return kind(limit, start=first, data=saved, by_offset=live.process.offsets_survive_owner)
