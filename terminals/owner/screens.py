"""A shell's screen, kept by the worker's emulator (terminals/screen) for a page that comes back after the buffer."""

from __future__ import annotations

import asyncio
import logging

from terminals.backends.base import Process
from terminals.backends.holder import HeldProcess
from terminals.owner.live import LiveProcess
from terminals.screen import LastScreen, Screens

log = logging.getLogger(__name__)


def keep_screen(screens: Screens, live: LiveProcess, process: Process, adopted: bool) -> None:
    """Keep ``live``'s screen (tmux keeps its own) where it can be exact: this worker sees every byte from the
    shell's first, or from the screen the last owner left with the session holder, which then keeps every byte
    after the screen this owner last left with it (its acknowledgements stop there). Otherwise none is kept (a page
    back past the buffer gets the tail, and is told the screen may be incomplete)."""
    origin, restore, exact = live.buffer.start, None, not adopted
    holder = process if isinstance(process, HeldProcess) and process.keeps_screens else None
    if adopted and holder is not None:
        if holder.kept_screen is not None and holder.kept_screen[0] >= origin:
            (origin, restore), exact = holder.kept_screen, True
        elif holder.kept_screen is None and origin == 0:
            exact = True  # no screen was ever left, so nothing was let go: every byte is still there
    if screens.unavailable or screens.off or not exact:
        return  # none kept (off, or not exact from the start): the buffer lets go of its bytes as before
    live.screen = screens.shell(*live.grid, origin=origin, restore=restore)
    live.buffer.on_evict = live.screen.feed
    if holder is not None:
        holder.screen_kept = live.screen.kept = origin
        live.screen.keep, live.screen.keep_every = holder.keep_screen, holder.screen_every

        def release() -> None:
            holder.screen_kept = None

        live.screen.release = release


LAST_SCREEN_SECONDS = 2.0  # the most an exit's record waits for its last screen (none is kept past it)
LAST_SCREEN_CHARS = 64 * 1024  # the most of it kept (its first rows: a 500-column, 200-row grid is more)


async def last_screen(screens: Screens, live: LiveProcess) -> LastScreen | None:
    """A shell's last screen as its page showed it, as text (rendered by the page's emulator, for every backend),
    once it has ended: exact where its screen was kept, or where its buffer still holds every byte the screen was
    drawn from, for one grid; else drawn from the bytes kept (and said so). None without an emulator, or when it
    takes longer than LAST_SCREEN_SECONDS: the exit is recorded without it."""
    try:
        return await asyncio.wait_for(_last_screen(screens, live), LAST_SCREEN_SECONDS)
    except Exception as error:  # (a timeout among them) the exit's record matters more than its picture
        log.info("execution %s: no last screen (%r)", live.execution_pk, error)
        return None


async def _last_screen(screens: Screens, live: LiveProcess) -> LastScreen | None:
    first, data, _ = live.buffer.since(live.buffer.start)
    if live.screen is not None and (text := await live.screen.text(first, data)) is not None:
        return LastScreen(text[:LAST_SCREEN_CHARS], exact=True)
    # Drawn as the page drew it: each grid from the offset it began at.
    before = [grid for grid in live.grids if grid[0] <= first]
    _, cols, rows = before[-1] if before else live.grids[0]
    resizes = [(offset - first, *grid) for offset, *grid in live.grids if offset > first]
    text = await screens.render(cols, rows, data, resizes)
    if text is None:
        return None
    whole = live.whole_from is not None and first == live.whole_from and bool(before)
    return LastScreen(text[:LAST_SCREEN_CHARS], exact=whole)
