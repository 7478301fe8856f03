"""The browser's WebSocket: a thin bridge to the owner worker that holds the session's process.

Binary frames carry terminal bytes both ways; text frames carry JSON control messages with a ``type``
(docs/protocol.md). A frame is decoded here and handed to the viewer's stream (terminals.stream), which
says what to send; messages go to the worker through the one client of its protocol
(terminals.owner_client), and finding that worker and staying attached to it is the Attacher's
(terminals.attaching). Every task this consumer starts is its own and ends with it.
"""

from __future__ import annotations

import logging
import uuid

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async as db
from channels.generic.websocket import AsyncWebsocketConsumer

from access.policy import Do, may
from config import logs
from terminals import actions, metrics
from terminals.attaching import Attacher, Draw, End, NotAllowed, Replaced, SignedOut, Tell, Verdict, Viewer
from terminals.frames import PageFrames, Right
from terminals.models import TerminalSession
from terminals.owner_client import OwnerClient
from terminals.protocol import (
    PROTOCOL_VERSION,
    Attached,
    CloseCode,
    Closed,
    ClosingSoon,
    CommandSeen,
    Exited,
    Gap,
    Grid,
    NextGeneration,
    Output,
    Reason,
    Refusal,
    Superseded,
    Via,
    Watchers,
    page,
)
from terminals.signals import ACCESS_GROUP
from terminals.stream import Deliver, FetchFrom, ViewerStream
from terminals.tasks import Tasks
from transport.layers import forget_channel, keep_receiving

log = logging.getLogger(__name__)

RELAYED = {kind.TYPE: kind for kind in (ClosingSoon, CommandSeen, Grid, Watchers)}


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
        self.user, self.username = user, user.get_username()
        # Another user's shell (staff who may watch it): only an explicit takeover writes into it.
        self.foreign = self.session.user_id != user.pk
        self.right = Right(user, self.session, self.credential, self.foreign)
        self.viewer_id = uuid.uuid4().hex
        logs.bind(session=self.session.id, user=self.username, viewer=self.viewer_id)  # this socket's lines
        self.stream = ViewerStream()
        self.counted = metrics.ViewerCount()
        self.owner = OwnerClient(self.channel_layer, self.channel_name, self.viewer_id)
        viewer = Viewer(user, self.username, self.viewer_id, self.scope.get("session"), self.still_allowed)
        self.attacher = Attacher(viewer, self.session.id, self.stream, self.owner, self.tasks, self.carry_out)
        self.attacher.via = self.via
        self.frames = PageFrames(
            self.right, read_only=self.read_only, via=self.via, stream=self.stream, attacher=self.attacher,
            owner=self.owner, tasks=self.tasks, say=self.say, end=self.end,
        )  # fmt: skip
        await keep_receiving(self.channel_layer)
        await self.accept()
        # Logging out anywhere closes this socket (terminals.signals), and so does a narrowing of access that
        # touches it or the revocation of its API token (api.tokens); the owner check catches a lost message.
        self.groups_in = [f"tether.user.{user.pk}", ACCESS_GROUP, *([self.credential.group] if self.credential else [])]
        for group in self.groups_in:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.connected()
        await self.say(page.Hello(str(self.session.id), PROTOCOL_VERSION))
        log.info(
            "%s connected to session %s%s", self.username, self.session.id, " (API token)" if self.credential else ""
        )

    async def load_session(self, user) -> TerminalSession | None:
        who = await db(self.credential.token)() if self.credential else user
        return await db(_load_session)(self.scope["url_route"]["kwargs"]["session"], who)

    async def connected(self) -> None:
        """Accepted and in the user's group: anything more this kind of socket needs before ``hello``."""

    @property
    def via(self) -> Via:
        if self.session.user_id == self.scope["user"].pk:
            return Via.OWN
        return Via.STAFF if self.scope["user"].is_staff else Via.TEAM

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
        if counted := getattr(self, "counted", None):
            counted.left()
        if getattr(self, "stream", None) is not None:
            await self.detach()
        groups, self.groups_in = getattr(self, "groups_in", []), []
        for group in groups:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def detach(self) -> None:
        """Attached no more, and the worker told at once: it keeps a departed writer's flow window a while,
        and stops listing a departed observer as watching."""
        if self.stream.attached:
            self.stream.leave()
            await self.owner.detach()

    # --- browser -> server -------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None) -> None:
        await self.frames.receive(text_data, bytes_data)

    # --- worker -> browser -------------------------------------------------------------------

    async def terminal_attached(self, event: dict) -> None:
        message = Attached.decode(event)
        asked_from = None if self.stream.generation is None and self.stream.expected == 0 else self.stream.expected
        if not self.stream.confirmed(message):
            return  # a repeated delivery, or the answer to an attach this viewer has since replaced
        self.counted.attached(message, asked_from)
        await self.say(page.Attached.of(message))
        self.attacher.confirmed(message.end)
        if not self.foreign and not self.attacher.observing:
            # Someone else wrote into this shell while it was theirs (the page says it once).
            if taken := await db(actions.last_takeover)(self.session):
                await self.say(page.TakenOver(**taken))

    async def terminal_output(self, event: dict) -> None:
        said = self.stream.output(Output.decode(event))
        if isinstance(said, Deliver):
            await self.send(bytes_data=said.data)
        elif isinstance(said, FetchFrom):
            await self.owner.resend(said.since)

    async def link_lost(self, event: dict) -> None:
        await self.attacher.link_lost()

    async def terminal_gap(self, event: dict) -> None:
        message = Gap.decode(event)
        if self.stream.gap(message):
            metrics.LOST.inc(max(message.lost, 0))
            await self.say(page.Gap(message.offset, message.lost))

    async def terminal_error(self, event: dict) -> None:
        message = Refusal.decode(event)
        if not await self.attacher.refused(message.code):  # the attach's own business, else the page's
            await self.say(page.Error(message.code, message.message))

    async def relay(self, event: dict) -> None:
        """What the page is told as the owner said it, when it comes from the owner this viewer is with: a
        closing warning and a command at once, the writer's grid and who watches once attached."""
        message = RELAYED[event["type"]].decode(event)
        if self.stream.current(message.epoch) and (self.stream.attached or not isinstance(message, Grid | Watchers)):
            await self.say(page.relayed(message))

    terminal_warning = terminal_command = terminal_grid = terminal_watchers = relay

    async def terminal_superseded(self, event: dict) -> None:
        message = Superseded.decode(event)
        if self.stream.current(message.epoch):
            await self.superseded(message.by)

    async def superseded(self, by: str | None) -> None:
        self.stream.leave()
        # Someone else writing into this user's shell is said so, by name; another window of theirs is not.
        text = f"Taken over by {by}" if by and by != self.username else "Superseded by another window"
        said = page.Superseded(text, by if by != self.username else None)
        # The close frame carries the reason too (transport/daphne_close.py: daphne 4 would drop it).
        await self.end(CloseCode.SUPERSEDED, said, text=text)

    async def terminal_exit(self, event: dict) -> None:
        message = Exited.decode(event)
        if not self.stream.current(message.epoch):
            return  # from an owner this viewer has left behind
        await self.say(page.Exit.of(message))
        if message.reason != Reason.RESET:
            self.stream.leave()
            await self.end(Reason.close_code_for(message.reason))

    async def terminal_generation(self, event: dict) -> None:
        message = NextGeneration.decode(event)
        if message.ended != self.stream.generation or not self.stream.current(message.epoch):
            return  # a repeated delivery: this viewer already moved on to the next generation
        self.stream.next_generation()
        await self.say(page.Fresh())
        self.attacher.start()

    async def terminal_closed(self, event: dict) -> None:
        message = Closed.decode(event)
        if not self.stream.current(message.epoch):
            return  # from an owner this viewer has left behind
        self.stream.leave()
        await self.end(Reason.close_code_for(message.reason), page.Closed(message.reason, message.text))

    async def user_logged_out(self, event: dict) -> None:
        await self.end_for(Reason.LOGGED_OUT, "Signed out")

    async def token_revoked(self, event: dict) -> None:
        await self.not_allowed("The API token this socket was opened with was revoked")

    def still_allowed(self) -> str:
        """ "" while this socket's person may still do what it does here; else why not, in their words (asked on
        the database thread at every owner check, and when anyone's access narrows)."""
        return self.right.why_not(self.attacher.observing)

    async def access_changed(self, event: dict) -> None:
        """Someone's access was narrowed (a grant, a group, a label): if it was this socket's right, it ends now."""
        if why := await db(self.still_allowed)():
            await self.not_allowed(why)

    async def not_allowed(self, why: str) -> None:
        await self.end_for(Reason.NOT_ALLOWED, why)

    # --- what the page is told, and the end of the socket --------------------------------------

    async def say(self, message: page.ToPage) -> None:
        await self.send(text_data=message.dumps())

    async def end(self, code: CloseCode, said: page.ToPage | None = None, *, text: str | None = None) -> None:
        """The one way the server ends this socket: the page is told why (``said``), then it closes with
        ``code`` (and ``text`` in the close frame)."""
        if said is not None:
            await self.say(said)
        await self.close(code, reason=text)

    async def end_for(self, reason: Reason, text: str) -> None:
        """Ended for this viewer's own ``reason`` (signed out, access lost, a share link ended): it leaves the
        shell first (the worker stops listing it at once), then hears why."""
        await self.detach()
        await self.end(reason.close_code, page.Closed(reason, text))

    async def carry_out(self, verdict: Verdict) -> None:
        """What the attacher decided."""
        match verdict:
            case Tell(message):
                await self.say(message)
            case Draw(screen):
                await self.send(bytes_data=screen)
            case End(code, said):
                await self.end(code, said)
            case SignedOut():
                await self.user_logged_out({})
            case NotAllowed(why):
                await self.not_allowed(why)
            case Replaced():
                await self.superseded(None)

    async def close(self, code=None, reason=None) -> None:
        # autobahn takes a close code only as a plain int, not an IntEnum member.
        await super().close(None if code is None or code is True else int(code), reason)
