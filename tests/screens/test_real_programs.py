"""Real full-screen programs (issue 44's tests): less and vi on every backend, paged on past what the worker keeps; a
page that comes back then (a reload) shows, cell by cell, what a page that saw every byte shows (@xterm/headless),
and again once the program has quit and the shell's own screen is back."""

from __future__ import annotations

import asyncio
import base64
import subprocess

import pytest
from asgiref.sync import sync_to_async

from tests.bridge.harness import Stack, Viewer, open_viewer
from tests.screens.reference import differences, xterm_screen
from tests.screens.test_page_screens import SCREENS, read_to

pytestmark = pytest.mark.django_db(transaction=True)

BUFFER = 128 * 1024
ENV = {"TETHER_RECONNECT_GRACE_SECONDS": "0", "TETHER_BUFFER_BYTES": str(BUFFER), **SCREENS}
PAGES = 130  # a page of this file is about 1.8 KB drawn: about 230 KB in all, past the buffer

# Each: how it is started on the file, the key that goes a screen on, how it is left.
PROGRAMS = {"less": ("less {file}\r", b" ", b"q"), "vi": ("vi {file}\r", b"\x06", b":q!\r")}


def the_file(request, tmp_path, backend: str) -> str:
    """A file of 6,000 numbered lines the shell of ``backend`` can open (copied into the container for docker)."""
    path = tmp_path / "long.txt"
    path.write_text("".join(f"line {n} of a long file, words enough to fill most of a row {n * 7919 % 10007}\n"
                            for n in range(1, 6001)))  # fmt: skip
    if backend != "docker":
        return str(path)
    container = request.getfixturevalue("container")
    subprocess.run(["docker", "cp", str(path), f"{container}:/tmp/long.txt"], check=True, capture_output=True)
    return "/tmp/long.txt"


async def quiet(viewer: Viewer, seconds: float = 1.0, timeout: float = 60) -> None:
    """Read until nothing more has come for ``seconds``."""
    async with asyncio.timeout(timeout):
        while True:
            before = viewer.offset
            await viewer.read_for(seconds)
            if viewer.offset == before:
                return


async def first_page(stack: Stack, terminal, operator, backend: str) -> tuple[Viewer, object, str]:
    """The stack started, a shell opened and its prompt drawn: the page that sees every byte (the truth)."""
    await sync_to_async(stack.start)(backend)
    first, session, cookie = await open_viewer(stack, terminal, operator, backend)
    await quiet(first)
    return first, session, cookie


async def page_back(stack: Stack, session, cookie: str, first: Viewer) -> tuple[Viewer, bytes, dict, dict]:
    """A reload once ``first`` has gone: the screen it is drawn, and (as @xterm/headless shows them) its screen and
    the truth's, once it has every byte ``first`` had."""
    again = await Viewer.open(stack.ports[0], session.id, cookie)
    attached = await again.attach(since=0)
    assert attached["lost"] > 0 and attached["screen"], {k: v for k, v in attached.items() if k != "screen"}
    redraw = base64.b64decode(attached["screen"])
    await read_to(again, first.offset)
    return again, redraw, xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output))


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("backend", ["local", "tmux", "docker"])
async def test_a_real_program_paged_past_the_buffer_comes_back_as_it_is_and_so_does_the_shell_after_it(
    request, terminal, operator, tmp_path, backend, program
):
    start, forward, leave = PROGRAMS[program]
    path = the_file(request, tmp_path, backend)
    stack = Stack(extra_env=ENV)
    try:
        first, session, cookie = await first_page(stack, terminal, operator, backend)
        await first.type(start.format(file=path))
        await quiet(first)
        for _ in range(PAGES):  # one key at a time: a program that sees keys waiting draws only the last page
            before = first.offset
            await first.type(forward)
            async with asyncio.timeout(10):
                while first.offset == before:  # this page drawn (at least begun) before the next key
                    await first.read_for(0.02)
        await quiet(first)
        await first.close()
        assert first.offset > BUFFER + 64 * 1024, first.offset

        again, redraw, page, truth = await page_back(stack, session, cookie, first)
        assert any("line " in row["text"] for row in truth[truth["active"]]), truth[truth["active"]]
        assert differences(page, truth) == []

        mark = len(again.output)
        await again.type(leave)
        await quiet(again)
        await again.type("echo back-$((6*7))\r")
        await again.read_until(b"back-42")
        await quiet(again, 0.5)
        after = bytes(again.output[mark:])
        page, truth = xterm_screen(redraw + bytes(again.output)), xterm_screen(bytes(first.output) + after)
        assert truth["active"] == "normal" and any(row["text"].endswith("back-42") for row in truth["normal"])
        assert differences(page, truth) == []
    finally:
        await sync_to_async(stack.stop)()


@pytest.mark.parametrize("backend", ["local", "tmux", "docker"])  # procps top; the container's busybox top
async def test_top_repainting_only_what_changed_comes_back_whole_after_a_page_back_past_the_buffer(
    terminal, operator, backend
):
    """top redraws only the rows that changed: a page drawn from the kept tail alone keeps rows top drew before it
    (the bug); drawn from the screen at the buffer's start, it equals the page that saw every byte. (busybox top,
    in the container, draws every frame whole: there the tail alone is right too, and only the screen is checked.)"""
    stack = Stack(extra_env=ENV)
    try:
        first, session, cookie = await first_page(stack, terminal, operator, backend)
        await first.type("top -d 0\r" if backend == "docker" else "top -d 0.05\r")  # (busybox: whole seconds)
        async with asyncio.timeout(60):
            while first.offset < BUFFER + 64 * 1024:
                await first.read_for(0.2)
        await first.type("q")
        await quiet(first)
        await first.type("echo back-$((6*7))\r")
        await first.read_until(b"back-42")
        await quiet(first, 0.5)
        await first.close()

        again, _, page, truth = await page_back(stack, session, cookie, first)
        assert any("PID" in row["text"] for row in truth["normal"]), truth["normal"]
        assert differences(page, truth) == []
        if backend != "docker":
            tail = xterm_screen(bytes(again.output))  # the kept output alone, as a page got it before
            assert differences(tail, truth) != []
    finally:
        await sync_to_async(stack.stop)()
