"""What the page's frames do on a viewer's socket, by its viewer's rules: the writer's keys, grid, resets and
acks go to the owner worker; an observer only watches (told so, never struck for it); another user's shell is
written into only after an explicit take-over, which its user is told. A frame that breaks the protocol is a
strike, and too many strikes end the socket. Whether the socket's person may still do what it does is its
``Right``, asked again at every owner check and whenever anyone's access narrows.

The consumer (terminals/consumers.py) owns the socket and hands each frame here, decoded once
(terminals/protocol/page.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.contrib.auth import get_user_model

from access.policy import Do, may
from terminals import actions, metrics
from terminals.attaching import Attacher
from terminals.models import TerminalSession
from terminals.owner_client import OwnerClient
from terminals.protocol import (
    MAX_FRAME_BYTES,
    STRIKE_WINDOW_SECONDS,
    CloseCode,
    ErrorCode,
    ProtocolError,
    Reason,
    Via,
    page,
)
from terminals.stream import OBSERVER_WINDOW_BYTES, ViewerStream
from terminals.tasks import Tasks

ACK_DELAY_SECONDS = 0.01  # an ack freeing little of the flow window waits this long for company


@dataclass(frozen=True, slots=True)
class Right:
    """What a socket's person (or the API token it was opened with) may do with its session, asked as it is
    now: an account deactivated, a permission or grant taken away, a label taken off the machine, or the token
    revoked or expired, ends what it allowed."""

    user: object
    session: TerminalSession
    credential: object = None  # api/ws.py: ``token()``, ``ended()``, ``group``
    foreign: bool = False  # another user's shell: writing into it is a take-over

    def fresh_session(self) -> TerminalSession:
        found = TerminalSession.objects.select_related("machine").filter(pk=self.session.pk).first()
        return found if found is not None else self.session

    def _who(self, user):
        """Whom the decision is asked of: the API token the socket was opened with, or its person."""
        return self.credential.token() if self.credential else user

    def may_write(self) -> bool:
        return may(self._who(self.user), Do.USE, self.fresh_session())

    def why_not(self, observing: bool) -> str:
        """ "" while it may still watch (``observing``) or write; else why not, in their words."""
        user = get_user_model().objects.filter(pk=self.user.pk).first()
        if user is None or not user.is_active:
            return "This account was deactivated"
        if self.credential and (ended := self.credential.ended()):
            return f"The API token this socket was opened with was {ended}"
        who = self._who(user)
        session = self.fresh_session()  # its machine as it is now: a label taken off ends the grant on it
        if observing:
            return "" if may(who, Do.WATCH, session) else "You may no longer watch this shell"
        writes = may(who, Do.TAKE_OVER if self.foreign else Do.USE, session)
        return "" if writes else "You may no longer write into this shell"


class PageFrames:
    def __init__(
        self,
        right: Right,
        *,
        read_only: bool,
        via: Via,
        stream: ViewerStream,
        attacher: Attacher,
        owner: OwnerClient,
        tasks: Tasks,
        say: Callable[[page.ToPage], Awaitable[None]],
        end: Callable[[CloseCode, page.ToPage], Awaitable[None]],
    ):
        self.right, self.read_only, self.via = right, read_only, via
        self.stream, self.attacher, self.owner, self.tasks = stream, attacher, owner, tasks
        self.say, self.end = say, end
        self.session, self.user, self.foreign = right.session, right.user, right.foreign
        self.taken_over = False  # this socket's take-over was recorded (once)
        self.watching_noted = False  # this socket's watching was recorded (once)
        self.told_read_only = 0.0
        self.strikes: list[float] = []

    async def receive(self, text: str | None, data: bytes | None) -> None:
        try:
            if data is not None:
                await self.keys(data)
                return
            match page.decode(text or ""):
                case page.Observe() as frame:
                    await self.observe(frame)
                case page.Attach() as frame:
                    await self.attach(frame)
                case page.Resize() as frame:
                    await self.resize(frame)
                case page.Reset():
                    await self.reset()
                case page.Ack() as frame:
                    await self.ack(frame)
                case page.Keepalive():
                    if self.stream.attached:
                        await self.owner.keepalive()
                case page.Ping() as frame:
                    metrics.echo_samples(frame.echo_ms)  # the page's keystroke-echo samples, if it sent any
                    await self.say(page.Pong())
        except ProtocolError as error:
            await self.strike(str(error))

    async def keys(self, data: bytes) -> None:
        if len(data) > MAX_FRAME_BYTES:
            raise ProtocolError(f"input frame of {len(data)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
        if self.attacher.observing:
            await self.read_only_said("your keys were not sent")
            return
        if not self.stream.attached:
            raise ProtocolError("not attached yet: input was dropped (send an attach message first)")
        await self.owner.input(data, self.stream.next_input())

    async def strike(self, text: str) -> None:
        now = time.monotonic()
        self.strikes = [t for t in self.strikes if now - t < STRIKE_WINDOW_SECONDS] + [now]
        await self.say(page.Error(ErrorCode.BAD_FRAME, text))
        if len(self.strikes) > settings.TETHER_STRIKE_LIMIT:
            reason = Reason.POLICY_VIOLATION
            await self.end(reason.close_code, page.Closed(reason, "too many bad frames"))

    async def read_only_said(self, what: str) -> None:
        """An observer tried to write: said plainly (at most every 2 s), never counted as a bad frame."""
        now = time.monotonic()
        if now - self.told_read_only >= 2.0:
            self.told_read_only = now
            text = f"You are watching {self.session.user.get_username()}'s shell read-only: {what}"
            await self.say(page.Error(ErrorCode.READ_ONLY, text))

    async def observe(self, frame: page.Observe) -> None:
        """Watch read-only beside the writer: the stream and the writer's grid, no keys, no resize."""
        if not self.watching_noted:
            await db(actions.note_observer)(self.session, self.user, self.via)
            self.watching_noted = True
        self.attacher.observing = True
        self.stream.window = OBSERVER_WINDOW_BYTES
        self.stream.want(frame.at.since, frame.at.generation, frame.at.epoch)
        self.attacher.start()

    async def attach(self, frame: page.Attach) -> None:
        if self.read_only:
            raise ProtocolError("this link is read-only: send observe to watch")
        if not self.foreign and not await db(self.right.may_write)():
            raise ProtocolError("your role on this workspace is watch: you may watch this shell (observe)")
        if self.foreign and not await db(actions.may_take_over)(self.user, self.session):
            owner = self.session.user.get_username()
            raise ProtocolError(f"this is {owner}'s shell: you may watch it (observe), not write into it")
        if self.foreign and not frame.takeover:
            owner = self.session.user.get_username()
            raise ProtocolError(f"this is {owner}'s shell: send takeover to write into it ({owner} is told)")
        if self.foreign and not self.taken_over:
            await db(actions.note_takeover)(self.session, self.user)
            self.taken_over = True
        self.attacher.grid = frame.grid
        self.attacher.observing = False
        self.stream.window = None
        self.stream.want(frame.at.since, frame.at.generation, frame.at.epoch)  # output meanwhile is replayed
        self.attacher.start()

    async def resize(self, frame: page.Resize) -> None:
        if self.attacher.observing:
            await self.read_only_said("an observer draws the writer's grid and never changes it")
            return
        self.attacher.grid = (frame.cols, frame.rows)
        if self.stream.attached:
            await self.owner.resize(frame.cols, frame.rows)

    async def reset(self) -> None:
        if self.attacher.observing:
            await self.read_only_said("an observer cannot reset the shell")
            return
        if not self.stream.attached:
            raise ProtocolError("not attached: nothing to reset")
        # Who asked: the worker ends the shell and records the reset as its own act.
        await db(actions.session_event)(self.session, "reset_asked", actions.Actor.for_user(self.user), "from the page")
        await self.owner.reset()

    async def ack(self, frame: page.Ack) -> None:
        """Acks are coalesced: one goes on at once when it frees a good part of the flow window, else a
        short moment later. A keystroke's echo then costs one message each way, not two."""
        if self.attacher.observing:  # nothing upstream waits for an observer's acks
            if fetch := self.stream.caught_up(frame.offset):
                await self.owner.resend(fetch.since)
            return
        now = self.stream.ack(frame.offset)
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
