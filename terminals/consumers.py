"""The browser's WebSocket: a thin bridge to the owner worker that holds the session's process.

Binary frames carry terminal bytes both ways; text frames carry JSON control messages with a ``type``
(docs/protocol.md). A frame is decoded here and handed to the viewer's stream (terminals.stream), which
says what to send; messages go to the worker through the one client of its protocol
(terminals.owner_client). Every task this consumer starts is its own and ends with it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async as db
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from executions.models import State
from terminals import actions
from terminals.layers import forget_channel, keep_receiving
from terminals.models import ProcessState, TerminalSession
from terminals.owner_client import OwnerClient, owner_of_execution
from terminals.protocol import (
    ATTACH_WAIT_SECONDS,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    STRIKE_WINDOW_SECONDS,
    Attached,
    CloseCode,
    Closed,
    ClosingSoon,
    ErrorCode,
    Exited,
    Gap,
    NextGeneration,
    Output,
    ProtocolError,
    Reason,
    Refusal,
    StatusCode,
    Superseded,
    grid,
    integer,
)
from terminals.stream import Deliver, FetchFrom, ViewerStream
from terminals.wake import WAKE_CHANNEL

log = logging.getLogger(__name__)

ACK_DELAY_SECONDS = 0.01  # an ack freeing little of the flow window waits this long for company


def _load_session(session_id: str, user) -> TerminalSession | None:
    session = TerminalSession.objects.select_related("machine", "execution").filter(pk=session_id).first()
    if session is None or not actions.may_view_session(user, session):
        return None
    return session


def _attach_target(session_id) -> dict:
    """The session as a viewer needs it now, as plain data: its shell's state and who holds it."""
    # The archived screen (up to 64 KiB) is only needed once the process has closed: not on every attach.
    session = TerminalSession.objects.select_related("execution").defer("snapshot").get(pk=session_id)
    execution = session.execution
    closed = session.process_state == ProcessState.CLOSED
    return {
        "process_state": session.process_state,
        "close_reason": session.close_reason,
        "generation": session.generation,
        "execution": execution.pk,
        "state": execution.state,
        "outcome": execution.outcome_label,
        "exit_code": execution.exit_code,
        "owner": owner_of_execution(execution.pk),
        "viewer": session.viewer_id,
        "snapshot": bytes(session.snapshot) if closed else b"",
        "expired": session.expired_at is not None,
        # Who asked for it to end (an operator's Complete, Kill...), once it has.
        "closed_by": actions.closed_by(execution.pk) if closed else {},
    }


def _still_signed_in(session) -> bool:
    """Whether the browser's login session still exists (logging out deletes it)."""
    return session is None or not session.session_key or session.exists(session.session_key)


def _restart(session_id, user, reason: str) -> None:
    session = TerminalSession.objects.select_related("machine").get(pk=session_id)
    if session.process_state == ProcessState.CLOSED:
        actions.start_next_generation(session, actions.Actor.for_user(user), reason)


def _auto_resets(reason: str) -> bool:
    try:
        return Reason(reason).auto_reset
    except ValueError:
        return False


class Tasks:
    """The consumer's background tasks by name: starting one replaces (and ends) the one before it."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task] = {}

    def start(self, name: str, work) -> None:
        if (old := self.running.pop(name, None)) is not None and old is not asyncio.current_task():
            old.cancel()
        task = asyncio.create_task(work)
        self.running[name] = task
        task.add_done_callback(lambda done: self.running.get(name) is done and self.running.pop(name))

    def has(self, name: str) -> bool:
        return name in self.running

    async def end_all(self) -> None:
        current = asyncio.current_task()
        running = [task for task in self.running.values() if task is not current]
        self.running.clear()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


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

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # refused at the handshake (HTTP 403)
            return
        self.session = await db(_load_session)(self.scope["url_route"]["kwargs"]["session"], user)
        if self.session is None:
            await self.close()  # unknown or foreign: the same refusal, so ids cannot be probed
            return
        self.user = user
        self.username = user.get_username()
        # Another user's shell (staff with the take-over permission): only an explicit takeover writes into it.
        self.foreign = self.session.user_id != user.pk
        self.taken_over = False
        self.viewer_id = uuid.uuid4().hex
        self.stream = ViewerStream()
        self.owner = OwnerClient(self.channel_layer, self.channel_name, self.viewer_id)
        self.grid: tuple[int, int] | None = None
        self.strikes: list[float] = []
        self.refused_since: float | None = None  # when the worker first refused this attach, if it did
        await keep_receiving(self.channel_layer)
        await self.accept()
        # Logging out anywhere closes this socket (terminals.signals); the owner check catches a lost message.
        self.user_group = f"tether.user.{user.pk}"
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self.send_json({"type": "hello", "session": str(self.session.id), "protocol": PROTOCOL_VERSION})

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
        await self._leave()

    async def _leave(self) -> None:
        """Stop everything this viewer started; safe to call more than once."""
        await self.tasks.end_all()
        if (stream := getattr(self, "stream", None)) is not None and stream.attached:
            stream.leave()  # the worker must hear it: it keeps a departed viewer's flow window a while
            await self.owner.detach()
        if group := getattr(self, "user_group", None):
            self.user_group = None
            await self.channel_layer.group_discard(group, self.channel_name)

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

    async def client_attach(self, message: dict) -> None:
        if self.foreign and message["type"] != "takeover":
            owner = await db(lambda: self.session.user.get_username())()
            raise ProtocolError(f"this is {owner}'s shell: send takeover to write into it ({owner} is told)")
        if self.foreign and not self.taken_over:
            await db(actions.note_takeover)(self.session, self.user)
            self.taken_over = True
        since = integer(message.get("since", 0), "since")
        generation, epoch = message.get("generation"), message.get("epoch")
        generation = None if generation is None else integer(generation, "generation")
        epoch = None if epoch is None else integer(epoch, "epoch")
        self.grid = grid(message)
        self.stream.want(since, generation, epoch)  # output meanwhile is replayed by the attach
        self.tasks.start("attach", self._attach())

    client_takeover = client_attach

    async def client_resize(self, message: dict) -> None:
        size = grid(message)
        if size is None:
            raise ProtocolError("resize needs cols and rows")
        self.grid = size
        if self.stream.attached:
            await self.owner.resize(*size)

    async def client_reset(self, message: dict) -> None:
        if not self.stream.attached:
            raise ProtocolError("not attached: nothing to reset")
        await self.owner.reset()

    async def client_ack(self, message: dict) -> None:
        """Acks are coalesced: one goes on at once when it frees a good part of the flow window, else a
        short moment later. A keystroke's echo then costs one message each way, not two."""
        now = self.stream.ack(integer(message.get("offset"), "ack offset"))
        if now:
            await self._forward_ack()
        elif now is False and not self.tasks.has("ack"):
            self.tasks.start("ack", self._forward_ack(ACK_DELAY_SECONDS))

    async def _forward_ack(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        if (offset := self.stream.take_ack()) is not None:
            await self.owner.ack(offset)

    async def client_keepalive(self, message: dict) -> None:
        if self.stream.attached:
            await self.owner.keepalive()

    async def client_ping(self, message: dict) -> None:
        await self.send_json({"type": "pong"})

    # --- attaching ---------------------------------------------------------------------------

    async def _attach(self, delay: float = 0.0) -> None:
        """Find the worker holding the session (waiting while it starts) and ask it to attach this viewer."""
        await asyncio.sleep(delay)
        deadline = time.monotonic() + ATTACH_WAIT_SECONDS
        told_starting = False
        while time.monotonic() < deadline:
            target = await db(_attach_target)(self.session.id)
            if target["process_state"] == ProcessState.CLOSED:
                if not await self._closed_at_attach(target):
                    return
                continue
            if owner := target["owner"]:
                attach, since = self.stream.next_attach(target["generation"])
                size = self.grid or (None, None)
                await self.owner.attach(
                    owner,
                    attach=attach,
                    since=since,
                    generation=target["generation"],
                    epoch=self.stream.epoch,
                    cols=size[0],
                    rows=size[1],
                    by=self.username,
                )
                return
            if not told_starting:
                starting = {"process_state": "starting", "code": StatusCode.STARTING, "text": "Starting your session…"}
                await self.send_json({"type": "status", **starting})
                told_starting = True
            await asyncio.sleep(0.1)
        text = "No worker is serving this session right now"
        await self.send_json({"type": "status", "code": StatusCode.NO_WORKER, "text": text})
        await self.close(CloseCode.SERVER_RESTART)

    async def _closed_at_attach(self, target: dict) -> bool:
        """The process had ended: say how, then start a fresh shell if allowed. Returns whether to go on."""
        await self.send_json(
            {
                "type": "exit",
                "generation": target["generation"],
                "state": target["state"],
                "exit_code": target["exit_code"],
                "outcome": target["outcome"],
                "reason": target["close_reason"],
                **target["closed_by"],
            }
        )
        # A resolved outcome has freed the machine's slot, as a known one does: a fresh shell may start.
        again = _auto_resets(target["close_reason"]) or target["state"] == State.RESOLVED
        if settings.TETHER_AUTO_RESET and again:
            await db(_restart)(self.session.id, self.user, f"auto-reset after {target['close_reason']}")
            await self.channel_layer.send(WAKE_CHANNEL, {"type": "wake"})
            await self.send_json({"type": "reset", "text": "Started a fresh session"})
            self.stream.next_generation()
            return True
        if target["expired"]:
            text = f"The final screen is no longer kept (closed sessions keep it {settings.TETHER_RETENTION_HOURS} h)"
            await self.send_json({"type": "status", "code": StatusCode.NOT_KEPT, "text": text})
        else:
            await self.send(bytes_data=target["snapshot"])
        await self.close(Reason.close_code_for(target["close_reason"]))
        return False

    async def _check_owner(self) -> None:
        """Every few seconds, compare what this viewer is attached to with the database: a message that
        never arrived (an exit, a supersede) or an owner that died and was replaced is noticed here."""
        while True:
            await asyncio.sleep(settings.TETHER_VIEWER_CHECK_SECONDS)
            if not self.stream.attached:
                continue
            try:
                signed_in = await db(_still_signed_in)(self.scope.get("session"))
                target = await db(_attach_target)(self.session.id)
            except Exception as error:  # PostgreSQL restarting: the stream itself needs no database
                log.info("session %s: cannot check its owner now (%r)", self.session.id, error)
                continue
            if not signed_in:
                await self.user_logged_out({})
                return
            if not self.stream.attached:
                continue
            if target["viewer"] and target["viewer"] != self.viewer_id:
                log.info("session %s: another window took it over; this one missed the message", self.session.id)
                await self._superseded(None)
                return
            held, owner = self.owner.owner, target["owner"]
            moved = target["execution"] != held.execution or target["process_state"] == ProcessState.CLOSED
            if moved or owner is None or (owner.channel, owner.token) != (held.channel, self.stream.epoch):
                log.info("session %s: its owner changed under this viewer; attaching again", self.session.id)
                self.stream.leave()
                await self._attach()

    async def _check_replay(self, end: int) -> None:
        """Make sure the replay up to ``end`` arrived: channels-redis can drop a message while another
        consumer in this process closes (django/channels_redis#366), and an idle shell sends nothing
        after it that would reveal the gap."""
        for _ in range(3):
            await asyncio.sleep(0.5)
            if (since := self.stream.missing(end)) is None:
                return
            await self.owner.resend(since)

    # --- worker -> browser -------------------------------------------------------------------

    async def terminal_attached(self, event: dict) -> None:
        message = Attached.decode(event)
        if not self.stream.confirmed(message):
            return  # a repeated delivery, or the answer to an attach this viewer has since replaced
        self.refused_since = None
        await self.send_json(
            {
                "type": "attached",
                "offset": message.offset,
                "end": message.end,
                "lost": message.lost,
                "generation": message.generation,
                "epoch": message.epoch,
                "fresh": message.fresh,
                # Bytes lost past the buffer, tmux: the screen as it is now (base64), drawn before the stream.
                "screen": base64.b64encode(message.screen).decode() if message.screen else None,
                "process_state": message.process_state,
            }
        )
        self.tasks.start("replay_check", self._check_replay(message.end))
        if not self.tasks.has("owner_check"):
            self.tasks.start("owner_check", self._check_owner())

    async def terminal_output(self, event: dict) -> None:
        said = self.stream.output(Output.decode(event))
        if isinstance(said, Deliver):
            await self.send(bytes_data=said.data)
        elif isinstance(said, FetchFrom):
            await self.owner.resend(said.since)

    async def terminal_gap(self, event: dict) -> None:
        message = Gap.decode(event)
        if self.stream.gap(message):
            await self.send_json({"type": "gap", "offset": message.offset, "lost": message.lost})

    async def terminal_error(self, event: dict) -> None:
        message = Refusal.decode(event)
        if message.code == ErrorCode.ATTACH_REFUSED and not self.stream.attached:
            # The lease moved (or the process is starting or closing) between our lookup and the worker:
            # look again, quietly, as the protocol's own retry; the page hears only if it never settles.
            now = time.monotonic()
            self.refused_since = self.refused_since or now
            if now - self.refused_since < ATTACH_WAIT_SECONDS:
                self.tasks.start("attach", self._attach(delay=0.2))
                return
        await self.send_json({"type": "error", "code": message.code, "message": message.message})

    async def terminal_warning(self, event: dict) -> None:
        message = ClosingSoon.decode(event)
        if self.stream.current(message.epoch):
            await self.send_json({"type": "warning", "reason": message.reason, "seconds_left": message.seconds_left})

    async def terminal_superseded(self, event: dict) -> None:
        message = Superseded.decode(event)
        if self.stream.current(message.epoch):
            await self._superseded(message.by)

    async def _superseded(self, by: str | None) -> None:
        self.stream.leave()
        # Someone else writing into this user's shell is said so, by name; another window of theirs is not.
        text = f"Taken over by {by}" if by and by != self.username else "Superseded by another window"
        await self.send_json({"type": "superseded", "text": text, **({"by": by} if by != self.username else {})})
        # The close frame carries the reason too (terminals/daphne_close.py: daphne 4 would drop it).
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
        self.tasks.start("attach", self._attach())

    async def terminal_closed(self, event: dict) -> None:
        message = Closed.decode(event)
        if not self.stream.current(message.epoch):
            return  # from an owner this viewer has left behind
        self.stream.leave()
        await self.send_json({"type": "closed", "reason": message.reason, "text": message.text})
        await self.close(Reason.close_code_for(message.reason))

    async def user_logged_out(self, event: dict) -> None:
        self.stream.leave()
        reason = Reason.LOGGED_OUT
        await self.send_json({"type": "closed", "reason": reason, "text": "Signed out"})
        await self.close(reason.close_code)

    async def close(self, code=None, reason=None) -> None:
        # autobahn takes a close code only as a plain int, not an IntEnum member.
        await super().close(None if code is None or code is True else int(code), reason)

    async def send_json(self, data: dict) -> None:
        await self.send(text_data=json.dumps(data))
