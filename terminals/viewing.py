"""How the owner worker serves viewers: attach, input, resize, acks, resends, detach and reset.

Messages arrive on the worker's own channel from the consumers; answers and
output go to the viewer's channel. Only the current viewer may type, resize or
reset; a new attach supersedes the old viewer.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async as db
from django.conf import settings

from terminals import actions
from terminals.layers import MessageTooLarge
from terminals.live import OUTPUT_MESSAGE_BYTES, LiveProcess, Viewer
from terminals.models import CloseReason, ProcessState
from terminals.protocol import MAX_COLS, MAX_ROWS

log = logging.getLogger(__name__)


class ViewerHandlers:
    """Mixed into OwnerWorker, which provides ``layer``, ``channel``, ``worker``, ``live``, ``_end`` and ``_let_go``."""

    # --- output to viewers -------------------------------------------------------------------

    async def _send(self, channel: str, message: dict) -> bool:
        try:
            await self.layer.send(channel, message)
        except Exception as error:  # a full or vanished channel: the viewer resyncs by offset
            log.info("could not reach viewer %s: %r", channel, error)
            return False
        return True

    async def _send_output(self, live: LiveProcess, offset: int, data: bytes) -> None:
        if live.viewer is None:
            return
        for start in range(0, len(data), OUTPUT_MESSAGE_BYTES):
            piece = data[start : start + OUTPUT_MESSAGE_BYTES]
            await self._send(
                live.viewer.channel,
                {"type": "terminal.output", "offset": offset + start, "data": piece, "epoch": live.token},
            )

    # --- viewer messages ---------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        backoff = 0.1
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis restarting: keep trying, the database holds every fact
                log.warning("channel layer receive failed (%r); retrying in %.1fs", error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            if time.monotonic() > self.leases_fresh_until:
                # Woken after a long stall (SIGSTOP, a frozen VM): our leases may have passed to another
                # worker. Check before acting, so two owners never act on one session.
                try:
                    await self.heartbeat_once()
                except Exception as error:  # the database is away: act on nothing we cannot vouch for
                    log.warning("cannot confirm leases (%r); dropping a %s", error, message.get("type"))
                    continue
            handler = getattr(self, "on_" + message.get("type", "").removeprefix("session."), None)
            if handler is None:
                log.warning("unknown message type %r", message.get("type"))
                continue
            try:
                await handler(message)
            except Exception:
                log.exception("handling %s failed", message.get("type"))

    def _held(self, message: dict) -> LiveProcess | None:
        return self.live.get(message.get("execution"))

    async def _refuse(self, message: dict, code: str, text: str) -> None:
        await self._send(message["reply"], {"type": "terminal.error", "code": code, "message": text})

    async def on_attach(self, message: dict) -> None:
        live = self._held(message)
        if live is None or live.closing:
            await self._refuse(message, "attach_refused", "this worker does not hold that session")
            return
        old = live.viewer
        attach_id = message.get("attach")
        if old and attach_id is not None and (old.viewer_id, old.attach_id) == (message["viewer"], attach_id):
            return  # the same attach delivered twice: it was answered already
        if live.session_id:
            # Recorded first: a superseded window that misses the message below finds out from the
            # database on its next owner check, and the new one never sees itself as superseded.
            try:
                held = await db(actions.note_viewer)(live.session_id, self.worker, live.token, message["viewer"])
            except Exception as error:  # the database is away: the message below still tells the old one
                log.info("could not record the new viewer: %r", error)
            else:
                if not held:  # our lease moved on: let go now; the viewer looks for the new owner
                    await self._refuse(message, "attach_refused", "this worker no longer holds that session")
                    await self._let_go(live, "lease lost")
                    return
        if old and old.viewer_id != message["viewer"]:
            await self._send(old.channel, {"type": "terminal.superseded", "epoch": live.token, "by": message.get("by")})
        cols, rows = message.get("cols"), message.get("rows")
        if isinstance(cols, int) and isinstance(rows, int) and 1 <= cols <= MAX_COLS and 1 <= rows <= MAX_ROWS:
            await live.process.resize(cols, rows)
        # Offsets count within one owner's stream (its epoch: the lease token). After an adoption the
        # stream restarts with the screen as it is, so a cursor from the old owner means nothing here.
        same_stream = message.get("generation") == live.generation and (message.get("epoch") or 1) == live.token
        since = message.get("since", 0) if same_stream else 0
        async with live.send_lock:
            first, data, lost = live.buffer.since(max(int(since), 0))
            screen = None
            # The screen as adopted was drawn for the grid the shell had then: a viewer that would replay it
            # gets the screen as it is now, after the resize above, drawn for its own grid.
            redraw = bool(live.adopted_screen) and live.buffer.start == 0 and first < live.adopted_screen
            if (lost or redraw) and hasattr(live.process, "snapshot"):
                # tmux knows the screen as it is now: a labelled fresh screen beats a torn tail.
                try:
                    screen = (await live.process.snapshot()).render()
                    if len(screen) > settings.TETHER_LAYER_MESSAGE_BYTES - 64 * 1024:  # room for the rest
                        raise MessageTooLarge(f"a screen of {len(screen)} bytes")
                except Exception as error:  # fall back to the retained tail
                    log.info("execution %s: no snapshot (%r); replaying the tail", live.execution_pk, error)
                else:
                    lost = live.buffer.end - max(int(since), 0) if lost else 0
                    first, data = live.buffer.end, b""
            live.viewer = Viewer(
                channel=message["reply"],
                viewer_id=message["viewer"],
                attach_id=attach_id,
                input_seq=old.input_seq if old and old.viewer_id == message["viewer"] else 0,
            )
            live.acked = first
            live.touch()
            await self._send(
                message["reply"],
                {
                    "type": "terminal.attached",
                    "attach": attach_id,
                    "offset": first,
                    "end": first + len(data),
                    "lost": lost,
                    "generation": live.generation,
                    "epoch": live.token,
                    # The viewer's screen is of this shell, but the stream restarted (adopted): redraw it.
                    "screen": screen,
                    "fresh": message.get("generation") == live.generation
                    and not same_stream
                    and since == 0
                    and message.get("since", 0) > 0,
                    "execution": live.execution_pk,
                    "process_state": ProcessState.LIVE,
                },
            )
            await self._send_output(live, first, data)
        live.update_flow()

    async def on_input(self, message: dict) -> None:
        live = self._held(message)
        if live is None or live.closing:
            await self._refuse(message, "not_held", "the session is not running")
        elif live.viewer is None or live.viewer.viewer_id != message["viewer"]:
            await self._refuse(message, "superseded", "another window owns this session's input")
        else:
            seq = message.get("seq")
            if isinstance(seq, int):
                if seq <= live.viewer.input_seq:
                    log.info("execution %s: input %s delivered twice; not written again", live.execution_pk, seq)
                    return
                live.viewer.input_seq = seq
            live.touch()
            await live.process.write(message["data"])

    async def on_keepalive(self, message: dict) -> None:
        live = self._held(message)
        if live and live.viewer and live.viewer.viewer_id == message["viewer"]:
            live.touch()

    async def on_resize(self, message: dict) -> None:
        live = self._held(message)
        if live and live.viewer and live.viewer.viewer_id == message["viewer"] and not live.closing:
            await live.process.resize(message["cols"], message["rows"])

    async def on_ack(self, message: dict) -> None:
        live = self._held(message)
        if live:
            live.ack(message["viewer"], int(message["offset"]))

    async def on_resend(self, message: dict) -> None:
        live = self._held(message)
        if live and live.viewer and live.viewer.viewer_id == message["viewer"]:
            async with live.send_lock:
                first, data, lost = live.buffer.since(int(message["since"]))
                if lost:
                    await self._send(
                        live.viewer.channel,
                        {"type": "terminal.gap", "offset": first, "lost": lost, "epoch": live.token},
                    )
                await self._send_output(live, first, data)

    async def on_detach(self, message: dict) -> None:
        live = self._held(message)
        if live and live.viewer and live.viewer.viewer_id == message["viewer"]:
            live.viewer_left()
            if live.session_id and not await db(actions.note_viewer)(live.session_id, self.worker, live.token):
                await self._let_go(live, "lease lost")

    async def on_reset(self, message: dict) -> None:
        live = self._held(message)
        if live is None:
            await self._refuse(message, "not_held", "the session is not running")
        elif live.viewer is None or live.viewer.viewer_id != message["viewer"]:
            await self._refuse(message, "superseded", "another window owns this session")
        else:
            await self._end(live, CloseReason.RESET)
