"""The browser's WebSocket: a thin bridge to the owner worker that holds the session's process.

Binary frames carry terminal bytes both ways; text frames carry JSON control
messages with a ``type``. Output is sequenced by absolute offset, so a chunk
lost between worker and consumer is noticed and fetched again, and a duplicate
is dropped.
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
from terminals.models import ProcessLease, ProcessState, TerminalSession, WorkerState
from terminals.protocol import (
    ATTACH_WAIT_SECONDS,
    CLOSE_CODES,
    MAX_COLS,
    MAX_FRAME_BYTES,
    MAX_ROWS,
    STRIKE_WINDOW_SECONDS,
    CloseCode,
)
from terminals.wake import WAKE_CHANNEL

log = logging.getLogger(__name__)

ACK_BATCH_BYTES = 128 * 1024  # an ack freeing this much of the flow window goes to the worker at once
ACK_DELAY_SECONDS = 0.01  # a smaller one waits this long for company

# Sessions closed for these reasons get a fresh shell when a viewer attaches (if TETHER_AUTO_RESET).
AUTO_RESET_REASONS = {
    "exited",
    "killed",
    "failed",
    "server_restart",
    "spawn_failed",
    "never_started",
    "reset",
    "completed",
}


class ProtocolError(Exception):
    pass


# Offsets fit in a JavaScript number, and in the channel layer's 64-bit integers.
MAX_INTEGER = 2**53


def _integer(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INTEGER:
        raise ProtocolError(f"{name} must be an integer from 0 to 2^53")
    return value


def _load_session(session_id: str, user) -> TerminalSession | None:
    session = TerminalSession.objects.select_related("machine", "execution").filter(pk=session_id).first()
    if session is None or not actions.may_view_session(user, session):
        return None
    return session


def _attach_target(session_id) -> dict:
    """Where the session's process lives right now, as plain data."""
    # The archived screen (up to 64 KiB) is only needed once the process has closed: not on every attach.
    session = TerminalSession.objects.select_related("execution").defer("snapshot").get(pk=session_id)
    execution = session.execution
    # Only a worker that holds a started process can attach a viewer: one still launching it (its lease's
    # handle says how far it got) would refuse, so the viewer waits as for a shell that is starting.
    lease = (
        ProcessLease.objects.select_related("worker")
        .filter(execution=execution, released_at__isnull=True)
        .exclude(worker__state=WorkerState.STOPPED)
        .exclude(handle={})
        .exclude(handle__has_key="launch")
        .first()
    )
    return {
        "process_state": session.process_state,
        "close_reason": session.close_reason,
        "generation": session.generation,
        "execution": execution.pk,
        "state": execution.state,
        "outcome": execution.outcome_label,
        "exit_code": execution.exit_code,
        "channel": lease.worker.channel_name if lease and lease.worker else None,
        "token": lease.token if lease else None,
        "viewer": session.viewer_id,
        "snapshot": bytes(session.snapshot) if session.process_state == ProcessState.CLOSED else b"",
        "expired": session.expired_at is not None,
        # Who asked for it to end (an operator's Complete, Kill...), once it has.
        "closed_by": actions.closed_by(execution.pk) if session.process_state == ProcessState.CLOSED else {},
    }


def _still_signed_in(session) -> bool:
    """Whether the browser's login session still exists (logging out deletes it)."""
    return session is None or not session.session_key or session.exists(session.session_key)


def _restart(session_id, user, reason: str) -> None:
    session = TerminalSession.objects.select_related("machine").get(pk=session_id)
    if session.process_state == ProcessState.CLOSED:
        actions.start_next_generation(session, actions.Actor.for_user(user), reason)


class TerminalConsumer(AsyncWebsocketConsumer):
    TASKS = ("waiting", "replay_check", "owner_check", "ack_timer")

    async def __call__(self, scope, receive, send) -> None:
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
        self.worker_channel: str | None = None
        self.execution_pk: int | None = None
        self.generation: int | None = None
        self.expected = 0  # next output offset this viewer should receive
        # The channel layer delivers at least once (channels-redis restores a message whose receive was
        # cut short, e.g. by a Redis restart): an attach is numbered so a repeated ``attached`` cannot
        # rewind the stream, and input is numbered so the worker never writes a key twice.
        self.attach_id = 0
        self.refused_since: float | None = None  # when the worker first refused this attach, if it did
        self.input_seq = 0
        self.epoch: int | None = None  # the owner's stream (lease token) the offsets belong to
        self.attached = False
        self.grid: tuple[int, int] | None = None
        self.strikes: list[float] = []
        self.waiting: asyncio.Task | None = None
        self.replay_check: asyncio.Task | None = None
        self.owner_check: asyncio.Task | None = None
        self.ack_pending = self.ack_forwarded = 0  # the browser's latest ack, and the last one sent on
        self.ack_timer: asyncio.Task | None = None
        await keep_receiving(self.channel_layer)
        await self.accept()
        # Logging out anywhere closes this socket (terminals.signals); the owner check catches a lost message.
        self.user_group = f"tether.user.{user.pk}"
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self.send_json({"type": "hello", "session": str(self.session.id), "protocol": 1})

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
        running = [task for name in self.TASKS if (task := getattr(self, name, None)) is not None]
        for name in self.TASKS:
            setattr(self, name, None)
        current = asyncio.current_task()
        for task in running:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(task for task in running if task is not current), return_exceptions=True)
        if getattr(self, "attached", False):
            self.attached = False
            await self._to_worker("session.detach")
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
        if not self.attached:
            raise ProtocolError("not attached yet: input was dropped (send an attach message first)")
        self.input_seq += 1
        await self._to_worker("session.input", data=data, seq=self.input_seq)

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
        await self.send_json({"type": "error", "message": text})
        if len(self.strikes) > settings.TETHER_STRIKE_LIMIT:
            await self.send_json({"type": "closed", "reason": "policy_violation", "text": "too many bad frames"})
            await self.close(CloseCode.POLICY_VIOLATION)

    @staticmethod
    def _grid(message: dict) -> tuple[int, int] | None:
        cols, rows = message.get("cols"), message.get("rows")
        if cols is None and rows is None:
            return None
        if not (isinstance(cols, int) and isinstance(rows, int) and not isinstance(cols, bool)):
            raise ProtocolError("cols and rows must be integers")
        if not (1 <= cols <= MAX_COLS and 1 <= rows <= MAX_ROWS):
            raise ProtocolError(f"grid {cols}x{rows} is out of range (1-{MAX_COLS} x 1-{MAX_ROWS})")
        return cols, rows

    async def client_attach(self, message: dict) -> None:
        if self.foreign and message["type"] != "takeover":
            owner = await db(lambda: self.session.user.get_username())()
            raise ProtocolError(f"this is {owner}'s shell: send takeover to write into it ({owner} is told)")
        if self.foreign and not self.taken_over:
            await db(actions.note_takeover)(self.session, self.user)
            self.taken_over = True
        since = _integer(message.get("since", 0), "since")
        generation, epoch = message.get("generation"), message.get("epoch")
        if generation is not None:
            generation = _integer(generation, "generation")
        if epoch is not None:
            epoch = _integer(epoch, "epoch")
        self.grid = self._grid(message)
        self.expected, self.generation, self.epoch = since, generation, epoch
        self.attached = False  # until the worker confirms; output meanwhile is replayed by the attach
        await self._attach()

    client_takeover = client_attach

    async def client_resize(self, message: dict) -> None:
        grid = self._grid(message)
        if grid is None:
            raise ProtocolError("resize needs cols and rows")
        self.grid = grid
        if self.attached:
            await self._to_worker("session.resize", cols=grid[0], rows=grid[1])

    async def client_reset(self, message: dict) -> None:
        if not self.attached:
            raise ProtocolError("not attached: nothing to reset")
        await self._to_worker("session.reset")

    async def client_ack(self, message: dict) -> None:
        """Acks are coalesced: one goes on at once when it frees a good part of the flow window, else a
        short moment later. A keystroke's echo then costs one message each way, not two."""
        offset = _integer(message.get("offset"), "ack offset")
        if not self.attached:
            return
        self.ack_pending = max(self.ack_pending, offset)
        if self.ack_pending - self.ack_forwarded >= ACK_BATCH_BYTES:
            await self._forward_ack()
        elif self.ack_timer is None:
            self.ack_timer = asyncio.create_task(self._forward_ack_soon())

    async def _forward_ack_soon(self) -> None:
        await asyncio.sleep(ACK_DELAY_SECONDS)
        self.ack_timer = None
        await self._forward_ack()

    async def _forward_ack(self) -> None:
        if self.attached and self.ack_pending > self.ack_forwarded:
            self.ack_forwarded = self.ack_pending
            await self._to_worker("session.ack", offset=self.ack_forwarded)

    async def client_keepalive(self, message: dict) -> None:
        if self.attached:
            await self._to_worker("session.keepalive")

    async def client_ping(self, message: dict) -> None:
        await self.send_json({"type": "pong"})

    # --- attaching ---------------------------------------------------------------------------

    async def _attach(self) -> None:
        """Find the worker holding the session (waiting while it starts) and ask it to attach this viewer."""
        deadline = time.monotonic() + ATTACH_WAIT_SECONDS
        told_starting = False
        while time.monotonic() < deadline:
            target = await db(_attach_target)(self.session.id)
            if target["process_state"] == ProcessState.CLOSED:
                if not await self._closed_at_attach(target):
                    return
                continue
            if target["channel"]:
                self.worker_channel, self.execution_pk = target["channel"], target["execution"]
                if target["generation"] != self.generation:
                    self.expected = 0
                self.attach_id += 1
                await self.channel_layer.send(
                    self.worker_channel,
                    {
                        "type": "session.attach",
                        "execution": self.execution_pk,
                        "viewer": self.viewer_id,
                        "attach": self.attach_id,
                        "reply": self.channel_name,
                        "since": self.expected,
                        "generation": target["generation"],
                        "epoch": self.epoch,
                        "cols": self.grid[0] if self.grid else None,
                        "rows": self.grid[1] if self.grid else None,
                        "by": self.username,  # told to a window this one supersedes
                    },
                )
                return
            if not told_starting:
                await self.send_json({"type": "status", "process_state": "starting", "text": "Starting your session…"})
                told_starting = True
            await asyncio.sleep(0.1)
        text = "No worker is serving this session right now"
        await self.send_json({"type": "status", "code": "no_worker", "text": text})
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
        again = target["close_reason"] in AUTO_RESET_REASONS or target["state"] == State.RESOLVED
        if settings.TETHER_AUTO_RESET and again:
            await db(_restart)(self.session.id, self.user, f"auto-reset after {target['close_reason']}")
            await self.channel_layer.send(WAKE_CHANNEL, {"type": "wake"})
            await self.send_json({"type": "reset", "text": "Started a fresh session"})
            self.generation = None
            return True
        if target["expired"]:
            text = f"The final screen is no longer kept (closed sessions keep it {settings.TETHER_RETENTION_HOURS} h)"
            await self.send_json({"type": "status", "text": text})
        else:
            await self.send(bytes_data=target["snapshot"])
        await self.close(CLOSE_CODES.get(target["close_reason"], CloseCode.CLOSED))
        return False

    async def _to_worker(self, kind: str, **fields) -> None:
        if self.worker_channel is None:
            return
        await self.channel_layer.send(
            self.worker_channel,
            {
                "type": kind,
                "execution": self.execution_pk,
                "viewer": self.viewer_id,
                "reply": self.channel_name,
                **fields,
            },
        )

    # --- worker -> browser -------------------------------------------------------------------

    async def terminal_attached(self, event: dict) -> None:
        if self.attached or event.get("attach") != self.attach_id:
            return  # a repeated delivery, or the answer to an attach this viewer has since replaced
        self.attached = True
        self.refused_since = None
        self.expected = event["offset"]
        self.generation = event["generation"]
        self.epoch = event.get("epoch")
        self.ack_pending = self.ack_forwarded = event["offset"]  # the worker's window starts here
        await self.send_json(
            {
                "type": "attached",
                "offset": event["offset"],
                "end": event["end"],
                "lost": event["lost"],
                "generation": event["generation"],
                "epoch": self.epoch,
                "fresh": event.get("fresh", False),
                # Bytes lost past the buffer, tmux: the screen as it is now (base64), drawn before the stream.
                "screen": base64.b64encode(event["screen"]).decode() if event.get("screen") else None,
                "process_state": event["process_state"],
            }
        )
        if self.replay_check:
            self.replay_check.cancel()
        self.replay_check = asyncio.create_task(self._check_replay(event["end"]))
        if self.owner_check is None:
            self.owner_check = asyncio.create_task(self._check_owner())

    def _current(self, event: dict) -> bool:
        """Whether a worker message belongs to the stream this viewer is attached to (not a dead owner's)."""
        return event.get("epoch", self.epoch) == self.epoch

    async def _check_owner(self) -> None:
        """Every few seconds, compare what this viewer is attached to with the database: a message that
        never arrived (an exit, a supersede) or an owner that died and was replaced is noticed here."""
        while True:
            await asyncio.sleep(settings.TETHER_VIEWER_CHECK_SECONDS)
            if not self.attached:
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
            if not self.attached:
                continue
            if target["viewer"] and target["viewer"] != self.viewer_id:
                log.info("session %s: another window took it over; this one missed the message", self.session.id)
                await self.terminal_superseded({})
                return
            moved = target["execution"] != self.execution_pk or target["process_state"] == ProcessState.CLOSED
            if moved or (target["channel"], target["token"]) != (self.worker_channel, self.epoch):
                log.info("session %s: its owner changed under this viewer; attaching again", self.session.id)
                self.attached = False
                await self._attach()

    async def _check_replay(self, end: int) -> None:
        """Make sure the replay up to ``end`` arrived: channels-redis can drop a message while another
        consumer in this process closes (django/channels_redis#366), and an idle shell sends nothing
        after it that would reveal the gap."""
        for _ in range(3):
            await asyncio.sleep(0.5)
            if not self.attached or self.expected >= end:
                return
            await self._to_worker("session.resend", since=self.expected)

    async def terminal_output(self, event: dict) -> None:
        if not self._current(event):
            return  # from an owner this viewer has left behind
        if not self.attached:
            return  # output for a stream this viewer has not (re)joined yet; the attach replays it
        offset, data = event["offset"], event["data"]
        end = offset + len(data)
        if end <= self.expected:
            return  # a duplicate
        if offset > self.expected:
            # A chunk went missing between worker and here: fetch it again by offset.
            await self._to_worker("session.resend", since=self.expected)
            return
        await self.send(bytes_data=data[self.expected - offset :])
        self.expected = end

    async def terminal_gap(self, event: dict) -> None:
        if not self._current(event):
            return  # from an owner this viewer has left behind
        if not self.attached or event["offset"] <= self.expected:
            return  # a repeated delivery: the stream never moves backwards
        self.expected = event["offset"]
        await self.send_json({"type": "gap", "offset": event["offset"], "lost": event["lost"]})

    async def terminal_error(self, event: dict) -> None:
        if event.get("code") == "attach_refused" and not self.attached:
            # The lease moved (or the process is starting or closing) between our lookup and the worker:
            # look again, quietly, as the protocol's own retry; the page hears only if it never settles.
            now = time.monotonic()
            self.refused_since = self.refused_since or now
            if now - self.refused_since < ATTACH_WAIT_SECONDS:
                await asyncio.sleep(0.2)
                await self._attach()
                return
        await self.send_json({"type": "error", "code": event.get("code"), "message": event["message"]})

    async def terminal_warning(self, event: dict) -> None:
        if not self._current(event):
            return  # from an owner this viewer has left behind
        await self.send_json({"type": "warning", "reason": event["reason"], "seconds_left": event["seconds_left"]})

    async def terminal_superseded(self, event: dict) -> None:
        if not self._current(event):
            return  # from an owner this viewer has left behind
        self.attached = False
        by = event.get("by")
        # Someone else writing into this user's shell is said so, by name; another window of theirs is not.
        text = f"Taken over by {by}" if by and by != self.username else "Superseded by another window"
        await self.send_json({"type": "superseded", "text": text, **({"by": by} if by != self.username else {})})
        # The close frame carries the reason too (terminals/daphne_close.py: daphne 4 would drop it).
        await self.close(CloseCode.SUPERSEDED, reason=text)

    async def terminal_exit(self, event: dict) -> None:
        if not self._current(event):
            return  # from an owner this viewer has left behind
        await self.send_json({"type": "exit", **{k: v for k, v in event.items() if k != "type"}})
        if event["reason"] != "reset":
            self.attached = False
            await self.close(CLOSE_CODES.get(event["reason"], CloseCode.CLOSED))

    async def terminal_generation(self, event: dict) -> None:
        if event.get("ended") != self.generation or not self._current(event):
            return  # a repeated delivery: this viewer already moved on to the next generation
        self.attached = False
        self.generation = None
        self.expected = 0
        await self.send_json({"type": "reset", "text": "Started a fresh session"})
        await self._attach()

    async def terminal_closed(self, event: dict) -> None:
        if not self._current(event):
            return  # from an owner this viewer has left behind
        self.attached = False
        await self.send_json({"type": "closed", "reason": event["reason"], "text": event.get("text", "")})
        await self.close(CLOSE_CODES.get(event["reason"], CloseCode.CLOSED))

    async def user_logged_out(self, event: dict) -> None:
        self.attached = False
        await self.send_json({"type": "closed", "reason": "logged_out", "text": "Signed out"})
        await self.close(CloseCode.FORBIDDEN)

    async def send_json(self, data: dict) -> None:
        await self.send(text_data=json.dumps(data))
