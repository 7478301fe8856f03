"""What a viewer attaching (or observing) is sent first: the kept output from where it asks, or, when bytes
were lost or the stream restarted under a new owner, the screen (at the buffer's start, kept by the worker's
emulator; or as it is now, where the backend knows it: tmux), then the stream from there with no gap and no
duplicate."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from terminals.models import ProcessState
from terminals.owner.live import LiveProcess
from terminals.protocol import Attach, Attached, Observe, Role
from transport.layers import MessageTooLarge

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Replay:
    first: int  # the offset the bytes start at
    data: bytes
    lost: int  # bytes before ``first`` no longer kept (or replaced by ``screen``)
    screen: bytes | None  # the screen as it is now, when that beats a torn tail
    fresh: bool  # the same shell's stream restarted under this owner: the page redraws
    grids: tuple[tuple[int, int, int], ...] = ()  # the grids the bytes were drawn for (drawn_for)

    def attached(self, live: LiveProcess, message: Attach | Observe, role: Role = Role.WRITER) -> Attached:
        """The answer to the attach, from this replay."""
        return Attached(
            attach=message.attach,
            offset=self.first,
            end=self.first + len(self.data),
            lost=self.lost,
            generation=live.generation,
            epoch=live.token,
            execution=live.execution_pk,
            # The viewer's screen is of this shell, but the stream restarted (adopted): redraw it.
            screen=self.screen,
            fresh=self.fresh,
            process_state=ProcessState.LIVE,
            ends_with_worker="" if live.process.survives_owner else live.process.handle.ends_with_worker(),
            tracked=live.marks_seen,
            role=role,
            cols=live.grid[0],
            rows=live.grid[1],
            grids=self.grids,
            observers=tuple(observer.said() for observer in live.observers.values()),
        )


async def replay_for(live: LiveProcess, message: Attach | Observe, message_bytes: int) -> Replay:
    """What a viewer attaching from ``message.since`` is sent first. Called under the send lock; ``message_bytes``
    is the largest channel-layer message (a screen must fit in one with room to spare)."""
    # Offsets count within one owner's stream (its epoch: the lease token). After a tmux adoption the
    # stream restarts with the screen as it is, so a cursor from the old owner means nothing here; a
    # holder's offsets are the same for every owner, so the viewer's cursor still holds.
    same_epoch = (message.epoch or 1) == live.token or live.process.offsets_survive_owner
    same_stream = message.generation == live.generation and same_epoch
    asked = max(int(message.since or 0), 0)
    since = asked if same_stream else 0
    first, data, lost = live.buffer.since(since)
    fresh = message.generation == live.generation and not same_stream and asked > 0
    screen = None
    # The screen as adopted was drawn for the grid the shell had then: a viewer that would replay it
    # gets the screen as it is now, after its own resize (on_attach), drawn for its grid.
    redraw = bool(live.adopted_screen) and live.buffer.start == 0 and first < live.adopted_screen
    if lost and live.screen is not None:
        # The shell's screen at the buffer's start (the worker's emulator kept it), then every byte kept: the
        # screen as it is, with no gap and no duplicate. Not given where it is not exact (the tail is).
        kept = await live.screen.screen()
        if kept is not None and first <= kept.offset <= live.buffer.end and len(kept.data) <= message_bytes - 65536:
            # (An adopter's buffer may begin before the screen it was left: the bytes before it are not sent.)
            start, rest, _ = live.buffer.since(kept.offset)
            grids = drawn_for(live, start, start + len(rest), (kept.cols, kept.rows))
            return Replay(start, rest, start - since, kept.data, fresh, grids)
        if kept is None:
            log.info("execution %s: no screen (%s); replaying the tail", live.execution_pk, live.screen.inexact)
    if (lost or redraw) and live.process.can_snapshot:
        # tmux knows the screen as it is now: a labelled fresh screen beats a torn tail.
        try:
            screen = (await live.process.snapshot()).render()
            if len(screen) > message_bytes - 64 * 1024:  # room for the rest
                raise MessageTooLarge(f"a screen of {len(screen)} bytes")
        except Exception as error:  # fall back to the retained tail
            log.info("execution %s: no snapshot (%r); replaying the tail", live.execution_pk, error)
            screen = None
        else:
            lost = live.buffer.end - since if lost else 0
            first, data = live.buffer.end, b""
    grids = drawn_for(live, first, first + len(data)) if screen is None else ()  # (tmux's: drawn for the grid now)
    return Replay(first, data, lost, screen, fresh, grids)


def drawn_for(
    live: LiveProcess, first: int, end: int, screen: tuple[int, int] | None = None
) -> tuple[tuple[int, int, int], ...]:
    """The grids the output from ``first`` to ``end`` (and a screen at ``first``, drawn for ``screen``'s grid) was
    drawn for: (offset, cols, rows), the grid at ``first`` then each change up to ``end`` (one at ``first`` itself
    after the screen: the emulator takes a change at the offset its screen is at only with the next byte). A page
    draws them at those grids, then takes the grid the shell has now. Empty when all were the grid it has now, or
    the changes kept do not reach back to ``first`` (the page draws them at its own, as before). An adopted shell's
    first grid is the one it was started with, not known to be its grid since: only changes seen here count."""
    history = live.grids[1:] if live.adopted else live.grids
    if screen is not None:
        drawn = [(first, *screen), *(grid for grid in history if first <= grid[0] <= end)]
    else:
        before = [grid for grid in history if grid[0] <= first]
        if not before:
            return ()
        drawn = [(first, *before[-1][1:]), *(grid for grid in history if first < grid[0] <= end)]
    if all((cols, rows) == live.grid for _, cols, rows in drawn):
        return ()
    return tuple(drawn)
