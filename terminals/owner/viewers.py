"""How the owner worker serves viewers: attach, input, resize, acks, resends, detach and reset.

Messages arrive on the worker's own channel from viewers (terminals.owner_client); answers and output go
to the viewer's channel. Only the current viewer may type, resize or reset; a new attach supersedes the
old viewer.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async as db
from django.conf import settings

from config import logs
from executions import pipes
from terminals import actions, metrics
from terminals.models import ProcessState, TerminalSession, ends_with_worker
from terminals.owner.context import WorkerContext, receive_forever
from terminals.owner.leases import LeaseKeeper
from terminals.owner.live import OUTPUT_MESSAGE_BYTES, LiveProcess, Observer, Viewer
from terminals.protocol import (
    MAX_COLS,
    MAX_ROWS,
    Ack,
    ApiInput,
    ApiResize,
    Attach,
    Attached,
    Detach,
    Done,
    ErrorCode,
    Gap,
    Grid,
    Input,
    Keepalive,
    Message,
    Observe,
    Output,
    Peek,
    Peeked,
    ProtocolError,
    Reason,
    Refusal,
    Resend,
    ResetShell,
    Resize,
    Superseded,
    ToOwner,
    Watchers,
    decode_to_owner,
)
from terminals.signals import api_input_taken
from transport.layers import MessageTooLarge

log = logging.getLogger(__name__)


class Outbox:
    """Messages to viewers. A full or vanished channel is not an error here: the viewer resyncs by offset."""

    def __init__(self, context: WorkerContext):
        self.layer = context.layer

    async def send(self, channel: str, message: Message) -> bool:
        try:
            await self.layer.send(channel, message.encode())
        except Exception as error:
            log.info("could not reach viewer %s: %r", channel, error)
            metrics.LAYER_ERRORS.labels("worker_to_viewer").inc()
            return False
        return True

    async def to_viewer(self, live: LiveProcess, message: Message) -> None:
        """To the writer only."""
        if live.viewer is not None:
            await self.send(live.viewer.channel, message)

    async def to_observers(self, live: LiveProcess, message: Message) -> None:
        for observer in list(live.observers.values()):
            await self.send(observer.channel, message)

    async def to_all(self, live: LiveProcess, message: Message) -> None:
        """To the writer and every observer."""
        await self.to_viewer(live, message)
        await self.to_observers(live, message)

    async def output(self, live: LiveProcess, offset: int, data: bytes) -> None:
        """New output: to the writer first (its echo waits on no observer), then to every observer at once."""
        if live.viewer is not None:
            await self.output_to(live.viewer.channel, live, offset, data)
        if live.observers:
            channels = [observer.channel for observer in live.observers.values()]
            await asyncio.gather(*(self.output_to(channel, live, offset, data) for channel in channels))

    async def output_to(self, channel: str, live: LiveProcess, offset: int, data: bytes) -> None:
        """Output (a replay, a resend) to one viewer."""
        for start in range(0, len(data), OUTPUT_MESSAGE_BYTES):
            piece = data[start : start + OUTPUT_MESSAGE_BYTES]
            await self.send(channel, Output(offset + start, piece, live.token))

    async def watchers(self, live: LiveProcess) -> None:
        """Tell the writer and the observers who watches now."""
        said = tuple(observer.said() for observer in live.observers.values())
        await self.to_all(live, Watchers(said, live.token))


def _taken(claim: int) -> bool:
    """Whether the API input numbered by ``claim`` is ours to write (exactly one taker, or its sender giving
    it up, wins)."""
    answers = api_input_taken.send(sender=ViewerService, claim=claim)
    return bool(answers) and all(answer for _, answer in answers)


class ViewerService:
    """``host`` is the session host (terminals.owner.host): it ends or lets go of what a viewer's message
    says must end."""

    def __init__(self, context: WorkerContext, leases: LeaseKeeper, outbox: Outbox, host, others=None):
        self.context, self.leases, self.outbox, self.host = context, leases, outbox, host
        # Messages on the worker's channel about no process ({type: take(raw)}): taken at once, answered apart.
        self.others: dict = others or {}
        self.handlers = {
            Attach: self.on_attach,
            Observe: self.on_observe,
            Input: self.on_input,
            Keepalive: self.on_keepalive,
            Resize: self.on_resize,
            Ack: self.on_ack,
            Resend: self.on_resend,
            Detach: self.on_detach,
            ResetShell: self.on_reset,
            Peek: self.on_peek,
            ApiInput: self.on_api_input,
            ApiResize: self.on_api_resize,
        }

    async def run(self) -> None:
        await receive_forever(self.context.layer, self.context.channel, self.handle)

    async def handle(self, raw: dict) -> None:
        if (take := self.others.get(raw.get("type"))) is not None:
            take(raw)
            return
        try:
            message = decode_to_owner(raw)
        except ProtocolError as error:
            log.warning("dropped a message: %s", error)
            return
        if not await self.leases.confirmed():
            # Woken after a long stall, our leases may have passed to another worker: act on nothing we
            # cannot vouch for.
            log.warning("leases unconfirmed; dropping a %s", message.TYPE)
            return
        with logs.bound(execution=message.execution):
            try:
                await self.handlers[type(message)](message)
            except Exception:
                log.exception("handling %s failed", message.TYPE)

    def _held(self, message: ToOwner) -> LiveProcess | None:
        return self.context.live.get(message.execution)

    def _viewing(self, message: ToOwner) -> LiveProcess | None:
        """The process the message is about, when its sender is that process's current viewer."""
        live = self._held(message)
        return live if live and live.viewer and live.viewer.viewer_id == message.viewer else None

    async def _refuse(self, message: ToOwner, code: ErrorCode, text: str) -> None:
        await self.outbox.send(message.reply, Refusal(code, text))

    async def _writer(self, message: ToOwner, *, while_closing: bool) -> LiveProcess | None:
        """The process the message writes to, when its sender is that process's viewer; otherwise the
        sender is told why not, and None. Input to a closing process is refused; a reset of one is not."""
        live = self._held(message)
        if live is None or (live.closing and not while_closing):
            await self._refuse(message, ErrorCode.NOT_HELD, "the session is not running")
        elif live.viewer is None or live.viewer.viewer_id != message.viewer:
            await self._refuse(message, ErrorCode.SUPERSEDED, "another window owns this session")
        else:
            return live
        return None

    async def on_attach(self, message: Attach) -> None:
        live = self._held(message)
        if live is None or live.closing:
            await self._refuse(message, ErrorCode.ATTACH_REFUSED, "this worker does not hold that session")
            return
        old = live.viewer
        if old and message.attach is not None and (old.viewer_id, old.attach_id) == (message.viewer, message.attach):
            return  # the same attach delivered twice: it was answered already
        if message.follow and old and old.viewer_id != message.viewer and await self._recorded_as(live, old.viewer_id):
            # A socket following its session here after its owner changed, and another window attached
            # first (and is the session's viewer on record, not one whose leaving was lost on the way): that
            # window, opened by a person, keeps it (CI, stop 49: the follower took it back).
            await self._refuse(message, ErrorCode.SUPERSEDED, "another window attached while this one followed")
            return
        if live.session_id:
            # Recorded first: a superseded window that misses the message below finds out from the
            # database on its next owner check, and the new one never sees itself as superseded.
            try:
                held = await db(actions.note_viewer)(live.session_id, self.context.worker, live.token, message.viewer)
            except Exception as error:  # the database is away: the message below still tells the old one
                log.info("could not record the new viewer: %r", error)
            else:
                if not held:  # our lease moved on: let go now; the viewer looks for the new owner
                    await self._refuse(message, ErrorCode.ATTACH_REFUSED, "this worker no longer holds that session")
                    await self.host.let_go(live, "lease lost")
                    return
        if old and old.viewer_id != message.viewer:
            await self.outbox.send(old.channel, Superseded(live.token, message.by))
        was_watching = live.observers.pop(message.viewer, None) is not None  # an observer taking over
        if message.by and live.writer_name and message.by != live.writer_name:
            self.host.recorder.marker(live, f"{message.by} writes into the shell from here on")
        live.writer_name = message.by or live.writer_name
        cols, rows = message.cols, message.rows
        if isinstance(cols, int) and isinstance(rows, int) and 1 <= cols <= MAX_COLS and 1 <= rows <= MAX_ROWS:
            await self._regrid(live, cols, rows)
        async with live.send_lock:
            first, data, lost, screen, fresh = await self._replay(live, message)
            live.viewer = Viewer(
                channel=message.reply,
                viewer_id=message.viewer,
                attach_id=message.attach,
                input_seq=old.input_seq if old and old.viewer_id == message.viewer else 0,
            )
            live.acked = first
            live.touch()
            await self.outbox.send(message.reply, self._attached(live, message, first, data, lost, screen, fresh))
            await self.outbox.output_to(message.reply, live, first, data)
        live.update_flow()
        if was_watching:
            await self.outbox.watchers(live)

    async def _recorded_as(self, live: LiveProcess, viewer_id: str) -> bool:
        """Whether ``viewer_id`` is the session's viewer on record (the database away: taken as it)."""
        if not live.session_id:
            return True
        try:
            return await db(_recorded_viewer)(live.session_id) == viewer_id
        except Exception as error:
            log.info("could not read the session's viewer: %r", error)
            return True

    async def on_observe(self, message: Observe) -> None:
        live = self._held(message)
        if live is None or live.closing:
            await self._refuse(message, ErrorCode.ATTACH_REFUSED, "this worker does not hold that session")
            return
        old = live.observers.get(message.viewer)
        if old and message.attach is not None and old.attach_id == message.attach:
            return  # the same attach delivered twice: it was answered already
        if live.viewer and live.viewer.viewer_id == message.viewer:
            live.viewer_left()  # the writer's own window steps back to watching
        async with live.send_lock:
            first, data, lost, screen, fresh = await self._replay(live, message)
            live.observers[message.viewer] = Observer(
                channel=message.reply, viewer_id=message.viewer, name=message.by, via=message.via,
                attach_id=message.attach,
            )  # fmt: skip
            attached = self._attached(live, message, first, data, lost, screen, fresh, role="observer")
            await self.outbox.send(message.reply, attached)
            await self.outbox.output_to(message.reply, live, first, data)
        if old is None:
            await self.outbox.watchers(live)

    async def _replay(self, live: LiveProcess, message: Attach | Observe) -> tuple[int, bytes, int, bytes | None, bool]:
        """What a viewer attaching from ``message.since`` is sent first: (first offset, the bytes from there,
        bytes lost before them, the screen as it is now when that beats a torn tail, whether the same
        shell's stream restarted under this owner). Called under the send lock."""
        # Offsets count within one owner's stream (its epoch: the lease token). After a tmux adoption the
        # stream restarts with the screen as it is, so a cursor from the old owner means nothing here; a
        # holder's offsets are the same for every owner, so the viewer's cursor still holds.
        same_epoch = (message.epoch or 1) == live.token or live.process.offsets_survive_owner
        same_stream = message.generation == live.generation and same_epoch
        asked = max(int(message.since or 0), 0)
        since = asked if same_stream else 0
        first, data, lost = live.buffer.since(since)
        screen = None
        # The screen as adopted was drawn for the grid the shell had then: a viewer that would replay it
        # gets the screen as it is now, after the resize above, drawn for its own grid.
        redraw = bool(live.adopted_screen) and live.buffer.start == 0 and first < live.adopted_screen
        if (lost or redraw) and live.process.can_snapshot:
            # tmux knows the screen as it is now: a labelled fresh screen beats a torn tail.
            try:
                screen = (await live.process.snapshot()).render()
                if len(screen) > settings.TETHER_LAYER_MESSAGE_BYTES - 64 * 1024:  # room for the rest
                    raise MessageTooLarge(f"a screen of {len(screen)} bytes")
            except Exception as error:  # fall back to the retained tail
                log.info("execution %s: no snapshot (%r); replaying the tail", live.execution_pk, error)
                screen = None
            else:
                lost = live.buffer.end - since if lost else 0
                first, data = live.buffer.end, b""
        fresh = message.generation == live.generation and not same_stream and asked > 0
        return first, data, lost, screen, fresh

    def _attached(self, live: LiveProcess, message, first, data, lost, screen, fresh, role="writer") -> Attached:
        return Attached(
            attach=message.attach,
            offset=first,
            end=first + len(data),
            lost=lost,
            generation=live.generation,
            epoch=live.token,
            execution=live.execution_pk,
            # The viewer's screen is of this shell, but the stream restarted (adopted): redraw it.
            screen=screen,
            fresh=fresh,
            process_state=ProcessState.LIVE,
            ends_with_worker="" if live.process.survives_owner else ends_with_worker(live.process.handle),
            tracked=live.marks_seen,
            role=role,
            cols=live.grid[0],
            rows=live.grid[1],
            observers=tuple(observer.said() for observer in live.observers.values()),
        )

    async def _regrid(self, live: LiveProcess, cols: int, rows: int) -> None:
        """The writer's grid: the process is resized; a change is recorded and told to the observers, at the
        offset from which output is drawn for it."""
        # Under the send lock: output read before the new grid reaches the observers before the word of it.
        async with live.send_lock:
            await live.process.resize(cols, rows)
            if (cols, rows) == live.grid:
                return
            live.grid = (cols, rows)
            self.host.recorder.resize(live, cols, rows)
            await self.outbox.to_observers(live, Grid(live.buffer.end, cols, rows, live.token))

    async def on_input(self, message: Input) -> None:
        if (live := await self._writer(message, while_closing=False)) is None:
            return
        if isinstance(message.seq, int):
            if message.seq <= live.viewer.input_seq:
                log.info("execution %s: input %s delivered twice; not written again", live.execution_pk, message.seq)
                return
            live.viewer.input_seq = message.seq
        live.touch()
        await self.host.commands.typed(live, message.data)
        await live.process.write(message.data)
        self.host.recorder.input(live, message.data)

    async def on_keepalive(self, message: Keepalive) -> None:
        if not message.observing:
            if live := self._viewing(message):
                live.touch()
            return
        live = self._held(message)
        if live is not None and (observer := live.observers.get(message.viewer)):
            observer.seen = time.monotonic()  # still watching (which keeps no shell from its idle close)
        elif live is not None and not live.closing:
            # Forgotten (silent too long: its messages were lost, or ours were dropped in an outage).
            await self._refuse(message, ErrorCode.NOT_WATCHING, "this worker no longer lists you as watching")

    async def on_resize(self, message: Resize) -> None:
        if (live := self._viewing(message)) and not live.closing:
            await self._regrid(live, message.cols, message.rows)

    async def on_ack(self, message: Ack) -> None:
        if live := self._held(message):
            live.ack(message.viewer, int(message.offset))

    async def on_resend(self, message: Resend) -> None:
        live = self._held(message)
        if live is None or not (self._viewing(message) or message.viewer in live.observers):
            return
        async with live.send_lock:
            first, data, lost = live.buffer.since(int(message.since))
            if lost:
                await self.outbox.send(message.reply, Gap(first, lost, live.token))
            await self.outbox.output_to(message.reply, live, first, data)

    async def on_detach(self, message: Detach) -> None:
        if (live := self._held(message)) and live.observers.pop(message.viewer, None) is not None:
            await self.outbox.watchers(live)
            return
        if live := self._viewing(message):
            live.viewer_left()
            if live.session_id and not await db(actions.note_viewer)(live.session_id, self.context.worker, live.token):
                await self.host.let_go(live, "lease lost")

    async def on_reset(self, message: ResetShell) -> None:
        if live := await self._writer(message, while_closing=True):
            await self.host.end(live, Reason.RESET)

    # --- API clients: a read, keys or a grid, each answered once on the message's own reply channel -------

    async def _api_target(self, message: ToOwner, by: str | None = None) -> LiveProcess | None:
        """The running process an API client's message is about; otherwise it is answered why not. With
        ``by`` (keys, a grid): refused while another person's window is the writer, and while a window is
        the writer for a grid (the window sets it)."""
        live = self._held(message)
        if live is None or live.closing:
            await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_HELD, "the process is not running here"))
            return None
        if by is not None and live.viewer is not None and live.writer_name and live.writer_name != by:
            text = f"{live.writer_name} is writing into this shell from an open window"
            await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_WRITER, text))
            return None
        return live

    async def on_peek(self, message: Peek) -> None:
        if (live := await self._api_target(message)) is None:
            return
        size = min(max(int(message.size), 0), OUTPUT_MESSAGE_BYTES)
        if message.view:
            await self.outbox.send(message.reply, self._peek_view(live, message))
            return
        async with live.send_lock:
            first, data, lost = live.buffer.since(max(int(message.since), 0))
            live.read_by(message.viewer, first)
            peeked = Peeked(
                offset=first,
                data=data[:size],
                start=live.buffer.start,
                end=live.buffer.end,
                lost=lost,
                generation=live.generation,
                epoch=live.token,
                survives=live.process.offsets_survive_owner,
                written=live.process.written_at_attach,
                cols=live.grid[0],
                rows=live.grid[1],
            )
        await self.outbox.send(message.reply, peeked)

    @staticmethod
    def _peek_view(live: LiveProcess, message: Peek) -> Peeked:
        """A read of a command on pipes: the encoded stream from the first whole line of the view with bytes
        at or after ``since`` (its own offsets), and where the view's kept bytes start and end."""
        try:
            view = pipes.View(message.view)
        except ValueError:
            view = pipes.View.ALL
        if live.pipes_index is None:
            live.pipes_index = pipes.Index()
        start = live.buffer.start
        found = live.pipes_index.update(live.buffer.since, start)
        bounds = pipes.first_and_end(found, view, whole=start == 0)
        piece = pipes.starting_at(found, view, max(int(message.since), 0))
        at = piece.at if piece is not None else live.buffer.end
        live.read_by(message.viewer, at)
        # Whole lines from ``at`` (``size`` counts the bytes read out of them: the API's read cuts to it).
        _, data, _ = live.buffer.since(at)
        return Peeked(
            offset=at,
            data=data[:OUTPUT_MESSAGE_BYTES],
            start=live.buffer.start,
            end=live.buffer.end,
            lost=0,
            generation=live.generation,
            epoch=live.token,
            survives=live.process.offsets_survive_owner,
            written=live.process.written_at_attach,
            view_first=bounds[0] if bounds else -1,
            view_end=bounds[1] if bounds else -1,
        )

    async def on_api_input(self, message: ApiInput) -> None:
        if (live := await self._api_target(message, by=message.by)) is None:
            return
        key = (message.viewer, int(message.seq))
        if key not in live.api_written:
            if message.claim and not await db(_taken)(message.claim):
                # Given up by its sender (no answer came in time): it was told nothing was written.
                text = "this input was given up before it was taken; send it again"
                await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_HELD, text))
                return
            live.api_written[key] = True
            while len(live.api_written) > 4096:  # the oldest go: a retry comes within seconds, not hours
                live.api_written.pop(next(iter(live.api_written)))
            if message.by and live.writer_name and message.by != live.writer_name:
                self.host.recorder.marker(live, f"{message.by} writes into the shell from here on")
            live.writer_name = message.by or live.writer_name
            live.touch()
            await self.host.commands.typed(live, message.data)
            await live.process.write(message.data)
            self.host.recorder.input(live, message.data)
        else:
            log.info("execution %s: API input %s delivered twice; not written again", live.execution_pk, key)
        await self.outbox.send(message.reply, Done(True))

    async def on_api_resize(self, message: ApiResize) -> None:
        if (live := await self._api_target(message, by="")) is None:
            return
        if live.viewer is not None:
            text = "an open window is the writer and sets the grid"
            await self.outbox.send(message.reply, Done(False, ErrorCode.NOT_WRITER, text))
            return
        if not (1 <= message.cols <= MAX_COLS and 1 <= message.rows <= MAX_ROWS):
            await self.outbox.send(message.reply, Done(False, ErrorCode.BAD_FRAME, "the grid is out of range"))
            return
        await self._regrid(live, message.cols, message.rows)
        await self.outbox.send(message.reply, Done(True))


def _recorded_viewer(session_id: str) -> str | None:
    return TerminalSession.objects.filter(pk=session_id).values_list("viewer_id", flat=True).first()
