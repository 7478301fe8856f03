"""A shell's screen, kept by the worker's emulator (terminals/screen) for a page that comes back after the buffer."""

from __future__ import annotations

from terminals.backends.base import Process
from terminals.backends.holder import HeldProcess
from terminals.owner.live import LiveProcess
from terminals.screen import LastScreen, Screens


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
        live.screen.keep = holder.keep_screen

        def release() -> None:
            holder.screen_kept = None

        live.screen.release = release


async def last_screen(screens: Screens, live: LiveProcess) -> LastScreen | None:
    """A shell's last screen as its page showed it, as text (rendered by the page's emulator, for every backend),
    once it has ended: exact where its screen was kept, or where its buffer still holds every byte the screen was
    drawn from; else drawn from the bytes kept (and said so). None without an emulator."""
    first, data, _ = live.buffer.since(live.buffer.start)
    if live.screen is not None and (text := await live.screen.text(first, data)) is not None:
        return LastScreen(text, exact=True)
    text = await screens.render(*live.grid, data)
    if text is None:
        return None
    return LastScreen(text, exact=live.whole_from is not None and live.buffer.start == live.whole_from)
