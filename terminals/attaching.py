"""Keeping a viewer attached: finding the worker that holds its session (waiting while a shell starts, saying
how a closed one ended, starting a fresh one when allowed), then checking that it stays attached to the
owner the database names, and that a replay arrived whole.

The consumer owns the socket; this owns the attach and the checks, run as the consumer's named tasks, and
says what the socket should do as verdicts (``Tell``, ``Draw``, ``End``...) that the consumer carries out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from channels.db import database_sync_to_async as db
from channels.layers import get_channel_layer
from django.conf import settings

from executions.models import State
from terminals import actions
from terminals.models import ProcessState, TerminalSession
from terminals.owner_client import OwnerClient, owner_or_lost
from terminals.protocol import ATTACH_WAIT_SECONDS, CloseCode, ErrorCode, Exited, Reason, StatusCode, Via, page
from terminals.stream import ViewerStream
from terminals.tasks import Tasks
from terminals.wake import WAKE_CHANNEL

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is attaching, as the attacher needs it: the socket's user and login, and the question of whether
    they may still do what they do (asked on the database thread, "" while they may)."""

    user: object
    username: str
    viewer_id: str
    login: object  # the browser's login session (None for an API token's socket)
    still_allowed: Callable[[], str]


# What the attacher decides and the consumer carries out (the consumer owns the socket).


@dataclass(frozen=True, slots=True)
class Tell:
    """Say this to the page."""

    message: page.ToPage


@dataclass(frozen=True, slots=True)
class Draw:
    """Draw a closed shell's last screen (its bytes, before any stream)."""

    screen: bytes


@dataclass(frozen=True, slots=True)
class End:
    """Close the socket with ``code``, after telling the page ``said``."""

    code: CloseCode
    said: page.ToPage | None = None


@dataclass(frozen=True, slots=True)
class SignedOut:
    """The browser's login is gone (logged out elsewhere, and the message of it was missed)."""


@dataclass(frozen=True, slots=True)
class NotAllowed:
    """They may no longer do what they do here (``why``, in their words)."""

    why: str


@dataclass(frozen=True, slots=True)
class Replaced:
    """Another window took the shell while this one missed the message saying so."""


Verdict = Tell | Draw | End | SignedOut | NotAllowed | Replaced


def _attach_target(session_id) -> dict:
    """The session as a viewer needs it now, as plain data: its shell's state and who holds it."""
    # The archived screen (up to 64 KiB) is only needed once the process has closed: not on every attach.
    session = TerminalSession.objects.select_related("execution").defer("snapshot").get(pk=session_id)
    execution = session.execution
    closed = session.process_state == ProcessState.CLOSED
    owner, lost = owner_or_lost(execution.pk)
    return {
        "process_state": session.process_state,
        "close_reason": session.close_reason,
        "generation": session.generation,
        "execution": execution.pk,
        "state": execution.state,
        "owner": owner,
        "lost": "" if closed else lost,
        "viewer": session.viewer_id,
        "snapshot": bytes(session.snapshot) if closed else b"",
        "expired": session.expired_at is not None,
        # How it ended, as the owner would have told it (who asked for the end: an operator's Complete...).
        "exited": (
            Exited.of(
                execution,
                reason=Reason(session.close_reason or Reason.EXITED),
                generation=session.generation,
                epoch=None,
                asked=actions.closed_by(execution.pk),
            )
            if closed
            else None
        ),
    }


def _still_signed_in(session) -> bool:
    """Whether the browser's login session still exists (logging out deletes it)."""
    return session is None or not session.session_key or session.exists(session.session_key)


def _restart(session_id, user, reason: str) -> None:
    session = TerminalSession.objects.select_related("machine").get(pk=session_id)
    if session.process_state == ProcessState.CLOSED:
        actions.start_next_generation(session, actions.Actor.for_user(user), reason)


ANSWER_CHECK_SECONDS = 1.0  # how often a viewer waiting for its owner's answer looks who the owner is


class Attacher:
    def __init__(
        self,
        viewer: Viewer,
        session_id,
        stream: ViewerStream,
        owner: OwnerClient,
        tasks: Tasks,
        act: Callable[[Verdict], Awaitable[None]],
    ):
        self.viewer, self.session_id, self.stream, self.owner, self.tasks = viewer, session_id, stream, owner, tasks
        self.act = act  # carries out a verdict (the consumer's)
        self.grid: tuple[int, int] | None = None
        self.observing = False  # read-only, beside the writer: never a new shell, never the grid
        self.via = Via.OWN  # how an observer came (a share link, staff, a teammate, or the shell's own user)
        self.refused_since: float | None = None  # when the worker first refused this attach, if it did
        self.following = False  # the attach under way follows the session to a new owner (no one asked)

    def start(self, delay: float = 0.0, *, follow: bool = False) -> None:
        """(Re)attach in the background, replacing an attach still looking for the owner. ``follow``: this
        socket follows its session to a new owner by itself, and yields to a window attached there first."""
        self.following = follow
        self.tasks.start(self._attach(delay), name="attach")

    def confirmed(self, end: int) -> None:
        """The owner attached this viewer, its replay running to ``end``: check that it arrives, and keep
        checking the owner."""
        self.refused_since = None
        self.tasks.start(self._check_replay(end), name="replay_check")
        if not self.tasks.has("owner_check"):
            self.tasks.start(self._check_owner(), name="owner_check")

    def retry_refused(self) -> bool:
        """The worker refused the attach (the lease moved, or the process is starting or closing): look
        again, quietly, as the protocol's own retry. False once that has gone on too long to hide."""
        now = time.monotonic()
        self.refused_since = self.refused_since or now
        if now - self.refused_since >= ATTACH_WAIT_SECONDS:
            return False
        self.start(delay=0.2, follow=self.following)
        return True

    async def refused(self, code: ErrorCode) -> bool:
        """The worker refused something of this viewer's: True when that was the attach's business, handled
        here (the page hears of a refused attach only if it never settles)."""
        if code == ErrorCode.ATTACH_REFUSED and not self.stream.attached and self.retry_refused():
            return True
        if code == ErrorCode.SUPERSEDED and self.following and not self.stream.attached:
            await self.act(Replaced())  # followed its session to a new owner, where another window was first
            return True
        if code == ErrorCode.NOT_WATCHING and self.observing:
            self.stream.leave()  # observe again, from where this viewer's stream is
            self.start()
            return True
        return False

    async def _attach(self, delay: float = 0.0) -> None:
        """Find the worker holding the session (waiting while it starts) and ask it to attach this viewer."""
        await asyncio.sleep(delay)
        deadline = time.monotonic() + ATTACH_WAIT_SECONDS
        said = None  # the status this viewer was last told
        while time.monotonic() < deadline:
            target = await db(_attach_target)(self.session_id)
            if target["process_state"] == ProcessState.CLOSED:
                if not await self._closed_at_attach(target):
                    return
                continue
            if owner := target["owner"]:
                attach, since = self.stream.next_attach(target["generation"])
                fields = {"attach": attach, "since": since, "generation": target["generation"]}
                fields |= {"epoch": self.stream.epoch, "by": self.viewer.username}
                if self.observing:  # no grid: an observer draws the writer's
                    await self.owner.observe(owner, **fields, via=self.via)
                else:
                    cols, rows = self.grid or (None, None)
                    await self.owner.attach(owner, **fields, cols=cols, rows=rows, follow=self.following)
                if not await self._owner_moved_before_answering(owner):
                    return  # answered, or still its owner's to answer (it may take its time)
                said = None  # asked a worker that died before it answered: ask whoever holds it now
                continue
            if target["lost"]:  # its worker stopped beating: say so, and wait for whoever takes it over
                status = page.Status(StatusCode.OWNER_LOST, target["lost"], process_state="live")
            else:
                text = "Waiting for the shell to start…" if self.observing else "Starting your session…"
                status = page.Status(StatusCode.STARTING, text, process_state="starting")
            if status.code != said:
                await self.act(Tell(status))
                said = status.code
            await asyncio.sleep(0.1)
        text = "No worker is serving this session right now"
        await self.act(End(CloseCode.SERVER_RESTART, page.Status(StatusCode.NO_WORKER, text)))

    async def _owner_moved_before_answering(self, owner) -> bool:
        """Whether another worker holds the session before the one asked attached this viewer:
        a worker killed between the lookup and the answer never answers, and the viewer that waited for it would
        wait for ever (its owner check starts only once attached)."""
        while not self.stream.attached:
            await asyncio.sleep(ANSWER_CHECK_SECONDS)
            if self.stream.attached:
                return False
            now = (await db(_attach_target)(self.session_id))["owner"]
            # Another owner holds it now (an adopter): a lease that only looks expired for a moment (a late
            # heartbeat on a loaded host) is no reason to ask again.
            if now is not None and (now.channel, now.token) != (owner.channel, owner.token):
                log.info("session %s: its owner changed before it answered; asking again", self.session_id)
                return True
        return False

    async def _closed_at_attach(self, target: dict) -> bool:
        """The process had ended: say how, then start a fresh shell if allowed. Returns whether to go on."""
        await self.act(Tell(page.Exit.of(target["exited"])))
        # A resolved outcome has freed the machine's slot, as a known one does: a fresh shell may start.
        again = Reason.auto_resets(target["close_reason"]) or target["state"] == State.RESOLVED
        if settings.TETHER_AUTO_RESET and again and not self.observing:  # an observer starts no shell
            await db(_restart)(self.session_id, self.viewer.user, f"auto-reset after {target['close_reason']}")
            await get_channel_layer().send(WAKE_CHANNEL, {"type": "wake"})
            await self.act(Tell(page.Fresh()))
            self.stream.next_generation()
            return True
        if target["expired"]:
            text = f"The final screen is no longer kept (closed sessions keep it {settings.TETHER_RETENTION_HOURS} h)"
            await self.act(Tell(page.Status(StatusCode.NOT_KEPT, text)))
        else:
            await self.act(Draw(target["snapshot"]))
        await self.act(End(Reason.close_code_for(target["close_reason"])))
        return False

    async def _check_owner(self) -> None:
        """Every few seconds, compare what this viewer is attached to with the database: a message that
        never arrived (an exit, a supersede) or an owner that died and was replaced is noticed here."""
        while True:
            await asyncio.sleep(settings.TETHER_VIEWER_CHECK_SECONDS)
            if not self.stream.attached:
                continue
            if self.observing:
                # Still watching, said before the database is asked (which may be away): the owner keeps
                # listing this observer, or tells it that it no longer does.
                await self.owner.keepalive(observing=True)
            try:
                signed_in = await db(_still_signed_in)(self.viewer.login)
                refused = await db(self.viewer.still_allowed)()
                target = await db(_attach_target)(self.session_id)
            except Exception as error:  # PostgreSQL restarting: the stream itself needs no database
                log.info("session %s: cannot check its owner now (%r)", self.session_id, error)
                continue
            if not signed_in:
                await self.act(SignedOut())
                return
            if refused:  # deactivated, or a permission taken away since it connected
                await self.act(NotAllowed(refused))
                return
            if not self.stream.attached:
                continue
            if not self.observing and target["viewer"] and target["viewer"] != self.viewer.viewer_id:
                log.info("session %s: another window took it over; this one missed the message", self.session_id)
                await self.act(Replaced())
                return
            held, owner = self.owner.owner, target["owner"]
            moved = target["execution"] != held.execution or target["process_state"] == ProcessState.CLOSED
            if moved or owner is None or (owner.channel, owner.token) != (held.channel, self.stream.epoch):
                log.info("session %s: its owner changed under this viewer; attaching again", self.session_id)
                self.stream.leave()
                self.start(follow=True)

    async def _check_replay(self, end: int) -> None:
        """Make sure the replay up to ``end`` arrived: channels-redis can drop a message while another
        consumer in this process closes (django/channels_redis#366), and an idle shell sends nothing
        after it that would reveal the gap."""
        for _ in range(3):
            await asyncio.sleep(0.5)
            if (since := self.stream.missing(end)) is None:
                return
            await self.owner.resend(since)

    async def link_lost(self) -> None:
        """The direct link this viewer's messages went over dropped (transport/links.py): what was on it is lost,
        as a lost publish is. The worker hears this viewer's latest ack again (it may be waiting for it) and sends
        what this viewer is missing (repeats are dropped by offset)."""
        if not self.stream.attached:
            return
        if not self.observing:
            await self.owner.ack(self.stream.ack_pending)
        await self.owner.resend(self.stream.expected)
