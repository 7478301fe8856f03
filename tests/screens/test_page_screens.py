"""Through the whole stack: a page that comes back after more output than the worker keeps (a reload, a new
tab) is drawn the screen as it is and then the live bytes, and what it shows equals, cell by cell, what a
page that saw every byte shows (the same xterm.js, @xterm/headless), before and after the program leaves
the alternate screen."""

from __future__ import annotations

import asyncio
import base64
import subprocess

import pytest
from asgiref.sync import sync_to_async

from tests.bridge.harness import Stack, Viewer, open_viewer
from tests.screens.reference import differences, xterm_screen

pytestmark = pytest.mark.django_db(transaction=True)

SCREENS = {"TETHER_SCREEN_SCROLLBACK": "200"}  # the worker keeps local and docker shells' screens (the default, said)

# About 250 KB in the alternate screen, through a 128 KiB buffer: the start of it is not kept.
PROGRAM = r"""
printf 'before the program \033[1;31mred\033[0m\r\n'
printf '\033]2;a pager\007\033[?1049h\033[?1h\033=\033[?1002h\033[?1006h'
i=1; while [ $i -le 4000 ]; do printf '\033[%s;1H\033[3%sm page line %s of the file, in colour\033[0m\033[K' \
  $((i % 22 + 2)) $((i % 8)) $i; i=$((i+1)); done
printf '\033[1;1H\033[7m the header, drawn once and long ago \033[0m\033[24;1H:'
i=1; while [ $i -le 2000 ]; do printf '\033[%s;1H\033[3%sm page line %s again, in colour\033[0m\033[K' \
  $((i % 22 + 2)) $((i % 8)) $i; i=$((i+1)); done
printf '\033[24;2H READY'
read answer
printf '\033[?1006l\033[?1002l\033[?1l\033>\033[?1049lafter the pager: %s\r\nDONE' "$answer"
"""


def script_for(request, tmp_path, backend: str, program: str) -> str:
    """``program`` as a file the shell of ``backend`` can run (copied into the container for docker): its path."""
    script = tmp_path / "pager.sh"
    script.write_text(program)
    if backend != "docker":
        return str(script)
    container = request.getfixturevalue("container")
    subprocess.run(["docker", "cp", str(script), f"{container}:/tmp/pager.sh"], check=True, capture_output=True)
    return "/tmp/pager.sh"


async def read_to(viewer: Viewer, offset: int, timeout: float = 30) -> None:
    """Take the replay until the viewer has every byte up to ``offset``."""
    async with asyncio.timeout(timeout):
        while viewer.offset < offset:
            await viewer.read_for(0.2)


@pytest.mark.parametrize("backend", ["tmux", "local", "docker"])
async def test_a_page_back_past_the_buffer_shows_the_alternate_screen_and_its_modes_as_they_are(
    request, terminal, operator, tmp_path, backend
):
    """tmux redraws the screen as it is; a local or docker shell's is kept by the worker's emulator, at the start of
    the kept output, which follows it."""
    path = script_for(request, tmp_path, backend, PROGRAM)
    stack = Stack(extra_env={"TETHER_RECONNECT_GRACE_SECONDS": "0", "TETHER_BUFFER_BYTES": "131072", **SCREENS})
    try:
        await sync_to_async(stack.start)(backend)
        first, session, cookie = await open_viewer(stack, terminal, operator, backend)
        assert first.messages[-1]["offset"] == 0  # this page sees every byte: the truth
        await first.type(f"sh {path}\r")
        await first.read_until(b"READY", timeout=60)
        await first.close()

        again = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await again.attach(since=0)  # a fresh page
        assert attached["lost"] > 131072 and attached["screen"]
        redraw = base64.b64decode(attached["screen"])
        await read_to(again, first.offset)
        page, truth = xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output))
        assert truth["active"] == "alternate" and "the header" in truth["alternate"][0]["text"]
        tail = xterm_screen(bytes(first.output[-131072:]))  # what the worker still keeps, drawn alone:
        assert tail["active"] == "normal"  # the wrong buffer, without the header (the bug this redraw mends)
        assert differences(page, truth) == []

        mark = len(again.output)
        await again.type("q\r")
        await again.read_until(b"DONE")
        after = bytes(again.output[mark:])
        page, truth = xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output) + after)
        assert truth["active"] == "normal" and any(row["text"] == "after the pager: q" for row in truth["normal"])
        assert differences(page, truth) == []
    finally:
        await sync_to_async(stack.stop)()


async def test_after_a_kill_9_of_the_worker_the_page_gets_the_pager_and_its_modes_from_the_adopter(
    terminal, operator, tmp_path
):
    script = tmp_path / "pager.sh"
    script.write_text(PROGRAM)
    stack = Stack(extra_env={"TETHER_RECOVERY_SECONDS": "1"})
    try:
        await sync_to_async(stack.start_daphne)()
        owner = await sync_to_async(stack.start_worker)("tmux")
        first, session, cookie = await open_viewer(stack, terminal, operator, "tmux")
        await first.type(f"sh {script}\r")
        await first.read_until(b"READY", timeout=60)
        attached = next(m for m in first.messages if m["type"] == "attached")
        await first.close()
        owner.kill()  # SIGKILL
        await sync_to_async(owner.wait)()
        await sync_to_async(stack.start_worker)("tmux")

        # The page comes back at once, before the dead owner's lease has expired: its attach goes to the dead
        # worker, and must be asked again of the adopter (it waited for ever before).
        again = await Viewer.open(stack.ports[0], session.id, cookie)
        back = await again.attach(since=first.offset, generation=attached["generation"], epoch=attached["epoch"])
        assert back["fresh"] is True and back["epoch"] != attached["epoch"]
        redraw = base64.b64decode(back["screen"])
        page, truth = xterm_screen(redraw), xterm_screen(bytes(first.output))
        assert truth["active"] == "alternate" and differences(page, truth) == []

        await again.type("q\r")
        await again.read_until(b"DONE")
        page, truth = xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output + again.output))
        assert truth["active"] == "normal" and differences(page, truth) == []
    finally:
        await sync_to_async(stack.stop)()


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_after_a_kill_9_of_the_worker_a_held_shells_page_gets_the_same_screen_from_the_adopter(
    request, terminal, operator, tmp_path, backend
):
    """The screen a local or docker shell's worker keeps is left with its session holder every MiB of output (what
    the holder's ring holds past the worker's buffer), and the holder keeps every byte after it: the adopter
    rebuilds it, reads the rest, and a page back past the buffer gets the screen a page that saw every byte has."""
    # About 1.5 MB (a screen is left on the way), then 2 s for the worker's emulator to catch up before READY:
    # a worker killed before it left any screen lets go of nothing, and its adopter replays from the first byte.
    program = PROGRAM.replace("-le 4000", "-le 24000")
    program = program.replace("printf '\\033[24;2H READY'", "sleep 2; printf '\\033[24;2H READY'")
    path = script_for(request, tmp_path, backend, program)
    stack = Stack(extra_env={"TETHER_RECOVERY_SECONDS": "1", "TETHER_BUFFER_BYTES": "131072", **SCREENS})
    try:
        await sync_to_async(stack.start_daphne)()
        owner = await sync_to_async(stack.start_worker)(backend)
        first, session, cookie = await open_viewer(stack, terminal, operator, backend)
        await first.type(f"sh {path}\r")
        await first.read_until(b"READY", timeout=90)
        await first.close()
        owner.kill()  # SIGKILL
        await sync_to_async(owner.wait)()
        await sync_to_async(stack.start_worker)(backend)

        again = await Viewer.open(stack.ports[0], session.id, cookie)
        back = await again.attach(since=0)  # a reload, answered by the adopter
        # The screen it starts from is the one left with the holder, past everything the dead owner let go of.
        assert back["screen"] and back["lost"] > 256 * 1024, {k: v for k, v in back.items() if k != "screen"}
        redraw = base64.b64decode(back["screen"])
        await read_to(again, first.offset)
        page, truth = xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output))
        assert truth["active"] == "alternate" and differences(page, truth) == []

        mark = len(again.output)
        await again.type("q\r")
        await again.read_until(b"DONE")
        after = bytes(again.output[mark:])
        page, truth = xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output) + after)
        assert truth["active"] == "normal" and differences(page, truth) == []
    finally:
        await sync_to_async(stack.stop)()
