"""How the owner worker serves viewers: attach, input, resize, acks, resends, detach and reset.

Messages arrive on the worker's own channel from viewers (terminals.owner_client); answers and output go
to the viewer's channel. Only the current viewer may type, resize or reset; a new attach supersedes the
old viewer.
"""

from __future__ import annotations

import logging
import time

from channels.db import database_sync_to_async as db

from config import logs
from terminals import actions
from terminals.models import TerminalSession
from terminals.owner.api_clients import ApiClients
from terminals.owner.context import WorkerContext, receive_forever
from terminals.owner.host import SessionHost
from terminals.owner.leases import LeaseKeeper
from terminals.owner.live import LiveProcess, Observer, Viewer
from terminals.owner.outbox import Outbox
from terminals.owner.replay import replay_for
from terminals.owner.writes import Writes
from terminals.protocol import (
    MAX_COLS,
    MAX_ROWS,
    Ack,
    Attach,
    Detach,
    ErrorCode,
    Gap,
    Input,
    Keepalive,
    Observe,
    ProtocolError,
    Reason,
    Refusal,
    Resend,
    ResetShell,
    Resize,
    Role,
    Superseded,
    ToOwner,
    decode_to_owner,
)

log = logging.getLogger(__name__)


class ViewerService:
    """``host`` ends or lets go of what a viewer's message says must end; its command tracker and recorder
    see what a writer writes."""

    def __init__(self, context: WorkerContext, leases: LeaseKeeper, outbox: Outbox, host: SessionHost, others=None):
        self.context, self.leases, self.outbox, self.host = context, leases, outbox, host
        self.writes = Writes(host.commands, host.recorder, outbox)
        self.api = ApiClients(context, outbox, self.writes)  # the API's reads, keys and grids
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
            **self.api.handlers,
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
        self.writes.writer(live, message.by)
        cols, rows = message.cols, message.rows
        if isinstance(cols, int) and isinstance(rows, int) and 1 <= cols <= MAX_COLS and 1 <= rows <= MAX_ROWS:
            await self.writes.grid(live, cols, rows)
        async with live.send_lock:
            replay = await replay_for(live, message, self.context.config.layer_message_bytes)
            live.viewer = Viewer(
                channel=message.reply,
                viewer_id=message.viewer,
                attach_id=message.attach,
                input_seq=old.input_seq if old and old.viewer_id == message.viewer else 0,
            )
            live.acked = replay.first
            live.touch()
            await self.outbox.send(message.reply, replay.attached(live, message))
            await self.outbox.output_to(message.reply, live, replay.first, replay.data)
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
            replay = await replay_for(live, message, self.context.config.layer_message_bytes)
            live.observers[message.viewer] = Observer(
                channel=message.reply, viewer_id=message.viewer, name=message.by, via=message.via,
                attach_id=message.attach,
            )  # fmt: skip
            await self.outbox.send(message.reply, replay.attached(live, message, role=Role.OBSERVER))
            await self.outbox.output_to(message.reply, live, replay.first, replay.data)
        if old is None:
            await self.outbox.watchers(live)

    async def on_input(self, message: Input) -> None:
        if (live := await self._writer(message, while_closing=False)) is None:
            return
        if isinstance(message.seq, int):
            if message.seq <= live.viewer.input_seq:
                log.info("execution %s: input %s delivered twice; not written again", live.execution_pk, message.seq)
                return
            live.viewer.input_seq = message.seq
        await self.writes.keys(live, message.data)

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
            await self.writes.grid(live, message.cols, message.rows)

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


def _recorded_viewer(session_id: str) -> str | None:
    return TerminalSession.objects.filter(pk=session_id).values_list("viewer_id", flat=True).first()
