"""The screens of a worker's shells, kept by the page's own emulator so that a page that comes back after what the
worker keeps (a reload, a new tab, an outage past the grace) is shown the screen as it is, not a torn tail.

One node process per worker (``emulator.cjs``, @xterm/headless) keeps a terminal per shell, fed the bytes the
shell's output buffer lets go of: its state is always the screen at the buffer's start. A page that asks from
before that start gets that screen, rebuilt as bytes (``serialize.cjs``: both buffers, the cursor, the modes, the
titles), then every byte the buffer keeps, with no gap and no duplicate. A shell that never outgrows the buffer
costs nothing here: its terminal is made at its first byte let go.

The screen is only given where it is exact: a shell whose every byte went through (from its start, under this
worker). One adopted from another worker, whose earlier bytes this one never saw, gets the tail as before. The
process is started on first use and again after it dies; the shells it kept are then no longer exact.

When a shell ends, its last screen is rendered as text (``Screens.render``, ``ShellScreen.text``) for the admin
and the API, whatever the backend, and kept with the closed session for its retention.
"""

from terminals.screen.process import Screens
from terminals.screen.shell import LastScreen, Screen, ShellScreen

__all__ = ["LastScreen", "Screen", "Screens", "ShellScreen"]
