"""tmux's redraw after a gap is the screen as it is, modes and all: what a page that missed bytes is drawn
(``Snapshot.render``, then the bytes that follow) equals, cell by cell, what a page that saw every byte shows
(the same xterm.js, @xterm/headless), in the alternate screen and after the program leaves it."""

from __future__ import annotations

import asyncio

import pytest

from terminals.backends.base import Process, SpawnSpec
from terminals.backends.tmux import TmuxBackend
from tests.backends.conftest import make_tags
from tests.screens.reference import differences, xterm_screen

FULL_SCREEN = r"""
printf 'before the program \033[1;31mred bold\033[0m and \033[44;37mblue\033[0m\r\n$ less file\r\n'
printf '\033]2;the program\007\033[?1049h\033[H\033[2J'
printf '\033[7m header row, reversed \033[0m\r\n'
i=1; while [ $i -le 30 ]; do printf 'line %s of the file \033[32mgreen %s\033[0m\r\n' $i $i; i=$((i+1)); done
printf '\033[?1h\033=\033[?1002h\033[?1006h\033[?2004h\033[?1004h\033[3;20r\033[?25l\033[12;7Hcursor here'
printf ' READY'
read answer
printf '\033[r\033[?25h\033[?1006l\033[?1002l\033[?1l\033>\033[?1004;2004l\033[?1049l'
printf 'after the program: %s\r\n' "$answer"
printf 'DONE'
sleep 30
"""


async def read_until(process: Process, needle: bytes, seen: bytearray, timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while needle not in seen:
            chunk = await process.read()
            assert chunk, f"output ended before {needle!r}"
            seen += chunk


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_a_redraw_in_the_alternate_screen_is_the_screen_as_it_is_and_survives_its_exit(tmux_socket, size):
    cols, rows = size
    backend = TmuxBackend(socket=tmux_socket)
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", FULL_SCREEN), cols=cols, rows=rows), make_tags())
    seen = bytearray()
    try:
        await read_until(process, b"READY", seen)
        # A page that lost every byte so far gets the screen as it is, and what follows.
        redraw = (await process.snapshot()).render()
        page, truth = xterm_screen(redraw, cols, rows), xterm_screen(bytes(seen), cols, rows)
        assert truth["active"] == "alternate" and truth["modes"]["mouseTrackingMode"] == "drag"
        assert truth["modes"]["bracketedPasteMode"] and truth["modes"]["sendFocusMode"]
        assert differences(page, truth) == []

        mark = len(seen)
        await process.write(b"yes\r")
        await read_until(process, b"DONE", seen)
        after = bytes(seen[mark:])
        page, truth = xterm_screen(redraw + after, cols, rows), xterm_screen(bytes(seen), cols, rows)
        assert truth["active"] == "normal" and "after the program: yes" in {r["text"] for r in truth["normal"]}
        assert differences(page, truth) == []
    finally:
        await process.terminate(grace=0.2)


# Every other mode a program can set that tmux tells, in two combinations; then text typed in those modes.
MODES = {
    "insert-origin-nowrap": r"printf 'abcdef\r\n\033[4h\033[5;15r\033[?6h\033[?7l\033[?1000h\033[?1005h\033[3;2H'",
    "any-motion-keypad": r"printf '\033[?1003h\033[?1006h\033=\033[?1h\033[2;10r\033[7;4H'",
    # Not told by tmux 3.3a (no format says them): the owner follows them in the pane's output.
    "paste-focus": r"printf '\033[?2004h\033[?1004;1000h\033[5;5H'",
}
AFTER_MODES = r"""
printf ' READY'
read answer
printf 'XY%s' "$answer"; printf '\033[1;1Hwraps? %090d' 0
printf '\033[20;1HDONE'
sleep 30
"""


@pytest.mark.parametrize("modes", sorted(MODES))
async def test_the_modes_a_program_set_are_set_again_by_the_redraw(tmux_socket, modes):
    backend = TmuxBackend(socket=tmux_socket)
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", MODES[modes] + AFTER_MODES)), make_tags())
    seen = bytearray()
    try:
        await read_until(process, b"READY", seen)
        redraw = (await process.snapshot()).render()
        page, truth = xterm_screen(redraw), xterm_screen(bytes(seen))
        assert truth["modes"] != xterm_screen(b"")["modes"]  # the program did set some
        assert differences(page, truth) == []
        mark = len(seen)
        await process.write(b"z\r")
        await read_until(process, b"DONE", seen)
        # Typed in insert mode, within the region, without wrapping: the same cells either way.
        page, truth = xterm_screen(redraw + bytes(seen[mark:])), xterm_screen(bytes(seen))
        assert differences(page, truth) == []
    finally:
        await process.terminate(grace=0.2)


# A program that draws its frame once, then repaints only what changes (as top does): a page that lost the
# frame gets it from the redraw.
PARTIAL = r"""
row() { printf '\033[%s;1H%s  root  %s.0  worker-%s\033[K' $(($1 % 20 + 2)) $1 $(($1 % 7)) $1; }
printf '\033[H\033[2J\033[1mPID  USER  %%CPU  COMMAND\033[0m\r\n'
i=0; while [ $i -lt 300 ]; do row $i; i=$((i+1)); done
printf '\033[23;1H READY'
read answer
i=300; while [ $i -lt 340 ]; do row $i; i=$((i+1)); done
printf '\033[24;1HDONE'
sleep 30
"""


async def test_a_program_that_repaints_only_what_changed_keeps_its_frame_after_a_redraw(tmux_socket):
    backend = TmuxBackend(socket=tmux_socket)
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", PARTIAL)), make_tags())
    seen = bytearray()
    try:
        await read_until(process, b"READY", seen)
        redraw = (await process.snapshot()).render()
        # The tail a page would get without the redraw starts mid-frame: its header row is not there.
        tail = xterm_screen(bytes(seen[len(seen) // 2 :]))
        assert not tail["normal"][0]["text"].startswith("PID")
        mark = len(seen)
        await process.write(b"go\r")
        await read_until(process, b"DONE", seen)
        page, truth = xterm_screen(redraw + bytes(seen[mark:])), xterm_screen(bytes(seen))
        assert truth["normal"][0]["text"] == "PID  USER  %CPU  COMMAND"
        assert differences(page, truth) == []
    finally:
        await process.terminate(grace=0.2)


async def test_an_owner_that_adopts_the_session_sets_bracketed_paste_and_focus_as_the_last_owner_saw_them(tmux_socket):
    """The two modes tmux does not tell are kept with the session by the owner that saw them set: a page drawn by
    the owner that adopts the session after the first one is gone gets them too."""
    backend = TmuxBackend(socket=tmux_socket)
    program = r"printf '\033[?2004h\033[?1004h\033[?1004l\033[?2004l\033[?1004h'" + AFTER_MODES
    process = await backend.spawn(SpawnSpec(argv=("sh", "-c", program)), make_tags())
    seen = bytearray()
    try:
        await read_until(process, b"READY", seen)
        truth = xterm_screen(bytes(seen))
        assert truth["modes"]["sendFocusMode"] and not truth["modes"]["bracketedPasteMode"]
        before = (await process.snapshot()).render()
        assert differences(xterm_screen(before), truth) == []
        await process.detach()  # this owner is gone (its control client with it)
        adopter = await backend.attach(process.handle)
        try:
            page = xterm_screen((await adopter.snapshot()).render())
            assert differences(page, truth) == []
        finally:
            await adopter.detach()
    finally:
        await process.terminate(grace=0.2)
