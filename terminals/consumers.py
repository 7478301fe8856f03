"""The browser's WebSocket: a thin bridge to the owner worker that holds the session's process.

Binary frames carry terminal bytes both ways; text frames carry JSON control messages with a ``type``
(docs/protocol.md). A frame is decoded here and handed to the viewer's stream (terminals.stream), which
says what to send; messages go to the worker through the one client of its protocol
(terminals.owner_client), and finding that worker and staying attached to it is the Attacher's
(terminals.attaching). Every task this consumer starts is its own and ends with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async as db
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model

from access.policy import Do, may
from config import logs
from terminals import actions, metrics
from terminals.attaching import Attacher
from terminals.models import TerminalSession
from terminals.owner_client import OwnerClient
from terminals.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    STRIKE_WINDOW_SECONDS,
    Attached,
    CloseCode,
    Closed,
    ClosingSoon,
    CommandSeen,
    ErrorCode,
    Exited,
    Gap,
    Grid,
    NextGeneration,
    Output,
    ProtocolError,
    Reason,
    Refusal,
    Superseded,
    Watchers,
    grid,
    integer,
)
from terminals.signals import ACCESS_GROUP
from terminals.stream import OBSERVER_WINDOW_BYTES, Deliver, FetchFrom, ViewerStream
from terminals.tasks import Tasks
from transport.layers import forget_channel, keep_receiving

log = logging.getLogger(__name__)

ACK_DELAY_SECONDS = 0.01  # an ack freeing little of the flow window waits this long for company


def _load_session(session_id: str, who) -> TerminalSession | None:
    """The session, when ``who`` (a user, or the API token the socket was opened with) may watch or use it."""
    session = TerminalSession.objects.select_related("machine", "execution", "user").filter(pk=session_id).first()
    if session is None or not (may(who, Do.USE, session) or may(who, Do.WATCH, session)):
        return None
    return session


class TerminalConsumer(AsyncWebsocketConsumer):
    async def __call__(self, scope, receive, send) -> None:
        self.tasks = Tasks()
        try:
            await super().__call__(scope, receive, send)
        finally:
            # However it ended (a disconnect, or an error inside a handler), nothing keeps acting for a
            # viewer who left: its checks stop, the worker hears it left (or it keeps that viewer's flow
            # window and stops reading the shell), and its channel leaves the user's group and Redis.
            try:
                await self._leave()
            except Exception as error:  # Redis away too: the worker's grace and owner checks cover it
                log.warning("viewer %s: could not leave cleanly: %r", getattr(self, "viewer_id", "?"), error)
            await forget_channel(getattr(self, "channel_layer", None), getattr(self, "channel_name", None))

    # Whether this socket only ever watches (a share link's): it cannot attach as the writer.
    read_only = False
    credential = None  # the API token it was opened with, if it was (set in connect)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # refused at the handshake (HTTP 403)
            return
        # An API client's socket is its token's (api/ws.py): ``credential.group`` and ``credential.ended()``.
        self.credential = self.scope.get("credential")
        self.session = await self.load_session(user)
        if self.session is None or (self.credential and self.session.user_id != user.pk):
            # Unknown or foreign: the same refusal, so ids cannot be probed. An API token reaches its own
            # user's shells only (watching another's is the page's, where its writer sees who watches).
            await self.close()
            return
        self.user = user
        self.username = user.get_username()
        # Another user's shell (staff who may watch it): only an explicit takeover writes into it.
        self.foreign = self.session.user_id != user.pk
        self.taken_over = False
        self.watching_noted = False
        self.told_read_only = 0.0
        self.viewer_id = uuid.uuid4().hex
        logs.bind(session=self.session.id, user=self.username, viewer=self.viewer_id)  # this socket's lines
        self.stream = ViewerStream()
        self.owner = OwnerClient(self.channel_layer, self.channel_name, self.viewer_id)
        self.attacher = Attacher(self, self.session.id, self.stream, self.owner, self.tasks)
        self.attacher.via = self.via
        self.strikes: list[float] = []
        await keep_receiving(self.channel_layer)
        await self.accept()
        # Logging out anywhere closes this socket (terminals.signals); the owner check catches a lost message.
        self.user_group = f"tether.user.{user.pk}"
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self.channel_layer.group_add(ACCESS_GROUP, self.channel_name)  # a label's grants taken away
        if self.credential:  # revoking the token closes this socket (api.tokens.revoke_token)
            await self.channel_layer.group_add(self.credential.group, self.channel_name)
        await self.connected()
        await self.send_json({"type": "hello", "session": str(self.session.id), "protocol": PROTOCOL_VERSION})
        log.info(
            "%s connected to session %s%s", self.username, self.session.id, " (API token)" if self.credential else ""
        )

    async def load_session(self, user) -> TerminalSession | None:
        who = await db(self.credential.token)() if self.credential else user
        return await db(_load_session)(self.scope["url_route"]["kwargs"]["session"], who)

    async def connected(self) -> None:
        """Accepted and in the user's group: anything more this kind of socket needs before ``hello``."""

    @property
    def via(self) -> str:
        if self.session.user_id == self.scope["user"].pk:
            return ""
        return "staff" if self.scope["user"].is_staff else "team"  # a teammate with watch, or staff

    async def dispatch(self, message: dict) -> None:
        """As channels' own, less its ``aclose_old_connections()`` before every handler: a hop to the
        database thread and back for each keystroke, ack and output chunk (an eighth of daphne's time
        in the echo profile, docs/benchmarks.md). This consumer reaches the database only through
        ``database_sync_to_async``, which closes stale connections around each call itself."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code) -> None:
        if getattr(self, "viewer_id", None):
            log.info("viewer %s left session %s (%s)", self.viewer_id, self.session.id, code)
        await self._leave()

    async def _leave(self) -> None:
        """Stop everything this viewer started; safe to call more than once."""
        await self.tasks.close()
        self._count_as(None)
        if getattr(self, "stream", None) is not None:
            await self.detach()
        if group := getattr(self, "user_group", None):
            self.user_group = None
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.channel_layer.group_discard(ACCESS_GROUP, self.channel_name)
            if self.credential:
                await self.channel_layer.group_discard(self.credential.group, self.channel_name)

    async def detach(self) -> None:
        """Attached no more, and the worker told at once: it keeps a departed writer's flow window a while,
        and stops listing a departed observer as watching."""
        if self.stream.attached:
            self.stream.leave()
            await self.owner.detach()

    # --- browser -> server -------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            if bytes_data is not None:
                await self._input(bytes_data)
            else:
                await self._control(text_data or "")
        except ProtocolError as error:
            await self._strike(str(error))

    async def _input(self, data: bytes) -> None:
        if len(data) > MAX_FRAME_BYTES:
            raise ProtocolError(f"input frame of {len(data)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
        if self.attacher.observing:
            await self._read_only("your keys were not sent")
            return
        if not self.stream.attached:
            raise ProtocolError("not attached yet: input was dropped (send an attach message first)")
        await self.owner.input(data, self.stream.next_input())

    async def _control(self, text: str) -> None:
        if len(text.encode()) > MAX_FRAME_BYTES:
            raise ProtocolError(f"control frame is over the {MAX_FRAME_BYTES}-byte limit")
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):  # nesting deeper than the parser goes is malformed too
            raise ProtocolError("malformed JSON in a control frame") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError("a control frame must be a JSON object with a string 'type'")
        handler = getattr(self, "client_" + message["type"], None)
        if handler is None:
            raise ProtocolError(f"unknown message type {message['type'][:40]!r}")
        await handler(message)

    async def _strike(self, text: str) -> None:
        now = time.monotonic()
        self.strikes = [t for t in self.strikes if now - t < STRIKE_WINDOW_SECONDS] + [now]
        await self.send_json({"type": "error", "code": ErrorCode.BAD_FRAME, "message": text})
        if len(self.strikes) > settings.TETHER_STRIKE_LIMIT:
            reason = Reason.POLICY_VIOLATION
            await self.send_json({"type": "closed", "reason": reason, "text": "too many bad frames"})
            await self.close(reason.close_code)

    async def _read_only(self, what: str) -> None:
        """An observer tried to write: said plainly (at most every 2 s), never counted as a bad frame."""
        now = time.monotonic()
        if now - self.told_read_only >= 2.0:
            self.told_read_only = now
            text = f"You are watching {self.session.user.get_username()}'s shell read-only: {what}"
            await self.send_json({"type": "error", "code": ErrorCode.READ_ONLY, "message": text})

    @staticmethod
    def _position(message: dict) -> tuple[int, int | None, int | None]:
        """Where an attach or observe asks to start: its offset, and the shell and owner's stream it is in."""
        since = integer(message.get("since", 0), "since")
        generation, epoch = message.get("generation"), message.get("epoch")
        generation = None if generation is None else integer(generation, "generation")
        return since, generation, None if epoch is None else integer(epoch, "epoch")

    async def client_observe(self, message: dict) -> None:
        """Watch read-only beside the writer: the stream and the writer's grid, no keys, no resize."""
        since, generation, epoch = self._position(message)
        if not self.watching_noted:
            await db(actions.note_observer)(self.session, self.user, self.via)
            self.watching_noted = True
        self.attacher.observing = True
        self.stream.window = OBSERVER_WINDOW_BYTES
        self.stream.want(since, generation, epoch)
        self.attacher.start()

    async def client_attach(self, message: dict) -> None:
        if self.read_only:
            raise ProtocolError("this link is read-only: send observe to watch")
        if not self.foreign and not await db(self.may_write)():
            raise ProtocolError("your role on this workspace is watch: you may watch this shell (observe)")
        if self.foreign and not await db(actions.may_take_over)(self.user, self.session):
            owner = self.session.user.get_username()
            raise ProtocolError(f"this is {owner}'s shell: you may watch it (observe), not write into it")
        if self.foreign and message["type"] != "takeover":
            owner = self.session.user.get_username()
            raise ProtocolError(f"this is {owner}'s shell: send takeover to write into it ({owner} is told)")
        if self.foreign and not self.taken_over:
            await db(actions.note_takeover)(self.session, self.user)
            self.taken_over = True
        since, generation, epoch = self._position(message)
        self.attacher.grid = grid(message)
        self.attacher.observing = False
        self.stream.window = None
        self.stream.want(since, generation, epoch)  # output meanwhile is replayed by the attach
        self.attacher.start()

    client_takeover = client_attach

    async def client_resize(self, message: dict) -> None:
        if self.attacher.observing:
            await self._read_only("an observer draws the writer's grid and never changes it")
            return
        size = grid(message)
        if size is None:
            raise ProtocolError("resize needs cols and rows")
        self.attacher.grid = size
        if self.stream.attached:
            await self.owner.resize(*size)

    async def client_reset(self, message: dict) -> None:
        if self.attacher.observing:
            await self._read_only("an observer cannot reset the shell")
            return
        if not self.stream.attached:
            raise ProtocolError("not attached: nothing to reset")
        # Who asked: the worker ends the shell and records the reset as its own act.
        await db(actions.session_event)(self.session, "reset_asked", actions.Actor.for_user(self.user), "from the page")
        await self.owner.reset()

    async def client_ack(self, message: dict) -> None:
        """Acks are coalesced: one goes on at once when it frees a good part of the flow window, else a
        short moment later. A keystroke's echo then costs one message each way, not two."""
        offset = integer(message.get("offset"), "ack offset")
        if self.attacher.observing:  # nothing upstream waits for an observer's acks
            if fetch := self.stream.caught_up(offset):
                await self.owner.resend(fetch.since)
            return
        now = self.stream.ack(offset)
        if now:
            await self._forward_ack()
        elif now is False and not self.tasks.has("ack"):
            self.tasks.start(self._forward_ack(ACK_DELAY_SECONDS), name="ack")

    async def _forward_ack(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
            self.tasks.done_with("ack")  # an ack arriving during the send below gets a timer of its own
        if (offset := self.stream.take_ack()) is not None:
            await self.owner.ack(offset)

    async def client_keepalive(self, message: dict) -> None:
        if self.stream.attached:
            await self.owner.keepalive()

    async def client_ping(self, message: dict) -> None:
        metrics.echo_samples(message.get("echo_ms"))  # the page's keystroke-echo samples, if it sent any
        await self.send_json({"type": "pong"})

    # --- worker -> browser -------------------------------------------------------------------

    async def terminal_attached(self, event: dict) -> None:
        message = Attached.decode(event)
        asked_from = None if self.stream.generation is None and self.stream.expected == 0 else self.stream.expected
        if not self.stream.confirmed(message):
            return  # a repeated delivery, or the answer to an attach this viewer has since replaced
        self._count_attach(message, asked_from)
        await self.send_json(message.to_browser())
        self.attacher.confirmed(message.end)
        if not self.foreign and not self.attacher.observing:
            # Someone else wrote into this shell while it was theirs (the page says it once).
            if taken := await db(actions.last_takeover)(self.session):
                await self.send_json({"type": "taken_over", **taken})

    async def terminal_output(self, event: dict) -> None:
        said = self.stream.output(Output.decode(event))
        if isinstance(said, Deliver):
            await self.send(bytes_data=said.data)
        elif isinstance(said, FetchFrom):
            await self.owner.resend(said.since)

    def _count_attach(self, message: Attached, asked_from: int | None) -> None:
        """The figures an operator watches (terminals/metrics.py): what this viewer is, how it came back."""
        if message.lost:
            result = "gap"
        elif message.screen:
            result = "snapshot"
        elif message.fresh:
            result = "fresh"
        else:
            result = "new" if asked_from is None else "resumed"
        metrics.RECONNECTS.labels(result).inc()
        metrics.REPLAYED.inc(max(message.end - message.offset, 0))
        metrics.LOST.inc(max(message.lost, 0))
        self._count_as(message.role)

    counted_role: str | None = None

    def _count_as(self, role: str | None) -> None:
        if role != self.counted_role:
            if self.counted_role:
                metrics.VIEWERS.labels(self.counted_role).dec()
            if role:
                metrics.VIEWERS.labels(role).inc()
            self.counted_role = role

    async def terminal_gap(self, event: dict) -> None:
        message = Gap.decode(event)
        if self.stream.gap(message):
            metrics.LOST.inc(max(message.lost, 0))
            await self.send_json({"type": "gap", "offset": message.offset, "lost": message.lost})

    async def terminal_error(self, event: dict) -> None:
        message = Refusal.decode(event)
        if message.code == ErrorCode.ATTACH_REFUSED and not self.stream.attached and self.attacher.retry_refused():
            return  # the page hears of it only if it never settles
        if message.code == ErrorCode.SUPERSEDED and self.attacher.following and not self.stream.attached:
            await self.superseded(None)  # followed its session to a new owner, where another window was first
            return
        if message.code == ErrorCode.NOT_WATCHING and self.attacher.observing:
            self.stream.leave()  # observe again, from where this viewer's stream is
            self.attacher.start()
            return
        await self.send_json({"type": "error", "code": message.code, "message": message.message})

    async def terminal_warning(self, event: dict) -> None:
        message = ClosingSoon.decode(event)
        if self.stream.current(message.epoch):
            await self.send_json({"type": "warning", "reason": message.reason, "seconds_left": message.seconds_left})

    async def terminal_command(self, event: dict) -> None:
        message = CommandSeen.decode(event)
        if self.stream.current(message.epoch):
            await self.send_json(message.to_browser())

    async def terminal_grid(self, event: dict) -> None:
        message = Grid.decode(event)
        if self.stream.current(message.epoch) and self.stream.attached:
            await self.send_json(message.to_browser())

    async def terminal_watchers(self, event: dict) -> None:
        message = Watchers.decode(event)
        if self.stream.current(message.epoch) and self.stream.attached:
            await self.send_json(message.to_browser())

    async def terminal_superseded(self, event: dict) -> None:
        message = Superseded.decode(event)
        if self.stream.current(message.epoch):
            await self.superseded(message.by)

    async def superseded(self, by: str | None) -> None:
        self.stream.leave()
        # Someone else writing into this user's shell is said so, by name; another window of theirs is not.
        text = f"Taken over by {by}" if by and by != self.username else "Superseded by another window"
        await self.send_json({"type": "superseded", "text": text, **({"by": by} if by != self.username else {})})
        # The close frame carries the reason too (transport/daphne_close.py: daphne 4 would drop it).
        await self.close(CloseCode.SUPERSEDED, reason=text)

    async def terminal_exit(self, event: dict) -> None:
        message = Exited.decode(event)
        if not self.stream.current(message.epoch):
            return  # from an owner this viewer has left behind
        await self.send_json(message.to_browser())
        if message.reason != Reason.RESET:
            self.stream.leave()
            await self.close(Reason.close_code_for(message.reason))

    async def terminal_generation(self, event: dict) -> None:
        message = NextGeneration.decode(event)
        if message.ended != self.stream.generation or not self.stream.current(message.epoch):
            return  # a repeated delivery: this viewer already moved on to the next generation
        self.stream.next_generation()
        await self.send_json({"type": "reset", "text": "Started a fresh session"})
        self.attacher.start()

    async def terminal_closed(self, event: dict) -> None:
        message = Closed.decode(event)
        if not self.stream.current(message.epoch):
            return  # from an owner this viewer has left behind
        self.stream.leave()
        await self.send_json({"type": "closed", "reason": message.reason, "text": message.text})
        await self.close(Reason.close_code_for(message.reason))

    async def user_logged_out(self, event: dict) -> None:
        await self.detach()
        reason = Reason.LOGGED_OUT
        await self.send_json({"type": "closed", "reason": reason, "text": "Signed out"})
        await self.close(reason.close_code)

    async def token_revoked(self, event: dict) -> None:
        await self.not_allowed("The API token this socket was opened with was revoked")

    def still_allowed(self) -> str:
        """ "" while this socket's user may still do what it does here; else why not, in their words. Asked
        at every owner check: an account deactivated, a permission taken away, or its API token revoked or
        expired, ends what it allowed."""
        user = get_user_model().objects.filter(pk=self.user.pk).first()
        if user is None or not user.is_active:
            return "This account was deactivated"
        if self.credential and (ended := self.credential.ended()):
            return f"The API token this socket was opened with was {ended}"
        who = self.credential.token() if self.credential else user
        session = self.fresh_session()  # its machine as it is now: a label taken off ends the grant on it
        if self.attacher.observing:
            return "" if may(who, Do.WATCH, session) else "You may no longer watch this shell"
        writes = may(who, Do.TAKE_OVER if self.foreign else Do.USE, session)
        return "" if writes else "You may no longer write into this shell"

    def fresh_session(self) -> TerminalSession:
        found = TerminalSession.objects.select_related("machine").filter(pk=self.session.pk).first()
        return found if found is not None else self.session

    def may_write(self) -> bool:
        who = self.credential.token() if self.credential else self.user
        return may(who, Do.USE, self.fresh_session())

    async def access_changed(self, event: dict) -> None:
        """Someone's access was narrowed (a grant, a group, a label): if it was this socket's right, it ends now."""
        if why := await db(self.still_allowed)():
            await self.not_allowed(why)

    async def not_allowed(self, why: str) -> None:
        await self.detach()
        reason = Reason.NOT_ALLOWED
        await self.send_json({"type": "closed", "reason": reason, "text": why})
        await self.close(reason.close_code)

    async def close(self, code=None, reason=None) -> None:
        # autobahn takes a close code only as a plain int, not an IntEnum member.
        await super().close(None if code is None or code is True else int(code), reason)

    async def send_json(self, data: dict) -> None:
        await self.send(text_data=json.dumps(data))
